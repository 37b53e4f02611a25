"""Whether a stopped CPython thread may call `Py_AddPendingCall`: the state of the pending-call lock it takes.

`Py_AddPendingCall` waits for that lock. A thread holds it for a few instructions while it pushes an entry (inside
Py_AddPendingCall) or pops one (its eval loop or Py_MakePendingCalls running the queue); stopped there and pointed
at the trampoline, it would wait for a lock only it can release, for good. So at each stop the helper reads the
lock's state from the target's memory, and lets a thread go untouched while the lock is taken by anyone, or while
what it reads there is not what an interpreter of that version keeps there. Another thread that holds it releases
it on its own; the stopped thread cannot take it between the read and the call, since it is stopped.

Where the lock lives, from the exported `_PyRuntime` (offsets read from each version's internal headers and checked
against the machine code of its `_PyEval_AddPendingCall`, for 3.10.13, 3.11.2, 3.11.7, 3.12.1 and 3.13.0):

  3.10, 3.11  `Py_AddPendingCall` queues to its thread's interpreter (or the main one): every interpreter's
              `ceval.pending.lock`, a PyThread lock, which on Linux is a malloc'd glibc `sem_t` (value 1 free, 0 held)
  3.12        `_PyRuntime.ceval.pending_mainthread.lock`, the same kind of lock (the legacy API queues to the main
              thread of the main interpreter)
  3.13        `_PyRuntime.ceval.pending_mainthread.mutex`, a PyMutex byte (bit 0 held, bit 1 a waiter parked)

Each read is checked against invariants of the structure around it (the queue's indices in range; the semaphore's
value 0 or 1 and its `private` word 0, as glibc's sem_init leaves a process-private one; 3.13's queue limit of 32),
so a build whose layout differs (another patch release that moved a field, a free-threaded build, a libc with
another sem_t) reads as unknown, not as free, and the thread is not redirected.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from decodemon.monitor.inject import elf


class LockUnknown(ValueError):
    """The target's lock cannot be found, or what is there is not what the version keeps there."""


@dataclass(frozen=True)
class _Layout:
    """Byte offsets of one version's pending-call state."""

    interp_head: int = 0  # 3.10, 3.11: _PyRuntime.interpreters.head; each interpreter's `next` is at its offset 0
    lock: int = 0  # 3.10, 3.11: in PyInterpreterState; 3.12: in _PyRuntime (a pointer to the lock); 3.13: the byte
    first: int = 0  # the queue's `first` index, followed by `last` (3.10-3.12) or `next` (3.13), same base as `lock`
    slots: int = 32  # the queue's array length: `first` and `last`/`next` lie in [0, slots)


LAYOUTS = {
    (3, 10): _Layout(interp_head=32, lock=80, first=608),
    (3, 11): _Layout(interp_head=40, lock=112, first=640),
    (3, 12): _Layout(lock=2024, first=2552),
    (3, 13): _Layout(lock=2648, first=9864, slots=300),  # `max` 8 bytes past the mutex
}
MAX_INTERPRETERS = 64  # a longer list (or a cycle) reads as unknown
SYMBOLS = ["_PyRuntime", "Py_Version"]


class PendingLock:
    """The pending-call lock of one target, found once; `held` reads its state at a stop."""

    def __init__(self, pid: int, interp: elf.Interpreter, mem: int):
        """LockUnknown when the version has no known layout or `_PyRuntime` is not exported."""
        self.mem = mem
        addresses = elf.symbol_addresses(pid, interp.path, SYMBOLS)
        self.version = interp.version
        if "Py_Version" in addresses:  # exported from 3.11 on: the file name need not say
            hexversion, = self._read(addresses["Py_Version"], "<I")
            self.version = hexversion >> 24, (hexversion >> 16) & 0xFF
        if self.version not in LAYOUTS:
            shown = "an unknown version" if self.version is None else "CPython %d.%d" % self.version
            raise LockUnknown(f"where {shown} keeps its pending-call lock is not known")
        self.layout = LAYOUTS[self.version]
        if "_PyRuntime" not in addresses:
            raise LockUnknown(f"{interp.path} does not export _PyRuntime")
        self.runtime = addresses["_PyRuntime"]

    def _read(self, addr: int, fmt: str) -> tuple:
        size = struct.calcsize(fmt)
        try:
            data = os.pread(self.mem, size, addr)
        except OSError as exc:
            raise LockUnknown(f"unreadable at {addr:#x} ({exc})") from None
        if len(data) != size:
            raise LockUnknown(f"unreadable at {addr:#x}")
        return struct.unpack(fmt, data)

    def _queue_indices_ok(self, base: int) -> None:
        first, last = self._read(base + self.layout.first, "<ii")
        if not (0 <= first < self.layout.slots and 0 <= last < self.layout.slots):
            raise LockUnknown(f"pending-call queue indices {first}, {last} out of range")

    def _semaphore_held(self, lock: int) -> bool:
        """A PyThread lock: glibc's sem_t, {uint64 value | waiters << 32, int private (0: process-private)}."""
        if not lock:
            raise LockUnknown("no pending-call lock allocated")
        data, private = self._read(lock, "<Qi")
        value, waiters = data & 0xFFFFFFFF, data >> 32
        if value > 1 or private != 0 or waiters > 1 << 20:
            raise LockUnknown(f"the pending-call lock at {lock:#x} is not a glibc semaphore of a lock")
        return value == 0

    def held(self) -> bool:
        """Whether any thread holds the lock (3.13: or a waiter is parked on it). LockUnknown if it cannot tell."""
        lay, rt = self.layout, self.runtime
        if self.version >= (3, 13):
            bits, _npending, limit = self._read(rt + lay.lock, "<Bxxxii")
            if bits > 3 or limit != 32:
                raise LockUnknown("the pending-call mutex is not where CPython 3.13 keeps it")
            self._queue_indices_ok(rt)
            return bits != 0  # a parked waiter would send our unlock through the parking lot: not now either
        if self.version == (3, 12):
            self._queue_indices_ok(rt)
            return self._semaphore_held(self._read(rt + lay.lock, "<Q")[0])
        interp, = self._read(rt + lay.interp_head, "<Q")
        for _ in range(MAX_INTERPRETERS):
            if not interp:
                return False
            self._queue_indices_ok(interp)
            if self._semaphore_held(self._read(interp + lay.lock, "<Q")[0]):
                return True
            interp, = self._read(interp, "<Q")
        raise LockUnknown(f"more than {MAX_INTERPRETERS} interpreters")
