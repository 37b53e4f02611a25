"""The ptrace helper can die at any point of an injection (an OOM kill, a Ctrl-C, a container stop): its target runs
on unharmed, and a later injection into it works.

Fresh targets, in parallel lanes, on every CPython from 3.10 to 3.13 found on the machine: a busy loop (the GIL
held, no system calls) and two loops that sleep in system calls the kernel restarts after a ptrace stop (time.sleep's
clock_nanosleep, select on 3.10, and usleep's relative nanosleep, which restarts through restart_syscall and would
return EINTR if that went wrong). Each loop checks its own
arithmetic and ticks a counter in a shared page. Their helpers are SIGKILLed either just before the k-th of the
calls by which a helper changes anything in a target (a ptrace request or a write to its memory), k running over
every such call of an injection, or at a random instant after the target shows a tracer. Afterwards each target
must be alive, untraced and ticking, and then take a whole injection whose source runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from decodemon.monitor.inject import helper, pending_lock, trampoline
from tests.conftest import cli
from tests.test_inject_versions import _python

TICK = r'''
import mmap, sys
_f = open(sys.argv[1], "r+b")
_m = mmap.mmap(_f.fileno(), 8)
def tick(i):
    _m[:8] = i.to_bytes(8, "little")
'''

TARGETS = {
    "busy": TICK + r'''
i = 0
while True:
    i += 1
    assert sum(range(3000)) == 4498500 and sum(k * 0.5 for k in range(64)) == 1008.0
    tick(i)
''',
    "sleep": TICK + r'''
import time
i = 0
while True:
    i += 1
    time.sleep(0.0003)
    assert sum(k * 0.25 for k in range(32)) == 124.0
    tick(i)
''',
    "usleep": TICK + r'''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
i = 0
while True:
    i += 1
    assert libc.usleep(300) == 0, ctypes.get_errno()
    tick(i)
''',
}

# The helper, its calls that reach the target counted: it SIGKILLs itself just before call number argv[2] (a
# SIGKILL to oneself takes effect before the call returns), and says how many there were if it lives.
KILLED_AT_CALL = r'''
import os, signal, sys
from decodemon.monitor.inject import helper, ptrace
calls, kill_at = [0], int(sys.argv[2])
def counted(f):
    def call(*a, **kw):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return f(*a, **kw)
    return call
ptrace.ptrace = counted(ptrace.ptrace)
os.pwrite = counted(os.pwrite)
rc = helper.main(sys.argv[1:2])
print("calls", calls[0], file=sys.stderr)
sys.exit(rc)
'''

HELPER = [sys.executable, "-m", "decodemon.monitor.inject.helper"]
PAUSE_SOURCE = b"pass\n"  # what a killed helper may have queued: nothing the test has to wait for


def _shm_dir() -> str:
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class Target:
    """A fresh loop of one kind with its counter page."""

    def __init__(self, kind: str, workdir: Path, *args: str, python: str = sys.executable, source: str = ""):
        fd, self.counter = tempfile.mkstemp(prefix="tick-", dir=_shm_dir())
        os.write(fd, bytes(8))
        self._fd = fd
        self.kind = kind
        self.proc = subprocess.Popen([python, "-S", "-c", source or TARGETS[kind], self.counter, *args],
                                     cwd=workdir,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.pid = self.proc.pid
        try:
            self.wait_ticks(1)
        except BaseException:
            self.close()
            raise

    def ticks(self) -> int:
        return int.from_bytes(os.pread(self._fd, 8, 0), "little")

    def wait_ticks(self, more: int, timeout_s: float = 30.0) -> None:
        """Until the loop has ticked `more` times; fails at once if it ended."""
        goal, t0 = self.ticks() + more, time.monotonic()
        while self.ticks() < goal:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.kind} target ended ({self.proc.returncode}): "
                                     f"{self.proc.stderr.read().decode(errors='replace')[-300:]}")
            assert time.monotonic() - t0 < timeout_s, f"{self.kind} target made no progress in {timeout_s:g} s"
            time.sleep(0.002)

    def tracer(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
        return 0

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stderr.close()
        os.close(self._fd)
        os.unlink(self.counter)


def _kill_at_call(pid: int, k: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", KILLED_AT_CALL, str(pid), str(k)], input=PAUSE_SOURCE,
                          capture_output=True, timeout=60)


def _kill_at_instant(t: Target, delay_s: float) -> int:
    """Start a helper on `t`, SIGKILL it `delay_s` after the target shows a tracer; its return code."""
    h = subprocess.Popen(HELPER + [str(t.pid)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    t0 = time.monotonic()
    while h.poll() is None and not _reads_stdin(h.pid) and time.monotonic() - t0 < 30:
        time.sleep(0.001)  # its start-up, not watched closely: the target is not touched before the source comes
    h.stdin.write(PAUSE_SOURCE)
    h.stdin.close()
    while h.poll() is None and t.tracer() == 0 and time.monotonic() - t0 < 30:
        pass
    until = time.perf_counter() + delay_s
    while time.perf_counter() < until:
        pass
    h.kill()
    return h.wait()


def _reads_stdin(pid: int) -> bool:
    """Whether `pid` is blocked in a read(2) of its fd 0."""
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[:2] == ["0", "0x0"]
    except (OSError, IndexError):
        return False


def _calls_in_an_injection(workdir: Path) -> int:
    """How many calls reach the target in a whole injection (the fewest over one target of each kind)."""
    counts = []
    for kind in TARGETS:
        t = Target(kind, workdir)
        try:
            r = _kill_at_call(t.pid, 0)
            assert r.returncode == 0, r.stderr
            counts.append(int(r.stderr.decode().split("calls")[-1]))
        finally:
            t.close()
    return min(counts)


def test_killing_the_helper_at_any_point_leaves_every_target_running_and_attachable(tmp_path):
    calls = _calls_in_an_injection(tmp_path)
    assert calls >= 8  # seize, interrupt, the registers read, the code written, the one register write, ...
    kinds = list(TARGETS)
    pythons = [sys.executable] + [p for p in map(_python, (10, 12, 13)) if p]  # the other CPythons found here
    # every call of an injection, for each kind of target, twice over; then instants spread over an injection
    plan = [(kinds[i % 3], "call", 1 + (i // 3) % calls) for i in range(6 * calls)]
    rnd = random.Random(20261202)
    plan += [(kinds[i % 3], "instant", rnd.uniform(0, 0.002)) for i in range(max(0, 200 - len(plan)))]
    rnd.shuffle(plan)
    plan = [(kind, how, at, pythons[i % len(pythons)]) for i, (kind, how, at) in enumerate(plan)]
    outcome: dict[str, list] = {"killed": [], "finished": [], "harmed": [], "reinjected": []}
    lock = threading.Lock()

    def lane(jobs):
        for kind, how, at, python in jobs:
            t = None
            try:
                t = Target(kind, tmp_path, python=python)
                if how == "call":
                    rc = _kill_at_call(t.pid, at).returncode
                else:
                    rc = _kill_at_instant(t, at)
                with lock:
                    outcome["killed" if rc == -signal.SIGKILL else "finished"].append((kind, how, at))
                t.wait_ticks(20)
                assert t.tracer() == 0
                marker = tmp_path / f"ran-{t.pid}"
                report = helper.queue_source(t.pid, f"open({str(marker)!r}, 'w').close()\n".encode())
                assert report["ok"], report
                t0 = time.monotonic()
                while not marker.exists():
                    assert time.monotonic() - t0 < 30, "the later injection's source never ran"
                    time.sleep(0.002)
                t.wait_ticks(20)
                with lock:
                    outcome["reinjected"].append(python)
            except Exception as exc:  # noqa: BLE001 - every failure is a harmed target, said with its reason
                with lock:
                    outcome["harmed"].append((kind, how, at, python, repr(exc)))
            finally:
                if t is not None:
                    t.close()

    lanes = [threading.Thread(target=lane, args=(plan[i::4],)) for i in range(4)]
    t0 = time.monotonic()
    for th in lanes:
        th.start()
    for th in lanes:
        th.join(timeout=300)
    print(f"{len(plan)} targets ({calls} calls an injection) in {time.monotonic() - t0:.1f} s: "
          f"{len(outcome['killed'])} helpers killed mid-way, {len(outcome['finished'])} finished first, "
          f"{len(outcome['harmed'])} targets harmed, {len(outcome['reinjected'])} injected again "
          f"({', '.join(f'{Path(os.path.realpath(p)).name}: {n}' for p, n in Counter(outcome['reinjected']).items())}"
          ")")
    assert not any(th.is_alive() for th in lanes)
    assert outcome["harmed"] == []
    assert len(outcome["reinjected"]) == len(plan) >= 200
    killed_at = {at for _, how, at in outcome["killed"] if how == "call"}
    assert killed_at == set(range(1, calls + 1))  # a kill before every one of the helper's calls


LOOP = r'''
import time
from decodemon.engine_adapter import mark_token
while True:
    mark_token()
    time.sleep(0.001)
'''


def _attach_with_its_helper_killed(pid: int) -> tuple[int, str] | None:
    """`decodemon attach PID` whose ptrace helper is SIGKILLed as soon as it is seen: its exit code and stderr;
    None if the helper finished before it was seen."""
    mon = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(pid), "--json", "--seconds",
                            "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0, helper_pid = time.monotonic(), None
    while helper_pid is None:
        if mon.poll() is not None:
            mon.communicate()
            return None
        assert time.monotonic() - t0 < 30
        helper_pid = _child_helper(mon.pid)
    os.kill(helper_pid, signal.SIGKILL)
    _out, err = mon.communicate(timeout=60)
    return mon.returncode, err


def test_the_monitor_says_in_one_line_that_its_helper_was_killed_and_a_retry_attaches():
    for _ in range(5):  # a fresh target each time: a helper that was not seen in time loaded the agent
        target = subprocess.Popen([sys.executable, "-c", LOOP])
        attached = _attach_with_its_helper_killed(target.pid)
        if attached is not None:
            break
        target.kill()
        target.wait()
    assert attached is not None, "the attach's helper finished each of 5 times before it was seen"
    try:
        rc, err = attached
        assert rc != 0 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert "helper was killed" in err and f"pid {target.pid} runs on" in err, err
        assert target.poll() is None
        r = cli("attach", target.pid, "--json", "--seconds", 1)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tokens"] > 0
    finally:
        target.kill()
        target.wait()


def _child_helper(parent: int) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                stat = (d / "stat").read_text()
            except OSError:
                continue
            if b"decodemon.monitor.inject.helper" in cmd and int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                return int(d.name)
    return None


@pytest.mark.skipif(not shutil.which("as") or not shutil.which("objcopy"), reason="needs binutils (as, objcopy)")
def test_the_trampolines_bytes_are_its_assembly(tmp_path):
    (tmp_path / "t.s").write_text(trampoline.assembly())
    subprocess.run(["as", "--64", "-o", str(tmp_path / "t.o"), str(tmp_path / "t.s")], check=True)
    subprocess.run(["objcopy", "-O", "binary", "-j", ".text", str(tmp_path / "t.o"), str(tmp_path / "t.bin")],
                   check=True)
    assert (tmp_path / "t.bin").read_bytes() == trampoline.CODE


def test_a_thread_stopped_in_a_restartable_system_call_resumes_as_the_kernel_would():
    rip, nr = 0x7F0000001234, 202
    assert trampoline.resume_point(rip, -512 & (2**64 - 1), nr) == (rip - 2, nr)  # ERESTARTSYS
    assert trampoline.resume_point(rip, -514 & (2**64 - 1), nr) == (rip - 2, nr)  # ERESTARTNOHAND
    assert trampoline.resume_point(rip, -516 & (2**64 - 1), 35) == (rip - 2, 219)  # a restart block
    assert trampoline.resume_point(rip, -4 & (2**64 - 1), nr) == (rip, -4 & (2**64 - 1))  # EINTR: returned
    assert trampoline.resume_point(rip, -512 & (2**64 - 1), 2**64 - 1) == (rip, -512 & (2**64 - 1))  # not a call


# A restartable sequence the main thread sits in until the kernel aborts it (at a preemption); the abort handler
# returns 1. glibc registers the thread's struct rseq and exports where it lies (__rseq_offset, from 2.35).
RSEQ_SPIN = r'''
        .text
        .globl  spin
        .type   spin, @function
spin:
        movq    __rseq_offset@GOTPCREL(%rip), %rax
        movq    (%rax), %rax
        leaq    cs_desc(%rip), %rcx
        movq    %rcx, %fs:8(%rax)       # arm the sequence: struct rseq's rseq_cs
cs_start:
        jmp     cs_start
cs_end:
        .long   0x53053053              # glibc's RSEQ_SIG on x86, just before the abort handler
cs_abort:
        movl    $1, %eax
        ret
        .data
        .balign 32
cs_desc:
        .long   0, 0
        .quad   cs_start, cs_end - cs_start, cs_abort
        .section .note.GNU-stack,"",@progbits
'''

RSEQ_TARGET = TICK + r'''
import ctypes, os, threading, time
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
lib = ctypes.CDLL(sys.argv[2])
def preempt():  # a wake-up a millisecond on the same CPU preempts the spin: the kernel aborts the sequence
    while True:
        time.sleep(0.001)
threading.Thread(target=preempt, daemon=True).start()
i = 0
while True:
    i += lib.spin()
    tick(i)
'''


def test_a_thread_inside_a_restartable_sequence_is_let_go_untouched(tmp_path):
    """Resumed at the trampoline, a thread stopped inside an rseq critical section would return into it with the
    sequence disarmed (the kernel clears rseq_cs on finding the ip outside it) and spin there for ever. The helper
    lets such a stop go untouched and stops the thread again; the kernel aborts the sequence as after any
    preemption, and the loop goes on."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    (tmp_path / "spin.S").write_text(RSEQ_SPIN)
    built = subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libspin.so"), str(tmp_path / "spin.S")],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"no glibc rseq to build on: {built.stderr.strip()[-200:]}")
    t = Target("rseq", tmp_path, str(tmp_path / "libspin.so"), source=RSEQ_TARGET)
    try:
        t.wait_ticks(50)
        outcomes = []
        for i in range(10):
            report = helper.queue_source(t.pid, PAUSE_SOURCE)
            assert report["ok"] or report["why"] == "busy", report
            outcomes.append(report["why"] or "queued")
            t.wait_ticks(50, timeout_s=10)
        print("injections into a thread spinning in an rseq critical section:", outcomes)
    finally:
        t.close()


# The main thread in C with the GIL held, taking the pending-call lock over and over: to push an entry
# (Py_AddPendingCall) and to pop it (Py_MakePendingCalls, which also runs what an injection queued). Each round
# ticks the counter page.
PENDING_SPIN = r"""
int Py_AddPendingCall(int (*)(void *), void *);
int Py_MakePendingCalls(void);
static int noop(void *arg) { (void)arg; return 0; }
void spin(volatile unsigned long *ticks) { for (;;) { Py_AddPendingCall(noop, 0); Py_MakePendingCalls(); ++*ticks; } }
"""

PENDING_TARGET = TICK + r"""
import ctypes
lib = ctypes.PyDLL(sys.argv[2])  # PyDLL: the GIL stays held, as in a C extension
lib.spin.argtypes = [ctypes.c_void_p]
lib.spin(ctypes.addressof(ctypes.c_uint64.from_buffer(_m)))
"""


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_a_thread_stopped_holding_the_pending_call_lock_is_let_go_untouched(minor, tmp_path):
    """Pointed at the trampoline while holding the pending-call lock, the main thread would wait in
    Py_AddPendingCall for a lock only it can release, for good. Twenty injections into a thread that takes the lock
    all the time: each queues its source, which runs, and the thread spins on between them."""
    python, cc = _python(minor), shutil.which("cc") or shutil.which("gcc")
    if python is None or cc is None:
        pytest.skip(f"needs CPython 3.{minor} and a C compiler")
    (tmp_path / "spin.c").write_text(PENDING_SPIN)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(tmp_path / "libspin.so"), str(tmp_path / "spin.c")],
                   check=True)
    t = Target("pending", tmp_path, str(tmp_path / "libspin.so"), python=python, source=PENDING_TARGET)
    try:
        t.wait_ticks(1000)
        let_go = []
        for i in range(20):
            marker = tmp_path / f"ran-{i}"
            source = f"try:\n    open({str(marker)!r}, 'w').close()\nexcept BaseException:\n    pass\n"
            report = helper.queue_source(t.pid, source.encode())
            assert report["ok"], (i, report)
            let_go.append(report["let_go"])
            t0 = time.monotonic()
            while not marker.exists():
                assert t.proc.poll() is None and time.monotonic() - t0 < 10, f"injection {i}'s source never ran"
                time.sleep(0.002)
            t.wait_ticks(1000, timeout_s=10)
        print(f"3.{minor}: stops let go untouched, per injection:", let_go)
    finally:
        t.close()


def test_a_pending_call_lock_that_cannot_be_read_is_injected_as_before_the_check(tmp_path, monkeypatch):
    """Where the lock's state cannot be told (a version without a known layout, or a read that is not what that
    version keeps there, as another patch release could lay it out) the injection goes on as it did before the
    check, rather than never: attach by pid keeps working there, and the report says the lock went unchecked."""
    version = sys.version_info[:2]
    real = pending_lock.LAYOUTS[version]
    t = Target("sleep", tmp_path)
    try:
        monkeypatch.delitem(pending_lock.LAYOUTS, version)
        report = helper.queue_source(t.pid, b"pass\n")
        assert report["ok"] and "not checked" in report["lock_unchecked"] and "is not known" in report["lock_unchecked"]
        t.wait_ticks(20)
        # 8 bytes past the lock pointer: the queue's two int flags, read as a pointer to a lock (zero here)
        monkeypatch.setitem(pending_lock.LAYOUTS, version, dataclasses.replace(real, lock=real.lock + 8))
        assert helper.queue_source(t.pid, b"pass\n")["ok"]
        t.wait_ticks(20)
        monkeypatch.setitem(pending_lock.LAYOUTS, version, real)
        marker = tmp_path / "ran"
        assert helper.queue_source(t.pid, f"open({str(marker)!r}, 'w').close()\n".encode())["ok"]
        t0 = time.monotonic()
        while not marker.exists():
            assert time.monotonic() - t0 < 30, "the source never ran"
            time.sleep(0.002)
    finally:
        t.close()


HELD_GPRS = ("rbx", "rbp", "r12", "r13", "r14", "r15", "rsi", "rdx", "rcx", "r8", "r9", "r10", "r11")


def _register_holder_asm() -> str:
    """`long hold(long rounds)`: known values in every general register but rax and rdi (scratch and the count),
    xmm0-15, MXCSR (rounding toward zero) and the direction flag (set), all checked on every round; 0 after
    `rounds` rounds, 1 at the first one found changed."""
    saved = ("rbx", "rbp", "r12", "r13", "r14", "r15")
    a = [".text", ".globl hold", ".type hold, @function", "hold:", *(f"push %{r}" for r in saved),
         "sub $8, %rsp", "stmxcsr (%rsp)", "ldmxcsr mxcsr_held(%rip)",
         *(f"movq gprs+{8 * k}(%rip), %{r}" for k, r in enumerate(HELD_GPRS)),
         *(f"movdqu xmms+{16 * n}(%rip), %xmm{n}" for n in range(16)), "std", "round:"]
    for k, r in enumerate(HELD_GPRS):
        a += [f"cmpq gprs+{8 * k}(%rip), %{r}", "jne changed"]
    for n in range(16):
        a += [f"movq %xmm{n}, %rax", f"cmpq xmms+{16 * n}(%rip), %rax", "jne changed",
              f"pextrq $1, %xmm{n}, %rax", f"cmpq xmms+{16 * n + 8}(%rip), %rax", "jne changed"]
    a += ["pushfq", "popq %rax", "btq $10, %rax", "jnc changed",
          "stmxcsr mxcsr_seen(%rip)", "movl mxcsr_seen(%rip), %eax", "cmpl mxcsr_held(%rip), %eax", "jne changed",
          "decq %rdi", "jnz round", "xorl %eax, %eax", "jmp out", "changed:", "movl $1, %eax", "out:", "cld",
          "ldmxcsr (%rsp)", "add $8, %rsp", *(f"pop %{r}" for r in reversed(saved)), "ret",
          ".data", ".balign 16",
          "gprs: .quad " + ", ".join(hex(0x0101010101010101 * (k + 17)) for k in range(len(HELD_GPRS))),
          "xmms: .quad " + ", ".join(hex(0x0123456789ABCDEF * (n + 3) % 2**64) for n in range(32)),
          "mxcsr_held: .long 0x7f80", "mxcsr_seen: .long 0", '.section .note.GNU-stack,"",@progbits']
    return "\n".join(a) + "\n"


HOLDER_TARGET = TICK + r'''
import ctypes
lib = ctypes.CDLL(sys.argv[2])
lib.hold.restype, lib.hold.argtypes = ctypes.c_long, [ctypes.c_long]
i = 0
while True:
    i += 1
    assert lib.hold(20000) == 0, "a register, MXCSR, xmm or the direction flag changed under the loop"
    tick(i)
'''


def test_a_threads_registers_flags_and_vector_state_are_as_they_were_wherever_the_helper_died(tmp_path):
    """The main thread spins in code that holds known values in its registers and checks them on every round;
    helpers killed before each of their calls, then whole injections, change none of them."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    (tmp_path / "hold.S").write_text(_register_holder_asm())
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libhold.so"), str(tmp_path / "hold.S")],
                   check=True)
    t = Target("holder", tmp_path, str(tmp_path / "libhold.so"), source=HOLDER_TARGET)
    try:
        whole = _kill_at_call(t.pid, 0)  # a whole injection, its calls counted
        assert whole.returncode == 0, whole.stderr
        calls = int(whole.stderr.decode().split("calls")[-1])
        t.wait_ticks(5)
        killed = []
        for k in range(1, calls + 1):
            killed.append(_kill_at_call(t.pid, k).returncode == -signal.SIGKILL)
            t.wait_ticks(5)
        for _ in range(3):
            assert helper.queue_source(t.pid, PAUSE_SOURCE)["ok"]
            t.wait_ticks(5)
        assert all(killed)
    finally:
        t.close()


def test_code_goes_in_through_ptrace_where_proc_mem_will_not_write_it(tmp_path, monkeypatch):
    """With proc_mem.force_override=never the kernel refuses /proc/PID/mem writes to a read-only mapping, even a
    tracer's; the trampoline then goes in a word at a time through PTRACE_POKEDATA, the cave's other bytes kept."""
    from decodemon.monitor.inject import elf

    t = Target("sleep", tmp_path)
    try:
        cave = elf.code_cave(t.pid, elf.read_maps(t.pid), trampoline.SIZE)
        real_pwrite, refused = os.pwrite, []

        def pwrite(fd, data, offset):
            if cave <= offset < cave + trampoline.SIZE:
                refused.append(offset)
                raise OSError(5, "Input/output error")
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", pwrite)
        marker = tmp_path / "ran"
        report = helper.queue_source(t.pid, f"open({str(marker)!r}, 'w').close()\n".encode())
        assert report["ok"] and refused == [cave], (report, refused)
        with open(f"/proc/{t.pid}/mem", "rb") as mem:
            mem.seek(cave)
            assert mem.read(trampoline.SIZE)[24:] == trampoline.CODE[24:]
        t0 = time.monotonic()
        while not marker.exists():
            assert time.monotonic() - t0 < 30, "the source never ran"
            time.sleep(0.002)
        t.wait_ticks(20)
    finally:
        t.close()
