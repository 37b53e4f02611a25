"""Traced windows in a Python target from decodemon's C library (probes/cupti_inject/decodemon_cupti.c), through
ctypes: the standard library alone in the target, and no GIL held while CUPTI works.

The monitor sends the library's bytes in its Attach (`cupti_library`, built in decodemon's own environment); the
agent thread writes them to an anonymous file (memfd) and loads it with libc's dlopen called through ctypes, which
gives the GIL up for the call: the library and the `libcupti` it needs (the one the process already loaded, else
the one beside decodemon) load while the decode thread keeps running Python. Every call into the library gives
the GIL up too (a ctypes CDLL call does), CUPTI's start-up and the reading of the records included.

The decode thread calls `open()` and `close()` at token boundaries, then `flush()` at the closing one (the
window's records read into the library's buffers). The agent thread makes CUPTI's start-up (`prepare()`), reads
the records back as columns (`collect()`: the library parses them and hands back msgpack, a handful of objects
here whatever the window's size) and, in a process that replays no CUDA graphs, finalizes (`detach()`: CUPTI
left initialised slows even untraced tokens); where graphs replay, the decode thread detaches at the closing
boundary (policy.finalize_off_loop).

A loop that marks no tokens gets windows by time instead (`trace_for`): the agent thread opens, sleeps, closes,
drains the records of kernels still running behind the host, and finalizes, with no token boundary involved.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

from decodemon.probes import msgpack_std
from decodemon.probes.frames import Column, KernelWindow

_ERR = 256
_LIBS: dict[bytes, ctypes.CDLL] = {}  # one load per library (its bytes' hash) in a process


class LibraryError(RuntimeError):
    """The library could not be loaded into this process; the message says why, in one line."""


def _libc_dlopen():
    libc = ctypes.CDLL(None)
    fn = libc.dlopen
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
    err = libc.dlerror
    err.restype, err.argtypes = ctypes.c_char_p, []
    return fn, err


def load(image: bytes) -> ctypes.CDLL:
    """The library `image` loaded into this process (once: a later attach with the same bytes gets the same one).
    dlopen runs with the GIL given up. LibraryError when the loader refuses it (its libcupti not found, say)."""
    import hashlib  # noqa: PLC0415

    key = hashlib.sha256(image).digest()
    if key in _LIBS:
        return _LIBS[key]
    fd = os.memfd_create("decodemon_cupti", os.MFD_CLOEXEC)
    try:
        view = memoryview(image)
        while view:
            view = view[os.write(fd, view):]
        dlopen, dlerror = _libc_dlopen()
        handle = dlopen(f"/proc/self/fd/{fd}".encode(), os.RTLD_NOW | os.RTLD_LOCAL)
        if not handle:
            why = (dlerror() or b"dlopen failed").decode(errors="replace")
            raise LibraryError(why.replace(f"/proc/self/fd/{fd}", "decodemon's CUPTI library"))
    finally:
        os.close(fd)  # the mapping stays; the file goes with its last reference
    lib = ctypes.CDLL("decodemon_cupti", handle=handle)
    i64, sz, buf = ctypes.c_int64, ctypes.c_size_t, ctypes.c_char_p
    for name, res, args in (
        ("decodemon_win_start", ctypes.c_int, [buf, sz]),
        ("decodemon_win_open", ctypes.c_int, [ctypes.c_int, ctypes.POINTER(i64), buf, sz]),
        ("decodemon_win_timestamp", i64, []),
        ("decodemon_win_close", ctypes.c_int, [ctypes.POINTER(i64)]),
        ("decodemon_win_flush", ctypes.c_int, []),
        ("decodemon_win_records", i64, []),
        ("decodemon_win_finalize", ctypes.c_int, [buf, sz]),
        ("decodemon_win_take", ctypes.c_int, [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(sz)]),
        ("decodemon_cupti_free", None, [ctypes.c_void_p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    _LIBS[key] = lib
    return lib


def columns(lib: ctypes.CDLL) -> dict:
    """The records the library holds, as the columns of a window (a dict: names, kernels, apis, api_names,
    memcpys, dropped_records, graph_kernels), each column a Column."""
    out, n = ctypes.c_void_p(), ctypes.c_size_t()
    if lib.decodemon_win_take(ctypes.byref(out), ctypes.byref(n)) != 0:
        raise MemoryError("out of memory packing a window's records")
    try:
        data = ctypes.string_at(out.value, n.value)
    finally:
        lib.decodemon_cupti_free(out)
    cols = msgpack_std.unpackb(data)
    for part in ("kernels", "apis", "memcpys"):
        cols[part] = {k: Column(v[0], v[1]) for k, v in cols[part].items()}
    return cols


class NativeTracer:
    """One CUPTI activity session per window, through decodemon's C library."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._lib = lib
        self._err = ctypes.create_string_buffer(_ERR)
        self._ts = ctypes.c_int64()
        self._names_lock = threading.Lock()
        # flush and finalize, from whichever thread (the agent's finalize of an eager process's window, a detach at
        # the decode thread's boundary): never at once, and neither touches CUPTI once it is finalized
        self._finalize_lock = threading.RLock()
        self._reset()
        self.active = False
        self.initialised = False
        self.start_ns = 0  # how long the last CUPTI start-up (decodemon_win_start) took
        self.prepared = False  # prepare() ran (agent thread) and no window has opened since
        self.last_ns: dict[str, int] = {}  # how long each step of the last window took (for the agent's event log)
        # A guard token is traced after the analysed ones only while the process replays CUDA graphs (their
        # last token's end times come back wrong); the first window has one, later ones follow what it saw.
        self.needs_guard = True
        # whether the next window records runtime-API calls (launch calls, copies' calls): the agent sets it per
        # window from `Attach.api_every`; without them a window holds kernels, copies and memsets only
        self.with_apis = True

    def _reset(self) -> None:
        self._ranges: list[tuple] = []  # NVTX ranges closed while open: (name index, start, end, level)
        self._range_names: dict[str, int] = {}
        self.bounds: list[int] = []
        self.host_ns = 0
        self.prepare_ns = 0  # CUPTI's start-up made by prepare() on the agent thread, for this window
        self.apis_traced = True  # what the last open() enabled (KernelWindow.apis_traced)

    def _fail(self, what: str) -> RuntimeError:
        return RuntimeError(self._err.value.decode(errors="replace") or what)

    def _spent(self, step: str, t0: int) -> None:
        """Count a step's host time in the window's probe cost and note it for the agent's event log."""
        dt = time.perf_counter_ns() - t0
        self.host_ns += dt
        self.last_ns[step] = dt

    # -- agent thread, just before a window is asked for -----------------------
    def prepare(self) -> int:
        """Make CUPTI's (re-)initialisation here, off the decode thread, so that open() only enables. The process's
        first one instruments the CUDA context (~0.5 s on an H200): here it costs the decode thread nothing, the
        GIL being given up for the call. Returns the ns it took."""
        t0 = time.perf_counter_ns()
        self._start()
        self.prepared = True
        self.prepare_ns = time.perf_counter_ns() - t0
        return self.prepare_ns

    def _start(self) -> None:
        self._reset()
        self.last_ns = {}
        t0 = time.perf_counter_ns()
        if self._lib.decodemon_win_start(self._err, _ERR) != 0:
            raise self._fail("CUPTI's start-up failed")
        self.start_ns = time.perf_counter_ns() - t0  # on whichever thread made it (facts.cupti_start_ns)
        self.initialised = True

    # -- decode thread, at token boundaries -----------------------------------
    def open(self) -> None:
        """Start tracing now (a token boundary)."""
        t0 = time.perf_counter_ns()
        if not self.prepared:  # nobody prepared this window: CUPTI's start-up is paid here
            self._start()
        self.prepared = False
        apis = bool(self.with_apis)
        if self._lib.decodemon_win_open(int(apis), ctypes.byref(self._ts), self._err, _ERR) != 0:
            raise self._fail("cuptiActivityEnable failed")
        self.apis_traced = apis
        self.initialised = True
        self.active = True
        self.bounds.append(self._ts.value)
        self._spent("open", t0)

    def boundary(self) -> None:
        """Note one token boundary inside the window, in CUPTI's clock."""
        self.bounds.append(self._lib.decodemon_win_timestamp())

    def close(self) -> None:
        """Stop tracing now (a token boundary); the records wait in CUPTI's buffers."""
        t0 = time.perf_counter_ns()
        self._lib.decodemon_win_close(ctypes.byref(self._ts))
        self.bounds.append(self._ts.value)
        self.active = False
        self._spent("close", t0)

    def flush(self) -> None:
        """Deliver every record of the closed window into the library's buffers (decode thread, right after
        close(): a flush from another thread while CUDA graphs replay, then a finalize, ended a loop on an H200)."""
        with self._finalize_lock:
            if not self.initialised:
                return
            t0 = time.perf_counter_ns()
            self._lib.decodemon_win_flush()
            self._spent("flush", t0)

    def detach(self) -> None:
        """Finalize CUPTI so untraced tokens run at their unobserved speed (once, whichever thread asks first)."""
        with self._finalize_lock:
            if not self.initialised:
                return
            t0 = time.perf_counter_ns()
            try:
                if self._lib.decodemon_win_finalize(self._err, _ERR) != 0:
                    raise self._fail("cuptiFinalize failed")
            finally:
                self.initialised = False
                self.prepared = False
                self._spent("finalize", t0)

    # -- agent thread, a window by time ------------------------------------------
    def trace_for(self, seconds: float, quiet_s: float = 0.05, drain_max_s: float = 1.0, sleep=time.sleep) -> None:
        """A window by time, all on the calling (agent) thread: open now, sleep `seconds`, close, then flush
        until no new record has come for `quiet_s` (at most `drain_max_s`: kernels enqueued before the close may
        still be running on a GPU that runs behind the host), then finalize. `bounds` is [opened, closed].
        Never in a process that replays CUDA graphs (policy.window_clock)."""
        self.open()
        try:
            sleep(seconds)
        finally:
            self.close()
            try:
                self._drain(quiet_s, drain_max_s, sleep)
            finally:
                self.detach()

    def _drain(self, quiet_s: float, drain_max_s: float, sleep) -> None:
        t0 = time.monotonic()
        last_change, seen = t0, -1
        step = max(quiet_s / 5, 0.001)
        while True:
            self.flush()
            n = self._lib.decodemon_win_records()
            now = time.monotonic()
            if n != seen:
                seen, last_change = n, now
            if now - last_change >= quiet_s or now - t0 >= drain_max_s:
                return
            sleep(step)

    def timestamp(self) -> int:
        """CUPTI's clock (ns), the one the records carry."""
        return int(self._lib.decodemon_win_timestamp())

    def note_range(self, name: str, start_ns: int, end_ns: int, level: int) -> None:
        """An NVTX range that closed while the window was open (any thread); kept only if it opened in it too."""
        if len(self._ranges) >= 100_000 or (self.bounds and start_ns < self.bounds[0]):
            return
        with self._names_lock:  # two threads naming a new range at once must not share an index
            i = self._range_names.setdefault(name, len(self._range_names))
            self._ranges.append((i, int(start_ns), int(end_ns), int(level)))

    # -- agent thread -----------------------------------------------------------
    def collect(self, window_id: int, guard_tokens: int = 1, pause=None, clock: str = "tokens") -> KernelWindow:
        """The flushed records of the window as a KernelWindow (agent thread). The library reads them, with the GIL
        given up; `pause` is unused (there is no Python work to spread over tokens)."""
        cols = columns(self._lib)
        # graph kernels seen: later windows keep a guard token; none: they can do without
        self.needs_guard = bool(cols.get("graph_kernels"))
        with self._names_lock:
            taken, self._ranges = self._ranges, []
            named, self._range_names = self._range_names, {}
        range_names = [""] * len(named)
        for n, i in named.items():
            range_names[i] = n
        return KernelWindow(
            window_id=window_id,
            tokens=max(len(self.bounds) - 1 - guard_tokens, 0) if clock == "tokens" else 0,
            guard_tokens=guard_tokens,
            token_bounds_ns=Column.of(self.bounds),
            names=list(cols["names"]),
            kernels=cols["kernels"],
            api_names=dict(cols["api_names"]),
            apis=cols["apis"],
            memcpys=cols["memcpys"],
            syncs={c: Column.of([]) for c in ("start", "end", "type")},
            dropped_records=int(cols.get("dropped_records", 0)),
            probe_host_ns=self.host_ns,
            prepare_ns=self.prepare_ns,
            apis_traced=self.apis_traced,
            clock=clock,
            nvtx_names=range_names,
            nvtx={c: Column.of([r[j] for r in taken]) for j, c in enumerate(["name", "start", "end", "level"])}
            if taken else {},
        )
