"""The short-lived process that does the ptrace work: `python -m decodemon.monitor.inject.helper PID < SOURCE`.

It runs in a session of its own, so a monitor killed or interrupted in the middle of an injection does not take the
tracer with it. The helper itself may die at any point (an OOM kill, a container stop): the target's thread runs
on either untouched or in code that needs no tracer (trampoline.py), so it is never left with a patched register
or a breakpoint. It prints one JSON line: what it did and for how long the target's thread was held.

What runs in the target is `Py_AddPendingCall(PyRun_SimpleString, source)`, called on its main thread by the
trampoline the thread was pointed at while stopped. The call only queues the source; the interpreter runs it later,
on its main thread between two bytecodes with the GIL held, the same safe point at which it runs Python signal
handlers (on 3.10 and 3.11 only the main thread handles pending calls; from 3.12 the legacy API queues to the main
thread of the main interpreter). Calling `PyGILState_Ensure` + `PyRun_SimpleString` there instead would run Python
wherever that thread happened to stop (in the allocator, halfway through a dict update) and hold it for the whole
run of the source. `Py_AddPendingCall` takes only the pending-call lock, which a thread holds for a few
instructions while it pushes or pops one entry. A thread stopped while that lock is taken (by itself or any other)
is let go untouched and stopped again a moment later (pending_lock.py): pointed at the trampoline it could wait on
itself for good. If the call has not returned within a bound the helper lets the thread go and says so: the thread
finishes the call on its own. `PyRun_SimpleString(const char *)` has the shape
of a pending-call function `int (*)(void *)`; the source it runs never raises (an error return without an
exception would surface as a SystemError in the target).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import sys
import time

from decodemon.monitor.inject import elf, trampoline
from decodemon.monitor.inject.pending_lock import LockUnknown, PendingLock
from decodemon.monitor.inject.ptrace import PtraceError, Tracee

API = ["Py_AddPendingCall", "PyRun_SimpleString"]
CALL_WAIT_S = 0.5
# Stops that find the thread where it must not be redirected (a restartable sequence, the pending-call lock taken,
# an earlier injection's code) let it go untouched; the next comes after a pause, up to TRIES stops in all.
TRIES, RETRY_PAUSE_S = 100, 0.001


def in_rseq_critical_section(mem: int, rseq_area: int, rip: int) -> bool:
    """Whether `rip` lies in the restartable sequence armed in the thread's struct rseq (its rseq_cs at offset 8).

    Such a sequence must be aborted by the kernel if the thread is preempted in it; resumed at our code instead, it
    would not be, and would commit to per-CPU data of a CPU it has left. Unreadable counts as inside."""
    if not rseq_area:
        return False
    try:
        cs = int.from_bytes(os.pread(mem, 8, rseq_area + 8), "little")
        if not cs:
            return False
        _version, _flags, start_ip, post_commit_offset, _abort_ip = struct.unpack("<IIQQQ", os.pread(mem, 32, cs))
    except (OSError, struct.error):
        return True
    return start_ip <= rip < start_ip + post_commit_offset


def not_now(tracee: Tracee, mem: int, cave: int, lock: PendingLock | None) -> str:
    """Why the stopped thread must be let go untouched this time; "" when it may be redirected."""
    rip = tracee.saved.rip
    if cave <= rip < cave + trampoline.SIZE:
        return "in an earlier injection's code"
    if in_rseq_critical_section(mem, tracee.rseq_area(), rip):
        return "in a restartable sequence"
    if lock is None:
        return ""
    try:
        return "while the pending-call lock was taken" if lock.held() else ""
    except LockUnknown:
        # what is there is not what this version keeps (another patch release's layout, say): injected as before
        # the check rather than never (attach by pid would stop working on that interpreter)
        return ""


def _queue_once(tracee: Tracee, mem: int, cave: int, page: bytes, nbytes: int, add_pending_call: int) -> int:
    """One injection into the stopped thread, which not_now has cleared: Py_AddPendingCall's result."""
    r = tracee.saved
    resume_rip, resume_rax = trampoline.resume_point(r.rip, r.rax, r.orig_rax)
    code = trampoline.build(resume_rip, resume_rax, nbytes)
    try:
        os.pwrite(mem, code, cave)
    except OSError:  # /proc/PID/mem may not write a read-only mapping even for a tracer; ptrace itself may
        tracee.poke(cave, code)
    tracee.redirect(cave + trampoline.ENTRY)  # from here on the thread needs nothing from this process
    deadline = time.monotonic() + CALL_WAIT_S
    mapped = tracee.until_syscall(lambda g: g.rip == cave + trampoline.MAPPED and
                                  trampoline.signed(g.rax) != -trampoline.ENOSYS, deadline)
    addr = trampoline.signed(mapped.rax)
    if addr < 0:
        raise PtraceError(-addr, f"mmap in the target failed: {os.strerror(-addr)}")
    os.pwrite(mem, page, addr + 8)
    os.pwrite(mem, add_pending_call.to_bytes(8, "little"), addr)  # written last: the go-ahead
    done = tracee.until_syscall(lambda g: g.rip == cave + trampoline.REPORTED and
                                g.orig_rax == trampoline.SYS_GETPID, deadline)
    return trampoline.signed(done.rdi)


def queue_source(pid: int, source: bytes) -> dict:
    """Queue `source` as a pending call in `pid`'s interpreter; return what happened (see the module doc)."""
    interp = elf.find_interpreter(pid, API)
    if interp is None:
        return {"ok": False, "why": "symbols", "error": "no CPython API symbols (Py_AddPendingCall) found"}
    cave = elf.code_cave(pid, elf.read_maps(pid), trampoline.SIZE)
    if cave is None:
        return {"ok": False, "why": "cave", "error": "no unused room in the target's executable mappings"}
    page = interp.addresses["PyRun_SimpleString"].to_bytes(8, "little") + source + b"\0"
    nbytes = (8 + len(page) + 4095) & ~4095
    mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        unchecked = ""
        try:
            lock = PendingLock(pid, interp, mem)
        except LockUnknown as exc:  # a version whose layout is not known here: injected as before the check
            lock, unchecked = None, f"the pending-call lock was not checked: {exc}"
        t0 = time.monotonic_ns()
        reasons: dict[str, int] = {}
        for _ in range(TRIES):
            tracee = Tracee(pid, wait_s=CALL_WAIT_S)
            with tracee:
                why = not_now(tracee, mem, cave, lock)
                rc = None if why else _queue_once(tracee, mem, cave, page, nbytes,
                                                  interp.addresses["Py_AddPendingCall"])
            t1 = time.monotonic_ns()
            if rc is not None:
                break
            reasons[why] = reasons.get(why, 0) + 1
            time.sleep(RETRY_PAUSE_S)
        else:
            seen = ", ".join(f"{why} ({n})" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
            return {"ok": False, "why": "busy", "error": f"at each of {TRIES} stops the main thread could not be "
                    f"redirected: {seen}; it was left running"}
    finally:
        os.close(mem)
    return {"ok": rc == 0, "why": "" if rc == 0 else "queue", "error": "" if rc == 0 else "pending-call queue full",
            "stop_us": (t1 - tracee.stopped_ns) / 1e3, "total_us": (t1 - t0) / 1e3, "interpreter": interp.path,
            "held_signals": tracee.held_signals, "let_go": sum(reasons.values()), "lock_unchecked": unchecked}


def main(argv: list[str]) -> int:
    """Entry point: PID on the command line, the source on stdin, one JSON line on stdout."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # finish and detach, whatever happens to the monitor
    source = sys.stdin.buffer.read()
    try:
        result = queue_source(int(argv[0]), source)
    except PtraceError as exc:
        result = {"ok": False, "why": "ptrace", "errno": exc.errno, "error": exc.strerror or str(exc)}
    except TimeoutError as exc:
        result = {"ok": False, "why": "timeout", "error": str(exc)}
    except (OSError, ValueError, IndexError) as exc:
        result = {"ok": False, "why": "os", "errno": getattr(exc, "errno", None), "error": str(exc)}
    try:
        print(json.dumps(result), flush=True)
    except OSError:
        pass  # the monitor is gone; the target is already back on its own
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
