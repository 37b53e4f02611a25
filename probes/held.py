"""Short calls the agent thread makes without giving the GIL up: a non-blocking send, a pread of /proc.

Every call that releases the GIL (`os.read`, `socket.send`, ctypes' CDLL functions) lets a decode thread that
was waiting for it run; when the call returns a moment later the agent thread asks for the GIL back, and a decode
thread running Python has to stop and wait for it again: one voluntary context switch of the decode thread per
call. Unobserved, an eager decode thread on the H200 made 0 a second; attached it made ~44 a second with the
GIL-releasing calls, and tokens with one were the slow ones. A call that returns in microseconds and never blocks
costs the decode thread less if the GIL is simply kept through it. ctypes' PyDLL functions and PYFUNCTYPE
prototypes keep it; CDLL releases it.

`ENABLED` (set per attach from `Attach.hold_gil`) turns all of this off, for A/B runs against the releasing calls.
Where a libc symbol cannot be had, the calls fall back to the GIL-releasing ones. Also here: the
agent's other manners towards a decode thread that needs the GIL (`GilPolite`, `SwitchCounter`).
"""

from __future__ import annotations

import ctypes
import os
import select
import sys
import threading
import time

ENABLED = True

_MSG_DONTWAIT = 0x40
_MSG_NOSIGNAL = 0x4000
_SEND_MAX = 1 << 20

try:
    _libc = ctypes.PyDLL(None, use_errno=True)  # the process's own symbols: libc's read, send, pread
    _read = _libc.read
    _read.argtypes, _read.restype = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t], ctypes.c_ssize_t
    _send = _libc.send
    _send.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _send.restype = ctypes.c_ssize_t
    _pread = _libc.pread
    _pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    _pread.restype = ctypes.c_ssize_t
except (OSError, AttributeError):  # no libc symbols to be had (not Linux): the os module's calls
    _libc = _read = _send = _pread = None


def _raise_errno() -> None:
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))  # OSError(EAGAIN, ...) is a BlockingIOError, as os.read would raise


class Reader:
    """Reads of a non-blocking fd into one buffer kept for the purpose, as `os.read(fd, size)` would (bytes, b""
    at end of file, BlockingIOError when nothing is there), without giving the GIL up."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._buf: ctypes.Array | None = None

    def _buffer(self) -> ctypes.Array:
        if self._buf is None:  # made at the first call, then kept
            self._buf = ctypes.create_string_buffer(self.size)
        return self._buf

    def read(self, fd: int) -> bytes:
        """os.read(fd, size), keeping the GIL."""
        if not ENABLED or _read is None:
            return os.read(fd, self.size)
        n = _read(fd, self._buffer(), self.size)
        if n < 0:
            _raise_errno()
        return ctypes.string_at(self._buf, n)  # the n bytes read, not the whole buffer

    def pread(self, fd: int, offset: int = 0) -> bytes:
        """os.pread(fd, size, offset), keeping the GIL."""
        if not ENABLED or _pread is None:
            return os.pread(fd, self.size, offset)
        n = _pread(fd, self._buffer(), self.size, offset)
        if n < 0:
            _raise_errno()
        return ctypes.string_at(self._buf, n)


def send(sock, view: memoryview) -> int:
    """One non-blocking send of `view` on `sock` (a socket object): bytes sent; BlockingIOError when the socket has
    no room, another OSError when the peer has gone (no SIGPIPE), as `sock.send` on a non-blocking socket."""
    if not ENABLED or _send is None:
        return sock.send(view)
    n = min(len(view), _SEND_MAX)  # no more than a socket takes in one send anyway
    if view.readonly:
        ptr = ctypes.c_char_p(bytes(view[:n]))
    else:
        ptr = (ctypes.c_char * n).from_buffer(view)
    sent = _send(sock.fileno(), ptr, n, _MSG_DONTWAIT | _MSG_NOSIGNAL)
    if sent < 0:
        _raise_errno()
    return sent


_PARAMS_CALL = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p)  # CUptiResult f(Params *): the GIL kept


_PR_SET_NAME = 15


def name_this_thread(name: str) -> bool:
    """Give the calling thread an OS name (/proc/PID/task/TID/comm, `top -H`; 15 bytes at most). The agent's
    threads then stand apart from the engine's own, which all carry the interpreter's name: on the H200 every
    thread of the demo engine read `python3`, so an attach's CPU and minor faults could not be split by thread.
    Only the calling thread's name changes; False where prctl cannot be had."""
    try:
        return _libc is not None and _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0) == 0
    except AttributeError:  # a libc without prctl
        return False


def send_all(conn, data, timeout_s: float) -> bool:
    """Send `data` on the non-blocking socket `conn`: one send() when the socket has room (the usual case: no
    switch to blocking mode and back, each of which is a call of its own), made keeping the GIL, else wait for
    room, `timeout_s` in all. False if the peer went away or never made room."""
    view = memoryview(data)
    deadline = None
    while view:
        try:
            n = send(conn, view)
        except BlockingIOError:
            n = 0
        except OSError:  # BrokenPipeError, ConnectionResetError, ...
            return False
        view = view[n:]
        if view:
            now = time.monotonic()
            deadline = deadline or now + timeout_s
            if now >= deadline:
                return False
            try:
                select.select([], [conn], [], deadline - now)
            except (OSError, ValueError):
                return False
    return True


class SwitchCounter:
    """A thread's voluntary context switches per second (the decode thread's, read at the agent's stats tick).

    An eager decode thread that never blocks on its own (CUDA's sync spins) made 0 a second unobserved on the
    H200 and 17-28 attached with the held calls: each is a wait, mostly for the GIL the agent thread took back.
    One pread of /proc/self/task/TID/status per reading, made keeping the GIL, the file kept open."""

    def __init__(self) -> None:
        self._reader = Reader(4096)
        self.fd: int | None = None
        self.tid: int | None = None
        self.last: tuple[float, int] | None = None

    @staticmethod
    def parse(status: bytes) -> int | None:
        """voluntary_ctxt_switches from a /proc status file's text, or None."""
        for line in status.splitlines():
            if line.startswith(b"voluntary_ctxt_switches:"):
                try:
                    return int(line.split(b":", 1)[1])
                except ValueError:
                    return None
        return None

    def per_s(self, tid: int | None, now: float) -> float | None:
        """Switches per second since the last reading of the same thread (None at the first, or unreadable)."""
        if tid is None:
            return None
        if tid != self.tid:
            self.close()
            try:
                self.fd = os.open(f"/proc/self/task/{tid}/status", os.O_RDONLY)
            except OSError:
                return None
            self.tid = tid
        try:
            n = self.parse(self._reader.pread(self.fd, 0))
        except OSError:
            n = None
        if n is None:
            return None
        prev, self.last = self.last, (now, n)
        if prev is None or now <= prev[0]:
            return None
        return (n - prev[1]) / (now - prev[0])

    def close(self) -> None:
        """Close the status file (the next reading opens it again)."""
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd, self.tid, self.last = None, None, None


class Pacer:
    """Called between chunks of the agent thread's Python work: sleeps `ratio` times the CPU this thread spent
    since the last call (at least `min_s`), so the work takes no more than 1/(1 + ratio) of the GIL from a decode
    thread that wants it all, however long each chunk turns out to be on the machine at hand."""

    def __init__(self, ratio: float, min_s: float = 0.001, sleep=time.sleep) -> None:
        self.ratio, self.min_s, self.sleep = ratio, min_s, sleep
        self.since = time.thread_time()
        self.slept_s = 0.0

    def __call__(self) -> None:
        dt = max(self.min_s, self.ratio * (time.thread_time() - self.since))
        self.sleep(dt)
        self.slept_s += dt
        self.since = time.thread_time()


class GilPolite:
    """Hand the GIL back quickly while the agent thread does a burst of Python work (imports, set-up, re-arm).

    CPython lets a thread that runs Python keep the GIL for its whole switch interval (5 ms) while another waits
    for it: on the H200 the first attach of a process made 33-40 graphed tokens 7-35 ms long (against 4.0) and an
    eager one a 447 ms token, while the agent thread imported cupti and armed CUPTI and the decode thread waited
    to return from `.item()`. For the length of such a burst the interval is cut to 0.2 ms, then put back as it
    was; with it, the eager first attach's p99 was 0.95x unobserved. Nested uses restore at the outer exit."""

    depth = 0
    saved = 0.005
    _lock = threading.Lock()

    def __enter__(self):
        with GilPolite._lock:
            if GilPolite.depth == 0:
                GilPolite.saved = sys.getswitchinterval()
                sys.setswitchinterval(min(GilPolite.saved, 0.0002))
            GilPolite.depth += 1
        return self

    def __exit__(self, *exc):
        with GilPolite._lock:
            GilPolite.depth -= 1
            if GilPolite.depth == 0:
                sys.setswitchinterval(GilPolite.saved)
        return False
