"""Traced windows: CUPTI activity switched on for whole tokens (or a stretch of time), then CUPTI detached.

The decode thread calls `open()` and `close()` at token boundaries, then `flush()`
and `detach()` at the closing one (that is all it pays, plus CUPTI's own per-launch
cost while a window is open), because CUPTI left initialised slows even untraced
tokens. CUPTI's buffer callback, inside the flush, only keeps cupti-python's record
objects; the agent thread reads their fields in `collect()` and turns them into
columns. (`prepare()`, CUPTI's start-up on the agent thread a few tokens before the
open, is there for `Attach.prepare_lead_tokens`; by default the open pays it.)

A loop that marks no tokens gets windows by time instead (`trace_for`): the agent thread opens, sleeps, closes,
drains the records of kernels still running behind the host, and finalizes, with no token boundary involved.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from decodemon.probes.frames import Column, KernelWindow

_BUFFER_BYTES = 8 * 1024 * 1024
_CHUNK = 256


_I64_TOP = 1 << 63


def _wrapped(part: list) -> list:
    """Rows with a value past int64 (CUPTI's fields are uint64: four of five windows of a CUDA-graphed loop on an
    H200 failed to collect with `OverflowError: Python int too large to convert to C long`), each such value as its
    two's complement, as numpy's uint64-to-int64 view would have it: an id keeps its identity."""
    return [tuple(v - (1 << 64) if v >= _I64_TOP else v for v in row) for row in part]


def _rows(records: list, ncols: int, pause=None) -> np.ndarray:
    """Records (tuples) to an int64 array in chunks, so a thread waiting for the GIL gets it between chunks:
    one np.array() over two tokens' ~3,700 kernel records is a single 3-10 ms call that cannot be interrupted."""
    out = np.empty((len(records), ncols), dtype=np.int64)
    for i in range(0, len(records), _CHUNK):
        part = records[i:i + _CHUNK]
        try:
            out[i:i + len(part)] = part
        except OverflowError:
            out[i:i + len(part)] = _wrapped(part)
        if pause is not None:
            pause()
    return out


def _by_index(index: dict[str, int]) -> list[str]:
    """{name: index} as the list of names in index order."""
    out = [""] * len(index)
    for n, i in index.items():
        out[i] = n
    return out


class WindowTracer:
    """One CUPTI activity session per window; records kept as plain tuples until collect()."""

    # SYNCHRONIZATION records are not read by the monitor, and tracing them cost an eager 0.6B token ~3.6 ms more
    # on the H200
    KINDS = ("CONCURRENT_KERNEL", "RUNTIME", "MEMCPY", "MEMSET")

    def __init__(self, kinds: tuple[str, ...] = KINDS, api_filter: bool = True) -> None:
        from cupti import cupti  # noqa: PLC0415 - only when a monitor asks for traces

        self._c = cupti
        K = cupti.ActivityKind
        self._kinds = [getattr(K, k) for k in kinds]
        self._api_filter = api_filter
        self._k_kernel = int(K.CONCURRENT_KERNEL)
        self._k_runtime = int(K.RUNTIME)
        self._k_driver = int(K.DRIVER)
        self._k_memcpy = int(K.MEMCPY)
        self._k_memset = int(K.MEMSET)
        self._k_sync = int(K.SYNCHRONIZATION)
        # the kinds a kernels-only window enables, and whether a full one traces runtime records (its open filters
        # them): worked out here, on the agent thread, not at every open on the decode thread
        self._kinds_without_apis = [k for k in self._kinds if int(k) not in (self._k_runtime, self._k_driver)]
        self._traces_runtime = any(int(k) == self._k_runtime for k in self._kinds)
        self._rt_names = {int(v): n for n, v in cupti.runtime_api_trace_cbid.__members__.items()}
        self._drv_names = {int(v): n for n, v in cupti.driver_api_trace_cbid.__members__.items()}
        self._drop_cbids = [cbid for cbid, name in self._rt_names.items()
                            if cbid > 0 and not any(k in name for k in self._KEEP_RUNTIME)]
        self._names: dict[str, int] = {}
        self._reset()
        self.active = False
        self.initialised = False
        self.prepared = False  # prepare() ran (agent thread) and no window has opened since
        self.last_ns: dict[str, int] = {}  # how long each step of the last window took (for the agent's event log)
        # A guard token is traced after the analysed ones only while the process replays CUDA graphs (their
        # last token's end times come back wrong); the first window has one, later ones follow what it saw.
        self.needs_guard = True
        # whether the next window records runtime-API calls (launch calls, copies' calls): the agent sets it per
        # window from `Attach.api_every`; without them a window holds kernels, copies and memsets only
        self.with_apis = True
        self._enabled: list = []

    def _reset(self) -> None:
        self._batches: list = []  # what the buffer callback was handed, read in collect()
        self._kernels: list[tuple] = []
        self._apis: list[tuple] = []
        self._memcpys: list[tuple] = []
        self._syncs: list[tuple] = []
        self._ranges: list[tuple] = []  # NVTX ranges closed while open: (name index, start, end, level)
        self._range_lock = threading.Lock()
        self._range_names: dict[str, int] = {}
        self.bounds: list[int] = []
        self.host_ns = 0
        self.prepare_ns = 0  # CUPTI's start-up made by prepare() on the agent thread, for this window
        self.apis_traced = True  # what the last open() enabled (KernelWindow.apis_traced)

    # -- CUPTI callbacks (run in whichever thread flushes) --------------------
    def _requested(self):
        return _BUFFER_BYTES, 0

    def _completed(self, activities) -> None:
        """Keep the records; their fields are read on the agent thread (collect).

        The callback runs inside flush(), on the decode thread. Reading ~3,700 records' fields there cost the eager
        token after a window 2.0-3.1 ms of its 5-7 ms flush (H200: flush 5.2 ms with the fields read in the
        callback, 2.9 ms without). cupti-python's record objects own copies of their records (`from_ptr` without
        an owner copies), checked field by field on the H200 after CUPTI's finalize and 64 MB of fresh
        allocations, kernel names as text included.
        """
        self._batches.append(activities)

    def _read(self, activities) -> None:
        """The fields the monitor uses, as tuples (agent thread)."""
        kk, rt, dr, mc, ms, sy = (self._k_kernel, self._k_runtime, self._k_driver,
                                  self._k_memcpy, self._k_memset, self._k_sync)
        names = self._names
        kern, apis, cps, syn = self._kernels, self._apis, self._memcpys, self._syncs
        for a in activities:
            k = a.kind
            if k == kk:
                n = a.name
                i = names.get(n)
                if i is None:
                    i = names[n] = len(names)
                kern.append((i, a.start, a.end, a.grid_x, a.grid_y, a.grid_z, a.block_x, a.block_y,
                             a.block_z, a.registers_per_thread, a.static_shared_memory,
                             a.dynamic_shared_memory, a.stream_id, a.graph_id, a.graph_node_id,
                             a.correlation_id))
            elif k == rt:
                apis.append((a.cbid, a.start, a.end, a.correlation_id, 0))
            elif k == dr:
                apis.append((a.cbid, a.start, a.end, a.correlation_id, 1))
            elif k == mc:
                cps.append((a.start, a.end, a.bytes, a.copy_kind))
            elif k == ms:
                cps.append((a.start, a.end, a.bytes, -1))
            elif k == sy:
                syn.append((a.start, a.end, int(a.type)))

    _KEEP_RUNTIME = ("cudaLaunch", "cudaGraphLaunch", "cudaMemcpy", "cudaMemset", "Synchronize",
                     "cudaEventSynchronize", "cudaStreamWaitEvent")

    def _filter_apis(self) -> None:
        """Record only the API calls the timeline needs (launches, copies, syncs), not every cudaGetDevice."""
        c = self._c
        for cbid in self._drop_cbids:  # worked out once, in __init__ (the agent thread), not at every open
            try:
                c.activity_enable_runtime_api(cbid, 0)
            except Exception:
                pass

    def _spent(self, step: str, t0: int) -> None:
        """Count a step's host time in the window's probe cost and note it for the agent's event log."""
        dt = time.perf_counter_ns() - t0
        self.host_ns += dt
        self.last_ns[step] = dt

    # -- agent thread, just before a window is asked for -----------------------
    def prepare(self) -> int:
        """Make CUPTI's (re-)initialisation here, off the decode thread, so that open() only enables.

        After a finalize, whichever CUPTI call comes first re-initialises CUPTI: 13-27 ms on an H200, which
        in open() landed on the decode thread as one slow token per window. Made here, on the agent thread
        (cupti-python lets go of the GIL inside the call), open() took 0.4 ms instead of 14, but the token it
        overlapped still ran +5-9 ms slower: one more slow token per window, which is why it runs only when
        `Attach.prepare_lead_tokens` asks. If the window never opens, the
        decode thread's detach at its next boundary finalizes as usual (`initialised` is set). Returns the ns it took.
        """
        t0 = time.perf_counter_ns()
        self._start()
        self.prepared = True
        self.prepare_ns = time.perf_counter_ns() - t0
        return self.prepare_ns

    def _start(self) -> None:
        """A new window's state, and CUPTI (re-)initialised by registering the buffer callbacks."""
        self._reset()
        self.last_ns = {}
        self._c.activity_register_callbacks(self._requested, self._completed)
        self.initialised = True

    # -- decode thread, at token boundaries -----------------------------------
    def open(self) -> None:
        """Start tracing now (a token boundary)."""
        t0 = time.perf_counter_ns()
        c = self._c
        if not self.prepared:  # nobody prepared this window: CUPTI's start-up is paid here
            self._start()
        self.prepared = False
        apis = bool(self.with_apis)
        self._enabled = self._kinds if apis else self._kinds_without_apis
        for k in self._enabled:
            c.activity_enable(k)
        if self._api_filter and apis and self._traces_runtime:
            self._filter_apis()  # enabling RUNTIME again re-enables every cbid: filter on every open
        self.apis_traced = apis
        self.initialised = True
        self.active = True
        self.bounds.append(c.get_timestamp())
        self._spent("open", t0)

    def boundary(self) -> None:
        """Note one token boundary inside the window, in CUPTI's clock."""
        self.bounds.append(self._c.get_timestamp())

    def close(self) -> None:
        """Stop tracing now (a token boundary); the records wait in CUPTI's buffers."""
        t0 = time.perf_counter_ns()
        c = self._c
        self.bounds.append(c.get_timestamp())
        for k in self._enabled:
            c.activity_disable(k)
        self.active = False
        self._spent("close", t0)

    def flush(self) -> None:
        """Deliver every record of the closed window (decode thread, right after close()).

        On an H200, flushing and finalizing at the same boundary, in the decode
        thread, left graphed tokens at their unobserved speed; a flush from
        another thread while the graph kept replaying, followed by a finalize,
        was the one sequence that ended in `unspecified launch failure`.
        """
        t0 = time.perf_counter_ns()
        self._c.activity_flush_all(1)
        self._spent("flush", t0)

    def detach(self) -> None:
        """Finalize CUPTI so untraced tokens run at their unobserved speed."""
        if self.initialised:
            t0 = time.perf_counter_ns()
            try:
                self._c.finalize()
            finally:
                self.initialised = False
                self.prepared = False
                self._spent("finalize", t0)

    # -- agent thread, a window by time ------------------------------------------
    def trace_for(self, seconds: float, quiet_s: float = 0.05, drain_max_s: float = 1.0, sleep=time.sleep) -> None:
        """A window by time, all on the calling (agent) thread: open now, sleep `seconds`, close, then flush
        until no new record has come for `quiet_s` (at most `drain_max_s`: kernels enqueued before the close may
        still be running on a GPU that runs behind the host), then finalize. `bounds` is [opened, closed].
        Never in a process that replays CUDA graphs (policy.window_clock): there a flush and finalize from this
        thread during a replay ended the loop on an H200."""
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
            n = sum(len(b) for b in self._batches)
            now = time.monotonic()
            if n != seen:
                seen, last_change = n, now
            if now - last_change >= quiet_s or now - t0 >= drain_max_s:
                return
            sleep(step)

    def timestamp(self) -> int:
        """CUPTI's clock (ns), the one the records carry."""
        return int(self._c.get_timestamp())

    def note_range(self, name: str, start_ns: int, end_ns: int, level: int) -> None:
        """An NVTX range that closed while the window was open (any thread); kept only if it opened in it too."""
        if len(self._ranges) >= 100_000 or (self.bounds and start_ns < self.bounds[0]):
            return
        with self._range_lock:  # two threads naming a new range at once must not share an index
            i = self._range_names.setdefault(name, len(self._range_names))
            self._ranges.append((i, int(start_ns), int(end_ns), int(level)))

    # -- agent thread -----------------------------------------------------------
    def collect(self, window_id: int, guard_tokens: int = 1, pause=None, clock: str = "tokens") -> KernelWindow:
        """Pack the flushed records of the window as columns (agent thread).

        `pause()`, when given, is called after each chunk of 256 records: the agent sleeps there, so that its
        Python work, which an eager decode thread pays for in GIL time, is spread over several tokens instead
        of landing in one."""
        batches, self._batches = self._batches, []
        for acts in batches:
            for i in range(0, len(acts), _CHUNK):
                self._read(acts[i:i + _CHUNK])
                if pause is not None:
                    pause()
        kern = _rows(self._kernels, 16, pause)
        # graph kernels seen: later windows keep a guard token; none: they can do without
        self.needs_guard = bool(len(kern) and (kern[:, 13] != 0).any())
        apis = _rows(self._apis, 5, pause)
        cps = _rows(self._memcpys, 4)
        syn = _rows(self._syncs, 3)
        kcols = ["name", "start", "end", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                 "regs", "smem_static", "smem_dynamic", "stream", "graph_id", "graph_node_id", "correlation"]
        used = {}
        for cbid, dom in {(int(r[0]), int(r[4])) for r in apis}:
            table = self._drv_names if dom else self._rt_names
            used[f"{dom}:{cbid}"] = table.get(cbid, f"cbid{cbid}")
        names = _by_index(self._names)
        with self._range_lock:
            taken, self._ranges = self._ranges, []
            named, self._range_names = self._range_names, {}
        rng = _rows(taken, 4)
        range_names = _by_index(named)
        return KernelWindow(
            window_id=window_id,
            tokens=max(len(self.bounds) - 1 - guard_tokens, 0) if clock == "tokens" else 0,
            guard_tokens=guard_tokens,
            token_bounds_ns=Column.of(self.bounds),
            names=names,
            kernels={c_: Column.of(kern[:, j]) for j, c_ in enumerate(kcols)},
            api_names=used,
            apis={c_: Column.of(apis[:, j]) for j, c_ in enumerate(["cbid", "start", "end", "correlation", "domain"])},
            memcpys={c_: Column.of(cps[:, j]) for j, c_ in enumerate(["start", "end", "bytes", "copy_kind"])},
            syncs={c_: Column.of(syn[:, j]) for j, c_ in enumerate(["start", "end", "type"])},
            probe_host_ns=self.host_ns,
            prepare_ns=self.prepare_ns,
            apis_traced=self.apis_traced,
            clock=clock,
            nvtx_names=range_names,
            nvtx={c_: Column.of(rng[:, j]) for j, c_ in enumerate(["name", "start", "end", "level"])}
            if len(rng) else {},
        )
