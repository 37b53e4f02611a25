"""The short-lived process that does the ptrace work: `python -m decodemon.monitor.inject.helper PID < SOURCE`.

It runs in a session of its own, so a monitor killed or interrupted in the middle of an injection does not take the
tracer with it: the helper always puts the thread back and detaches. It prints one JSON line: what it did and for
how long the target's thread was stopped.

What runs in the target is `Py_AddPendingCall(PyRun_SimpleString, source)`, called on its main thread while it
is stopped. The call only queues the source; the interpreter runs it later, on its main thread between two
bytecodes with the GIL held, the same safe point at which it runs Python signal handlers (on 3.10 and 3.11 only
the main thread handles pending calls; from 3.12 the legacy API queues to the main thread of the main
interpreter). Calling `PyGILState_Ensure` + `PyRun_SimpleString` on the stopped thread instead would run Python
wherever that thread happened to stop (in the allocator, halfway through a dict update) and keep it stopped for
the whole run of the source. `Py_AddPendingCall` takes only the pending-call lock, which a thread holds for a few
instructions while it pushes or pops one entry; if that lock were ever busy the call is abandoned after a bound
and the thread put back untouched. `PyRun_SimpleString(const char *)` has the shape of a pending-call function
`int (*)(void *)`; the source it runs never raises (an error return without an exception would surface as a
SystemError in the target).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from decodemon.monitor.inject import elf
from decodemon.monitor.inject.ptrace import PtraceError, Tracee

API = ["Py_AddPendingCall", "PyRun_SimpleString"]
SYSCALL_INSN = b"\x0f\x05"
CALL_WAIT_S = 0.5


def queue_source(pid: int, source: bytes) -> dict:
    """Queue `source` as a pending call in `pid`'s interpreter; return what happened (see the module doc)."""
    interp = elf.find_interpreter(pid, API)
    if interp is None:
        return {"ok": False, "why": "symbols", "error": "no CPython API symbols (Py_AddPendingCall) found"}
    gadget = elf.find_bytes(pid, elf.read_maps(pid), SYSCALL_INSN)
    if gadget is None:
        return {"ok": False, "why": "gadget", "error": "no syscall instruction found in the target's code"}
    payload = source + b"\0"
    nbytes = (len(payload) + 4095) & ~4095
    mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        t0 = time.monotonic_ns()
        tracee = Tracee(pid, wait_s=CALL_WAIT_S)
        with tracee:
            addr = tracee.mmap_rw(gadget, nbytes)
            os.pwrite(mem, payload, addr)
            rc = tracee.call(interp.addresses["Py_AddPendingCall"], interp.addresses["PyRun_SimpleString"], addr,
                             mem_fd=mem)
        t1 = time.monotonic_ns()
    finally:
        os.close(mem)
    return {"ok": rc == 0, "why": "" if rc == 0 else "queue", "error": "" if rc == 0 else "pending-call queue full",
            "stop_us": (t1 - tracee.stopped_ns) / 1e3, "total_us": (t1 - t0) / 1e3, "interpreter": interp.path,
            "held_signals": tracee.held_signals}


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
