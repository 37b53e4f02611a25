"""ptrace on x86-64 Linux through ctypes: stop one thread, point it at code that needs no tracer, watch it, let go.

The thread is seized and interrupted (PTRACE_SEIZE + PTRACE_INTERRUPT), so no SIGSTOP is sent and no other thread
of the process stops. The tracer writes registers once at most (`redirect`): after that the thread is resumed with
PTRACE_SYSCALL, so it stops only at system calls, and a tracer that dies at any point leaves it running code that
finishes on its own. Nothing the tracer does is ever undone, so there is nothing for a dead tracer to leave undone.
A stop signal that arrives meanwhile is held and handed back at detach (a group stop would stall the watch); any
other signal is delivered at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

PTRACE_PEEKDATA, PTRACE_POKEDATA = 2, 5
PTRACE_SYSCALL, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 24, 12, 13, 17
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_GET_RSEQ_CONFIGURATION = 0x4206, 0x4207, 0x420F
PTRACE_O_TRACESYSGOOD, PTRACE_EVENT_STOP, WALL = 1, 128, 0x40000000
SYSCALL_STOP = signal.SIGTRAP | 0x80
STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}

_REG_NAMES = ("r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
              "fs_base gs_base ds es fs gs").split()


class Regs(ctypes.Structure):
    """struct user_regs_struct (x86-64)."""

    _fields_ = [(n, ctypes.c_ulonglong) for n in _REG_NAMES]

    def copy(self) -> "Regs":
        """An independent copy."""
        r = Regs()
        ctypes.pointer(r)[0] = self
        return r


class PtraceError(OSError):
    """A ptrace request that failed; errno says why."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]


def ptrace(request: int, tid: int, addr=None, data=None) -> int:
    """One ptrace(2) request; PtraceError on failure."""
    ctypes.set_errno(0)
    r = _libc.ptrace(request, tid, addr, data)
    if r == -1 and ctypes.get_errno():
        e = ctypes.get_errno()
        raise PtraceError(e, f"ptrace request {request:#x}: {os.strerror(e)}")
    return r


class Tracee:
    """One seized thread, stopped on entry. Use as a context manager: the exit detaches and changes nothing."""

    def __init__(self, tid: int, wait_s: float = 1.0):
        self.tid, self.wait_s = tid, wait_s
        self.held_signals: list[int] = []
        self.saved: Regs | None = None  # the registers at the stop, as the thread left its own code
        self.stopped_ns = 0

    def __enter__(self) -> "Tracee":
        ptrace(PTRACE_SEIZE, self.tid, None, PTRACE_O_TRACESYSGOOD)
        try:
            ptrace(PTRACE_INTERRUPT, self.tid)
            self.stopped_ns = time.monotonic_ns()
            deadline = time.monotonic() + self.wait_s
            while True:
                status = self.wait_stop(deadline)
                if (status >> 16) == PTRACE_EVENT_STOP:
                    break
                if os.WSTOPSIG(status) == SYSCALL_STOP:
                    ptrace(PTRACE_SYSCALL, self.tid, None, 0)
            self.saved = self.regs()
        except BaseException:
            self._detach()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self._detach()

    def _detach(self) -> None:
        later = self.held_signals[1:]
        try:
            ptrace(PTRACE_DETACH, self.tid, None, self.held_signals[0] if self.held_signals else 0)
        except PtraceError:  # not in a stop (a timed-out watch): the thread runs on; our exit detaches it
            later = self.held_signals
        for sig in later:
            try:
                os.kill(self.tid, sig)
            except OSError:
                pass

    def wait_stop(self, deadline: float) -> int:
        """The next stop's wait status; a signal-delivery stop is answered here (held or delivered) and its status
        returned all the same. TimeoutError past `deadline`, ProcessLookupError if the thread ended."""
        spins = 0
        while True:
            pid, status = os.waitpid(self.tid, os.WNOHANG | WALL)
            if pid:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"thread {self.tid} did not stop within {self.wait_s:g} s")
            spins += 1
            if spins > 2000:
                time.sleep(0.0002)
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            raise ProcessLookupError(f"thread {self.tid} ended")
        sig = os.WSTOPSIG(status)
        if (status >> 16) == 0 and sig != SYSCALL_STOP:  # a signal on its way to the thread
            if sig in STOP_SIGNALS:
                if sig not in self.held_signals:
                    self.held_signals.append(sig)
                sig = 0
            ptrace(PTRACE_SYSCALL, self.tid, None, sig)
        return status

    def rseq_area(self) -> int:
        """The address of the thread's registered struct rseq; 0 if none or the kernel cannot say (before 5.13)."""
        conf = (ctypes.c_uint64 * 3)()
        try:
            ptrace(PTRACE_GET_RSEQ_CONFIGURATION, self.tid, ctypes.sizeof(conf), ctypes.addressof(conf))
        except PtraceError:
            return 0
        return conf[0]

    def regs(self) -> Regs:
        """The thread's general registers."""
        r = Regs()
        ptrace(PTRACE_GETREGS, self.tid, None, ctypes.addressof(r))
        return r

    def poke(self, addr: int, data: bytes) -> None:
        """Write `data` at `addr` a word at a time (PTRACE_POKEDATA), the bytes around it in its words kept: for
        memory the kernel will not let /proc/PID/mem write (proc_mem.force_override=never)."""
        lo, hi = addr & ~7, (addr + len(data) + 7) & ~7
        first, last = self._peek(lo), self._peek(hi - 8)
        words = bytearray(first + bytes(hi - lo - 16) + last if hi - lo > 8 else first)
        words[addr - lo:addr - lo + len(data)] = data
        for at in range(lo, hi, 8):
            ptrace(PTRACE_POKEDATA, self.tid, at, int.from_bytes(words[at - lo:at - lo + 8], "little"))

    def _peek(self, addr: int) -> bytes:
        return (ptrace(PTRACE_PEEKDATA, self.tid, addr) % 2**64).to_bytes(8, "little")  # libc returns the word

    def redirect(self, rip: int) -> None:
        """Resume the stopped thread at `rip` with every other register as it stopped, and no syscall restart:
        the one write to its registers."""
        r = self.saved.copy()
        r.rip, r.orig_rax = rip, (1 << 64) - 1
        ptrace(PTRACE_SETREGS, self.tid, None, ctypes.addressof(r))

    def until_syscall(self, accept, deadline: float) -> Regs:
        """Resume to system-call stops until one whose registers `accept` takes; leave the thread stopped there."""
        ptrace(PTRACE_SYSCALL, self.tid, None, 0)
        while True:
            status = self.wait_stop(deadline)
            if os.WSTOPSIG(status) == SYSCALL_STOP:
                r = self.regs()
                if accept(r):
                    return r
                ptrace(PTRACE_SYSCALL, self.tid, None, 0)
            elif (status >> 16) != 0:  # a group stop or an event: let it go on
                ptrace(PTRACE_SYSCALL, self.tid, None, 0)
