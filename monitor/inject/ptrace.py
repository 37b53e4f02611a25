"""ptrace on x86-64 Linux through ctypes: stop one thread, run a syscall and a C call in it, put it back.

The thread is seized and interrupted (PTRACE_SEIZE + PTRACE_INTERRUPT), so no SIGSTOP is sent and no other thread
of the process stops. Its registers and its whole extended FPU state (PTRACE_GETREGSET NT_X86_XSTATE) are saved
first and written back last, orig_rax included: if the thread was stopped inside an interruptible system call, the
kernel then restarts that call on resume exactly as it would after a signal with no handler. While our code runs,
orig_rax is -1 so the kernel does not apply that restart logic to it. A called function returns to address 0; the
fault stops the thread (a signal-delivery-stop we swallow) before anything of the target runs.
Signals that arrive for the thread meanwhile are held and handed back at detach.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

PTRACE_CONT, PTRACE_SINGLESTEP, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 9, 12, 13, 17
PTRACE_GETFPREGS, PTRACE_SETFPREGS = 14, 15
PTRACE_GETREGSET, PTRACE_SETREGSET, PTRACE_SEIZE, PTRACE_INTERRUPT = 0x4204, 0x4205, 0x4206, 0x4207
PTRACE_EVENT_STOP, NT_X86_XSTATE, WALL = 128, 0x202, 0x40000000
SYS_MMAP, PROT_RW, MAP_PRIVATE_ANON = 9, 3, 0x22
RED_ZONE_BYTES = 128
XSTATE_BYTES = 1 << 16

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


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


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
    """One seized thread. Use as a context manager: the exit puts the saved state back and detaches."""

    def __init__(self, tid: int, wait_s: float = 1.0):
        self.tid, self.wait_s = tid, wait_s
        self.held_signals: list[int] = []
        self.saved: Regs | None = None
        self._xstate = None
        self._fpregs = None
        self.stopped_ns = 0

    def __enter__(self) -> "Tracee":
        ptrace(PTRACE_SEIZE, self.tid)
        try:
            ptrace(PTRACE_INTERRUPT, self.tid)
            self.stopped_ns = time.monotonic_ns()
            self._wait_for(lambda st: (st >> 16) == PTRACE_EVENT_STOP, resume=PTRACE_CONT)
            self.saved = self.regs()
            self._save_fpu()
        except BaseException:
            self._detach()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.saved is not None:
                self.set_regs(self.saved)
                self._restore_fpu()
        finally:
            self._detach()

    def _detach(self) -> None:
        first = self.held_signals[0] if self.held_signals else 0
        try:
            ptrace(PTRACE_DETACH, self.tid, None, first)
        except PtraceError:
            pass
        for sig in self.held_signals[1:]:
            try:
                os.kill(self.tid, sig)
            except OSError:
                pass

    def _wait_for(self, done, resume: int) -> int:
        """Wait for a stop that `done(status)` accepts; hold any signal that stops the thread meanwhile."""
        deadline = time.monotonic() + self.wait_s
        spins = 0
        while True:
            pid, status = os.waitpid(self.tid, os.WNOHANG | WALL)
            if pid == 0:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"thread {self.tid} did not stop within {self.wait_s:g} s")
                spins += 1
                if spins > 2000:
                    time.sleep(0.0002)
                continue
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                raise ProcessLookupError(f"thread {self.tid} ended")
            if done(status):
                return status
            sig = os.WSTOPSIG(status)
            if (status >> 16) == 0 and sig not in self.held_signals:
                self.held_signals.append(sig)
            ptrace(resume, self.tid, None, 0)

    def regs(self) -> Regs:
        """The thread's general registers."""
        r = Regs()
        ptrace(PTRACE_GETREGS, self.tid, None, ctypes.addressof(r))
        return r

    def set_regs(self, r: Regs) -> None:
        """Write the thread's general registers."""
        ptrace(PTRACE_SETREGS, self.tid, None, ctypes.addressof(r))

    def _save_fpu(self) -> None:
        buf = ctypes.create_string_buffer(XSTATE_BYTES)
        iov = _IoVec(ctypes.addressof(buf), XSTATE_BYTES)
        try:
            ptrace(PTRACE_GETREGSET, self.tid, NT_X86_XSTATE, ctypes.addressof(iov))
            self._xstate = (buf, iov.len)
        except PtraceError:  # no XSAVE: the legacy 512-byte FXSAVE area
            self._fpregs = ctypes.create_string_buffer(512)
            ptrace(PTRACE_GETFPREGS, self.tid, None, ctypes.addressof(self._fpregs))

    def _restore_fpu(self) -> None:
        if self._xstate is not None:
            buf, n = self._xstate
            iov = _IoVec(ctypes.addressof(buf), n)
            ptrace(PTRACE_SETREGSET, self.tid, NT_X86_XSTATE, ctypes.addressof(iov))
        elif self._fpregs is not None:
            ptrace(PTRACE_SETFPREGS, self.tid, None, ctypes.addressof(self._fpregs))

    def _scratch(self) -> Regs:
        r = self.saved.copy()
        r.orig_rax = (1 << 64) - 1  # not in a syscall: no restart logic on resume
        r.eflags &= ~0x400  # the ABI wants the direction flag clear at a call
        return r

    def syscall(self, gadget: int, nr: int, *args: int) -> int:
        """Run system call `nr` in the thread by single-stepping over a `syscall` instruction at `gadget`."""
        r = self._scratch()
        r.rax, r.rip = nr, gadget
        for name, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args):
            setattr(r, name, value & ((1 << 64) - 1))
        self.set_regs(r)
        ptrace(PTRACE_SINGLESTEP, self.tid, None, 0)
        self._wait_for(lambda st: os.WIFSTOPPED(st) and os.WSTOPSIG(st) == signal.SIGTRAP and (st >> 16) == 0,
                       resume=PTRACE_SINGLESTEP)
        rax = self.regs().rax
        return rax - (1 << 64) if rax >= (1 << 63) else rax

    def call(self, func: int, *args: int, mem_fd: int) -> int:
        """Call the C function at `func` with up to six integer arguments; return its int result."""
        r = self._scratch()
        sp = ((self.saved.rsp - RED_ZONE_BYTES - 256) & ~0xF) - 8  # 16-byte aligned before the return address
        os.pwrite(mem_fd, (0).to_bytes(8, "little"), sp)  # return to 0: the fault ends the call
        r.rsp, r.rip, r.rax = sp, func, 0
        for name, value in zip(("rdi", "rsi", "rdx", "rcx", "r8", "r9"), args):
            setattr(r, name, value)
        self.set_regs(r)
        ptrace(PTRACE_CONT, self.tid, None, 0)
        try:
            self._wait_for(lambda st: os.WIFSTOPPED(st) and os.WSTOPSIG(st) == signal.SIGSEGV and self.regs().rip == 0,
                           resume=PTRACE_CONT)
        except TimeoutError:
            ptrace(PTRACE_INTERRUPT, self.tid)  # abandon the call: the exit puts the saved state back
            self._wait_for(lambda st: (st >> 16) == PTRACE_EVENT_STOP, resume=PTRACE_CONT)
            raise
        return ctypes.c_int(self.regs().rax & 0xFFFFFFFF).value

    def mmap_rw(self, gadget: int, nbytes: int) -> int:
        """Map `nbytes` of private read-write memory in the process; return its address."""
        addr = self.syscall(gadget, SYS_MMAP, 0, nbytes, PROT_RW, MAP_PRIVATE_ANON, -1, 0)
        if -4096 < addr < 0:
            raise PtraceError(-addr, f"mmap in the target failed: {os.strerror(-addr)}")
        return addr
