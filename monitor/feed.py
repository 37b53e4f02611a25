"""The monitor's memory of one source: frames in, bounded history kept.

The only mutable state on the analysis side. Everything that derives numbers
from it (`metrics`, `diagnosis`) is pure and takes the values it exposes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from decodemon.monitor import probe_status
from decodemon.probes import wire
from decodemon.probes.wire_check import frame_problem


class Ring:
    """The newest `cap` rows of a few numeric columns, in one preallocated numpy block.

    Memory is fixed from the start, and `view()` hands out the rows in arrival order without copying:
    the block is twice the capacity, filled left to right, and the last `cap` rows are moved to the front
    when it is full (amortised O(1) per row). On the H200 soak a deque of Python ints per mark cost the
    monitor ~6.7 MB/min and 10→16% of a core as it filled (every snapshot re-read 200k marks).
    """

    def __init__(self, cap: int, ncols: int, dtype=np.int64) -> None:
        self.cap = cap
        self._a = np.zeros((ncols, 2 * cap), dtype=dtype)
        self._lo = self._hi = 0
        self.seen = 0  # rows ever added

    def extend(self, rows: np.ndarray) -> None:
        """Append columns `rows` (shape ncols × n)."""
        n = rows.shape[1]
        self.seen += n
        if n == 0:
            return
        if n >= self.cap:
            rows, n = rows[:, -self.cap:], self.cap
            self._lo = self._hi = 0
        if self._hi + n > 2 * self.cap:
            keep = min(self._hi - self._lo, self.cap - n)
            self._a[:, :keep] = self._a[:, self._hi - keep:self._hi]  # no overlap: the source is past cap
            self._lo, self._hi = 0, keep
        self._a[:, self._hi:self._hi + n] = rows
        self._hi += n
        self._lo = max(self._lo, self._hi - self.cap)

    def view(self) -> np.ndarray:
        """All kept rows, oldest first (ncols × len); a view, valid until the next extend."""
        return self._a[:, self._lo:self._hi]

    def since(self, key_col: int, lo) -> np.ndarray:
        """Kept rows whose column `key_col` (non-decreasing) is ≥ lo."""
        v = self.view()
        return v[:, np.searchsorted(v[key_col], lo, side="left"):]

    def __len__(self) -> int:
        return self._hi - self._lo


# gpu_t0_ns / gpu_t1_ns: each sample's interval in CUPTI's clock (the traced windows' clock; float64, exact to
# ~0.3 µs at today's timestamps, against 2 ms samples)
# dram_read_bytes / dram_write_bytes: DRAM bytes over each sample's interval (NaN where the probe did not sample them)
PM_COLS = ("rx_ns", "gpu_busy_pct", "sm_active_pct", "warps_active_pct", "dram_pct", "gpu_t0_ns", "gpu_t1_ns",
           "dram_read_bytes", "dram_write_bytes")


COUNT_COLS = ("rx_ns", "t_ns", "steps", "tokens", "busy", "ended")


@dataclass
class Feed:
    """Bounded history of one source's frames (ring buffers: memory stays flat all day)."""

    max_marks: int = 200_000
    max_windows: int = 16
    max_pm: int = 20_000
    max_nvml: int = 4_000
    header: wire.RecordingHeader | None = None
    hello: wire.Hello | None = None
    marks: Ring = None  # rows: engine time ns, rx ns, depth, tokens (1, or a batched engine's step's sequences)
    batched: bool = False  # the marks are a batched engine's steps
    batch_tokens_seen: int = 0  # the tokens those marks stand for, since the start
    coll: deque = field(default_factory=deque)  # (rx_ns, tokens in frame, calls, host ns, bytes) per TokenMarks
    # a batched engine's requests' times to their first token: (rx_ns, ms) per request, the newest 20,000
    first_tokens: deque = field(default_factory=lambda: deque(maxlen=20_000))
    # the observer's steps that could slow a token: (start, end, step index into wire.OBSERVER_STEPS), marks' clock;
    # the newest 256 (a few minutes of a real attach's, where the figures need those of 5 s): every traced window
    # reads them all, and 20,000 cost each window ~13 ms
    observer: deque = field(default_factory=lambda: deque(maxlen=256))
    windows: deque = field(default_factory=deque)  # (rx_ns, KernelWindow)
    pm: Ring = None  # rows: PM_COLS
    pm_window: Ring = None  # rows: PM_COLS, the samples evaluated only for traced windows' spans (not averaged)
    nvml: deque = field(default_factory=deque)  # (rx_ns, NvmlSamples)
    counts: Ring = None  # rows: COUNT_COLS, step counts at each read (a server's, or the agent's graph replays)
    counts_source: str = ""  # whose (StepCounts.server: "llama.cpp", wire.GRAPH_REPLAYS)
    steps_seen: float = 0.0  # steps the count moved since the first read
    count_tokens_seen: float = 0.0  # tokens the count moved since the first read (a server's: every request's)
    _last_count_tokens: float | None = None
    counts_depth: int = 0  # the KV positions the decoding requests held at the last read (StepCounts.depth)
    _last_steps: float | None = None
    status: wire.ProbeStatus = field(default_factory=wire.ProbeStatus)  # the probe's status, frames merged
    state: dict = field(default_factory=dict)  # the status in words (probe_status.describe)
    _legacy_words: dict = field(default_factory=dict)  # a version-1 recording's own words, shown as recorded
    errors: list = field(default_factory=list)
    dropped_records: int = 0
    frames: int = 0
    last_rx_ns: int = 0
    bye: str | None = None
    # frames left out because they hold what no probe writes (wire_check.frame_problem), and the first few reasons
    rejected: int = 0
    rejected_why: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.marks = Ring(self.max_marks, 4, np.int64)
        self.pm = Ring(self.max_pm, len(PM_COLS), np.float64)
        self.pm_window = Ring(4_000, len(PM_COLS), np.float64)
        self.counts = Ring(20_000, len(COUNT_COLS), np.float64)

    def problem(self, frame) -> str | None:
        """Why `frame` cannot be taken: a value no probe writes, or marks that run back before those taken."""
        why = frame_problem(frame)
        if why is None and isinstance(frame, wire.TokenMarks) and len(self.marks) and len(frame.t_ns.data):
            first, last = int(frame.t_ns.array()[0]), int(self.marks.view()[0, -1])
            if first < last:  # perf_counter_ns, one clock for the whole process
                why = f"t_ns runs backwards from the marks before it (by {last - first} ns)"
        return why

    def add(self, rx_ns: int, frame) -> bool:
        """Take one frame; False (and the frame counted in `rejected`) when it holds what no probe writes."""
        why = self.problem(frame)
        if why is not None:
            self.rejected += 1
            tag = getattr(getattr(frame, "__struct_config__", None), "tag", None) or type(frame).__name__
            text = f"{tag}: {why}"
            if text not in self.rejected_why and len(self.rejected_why) < 5:
                self.rejected_why.append(text)
            return False
        self.frames += 1
        self.last_rx_ns = max(self.last_rx_ns, rx_ns)
        if isinstance(frame, wire.TokenMarks):
            t, d = frame.t_ns.array().astype(np.int64), frame.depth.array().astype(np.int64)
            b = frame.batch.array().astype(np.int64) if frame.batch is not None else None
            n = len(t)
            if b is not None:
                self.batched = True
            ones = np.ones(n, np.int64)
            self.marks.extend(np.vstack([t, np.full(n, rx_ns, np.int64), d, b if b is not None else ones]))
            self.batch_tokens_seen += int(b.sum()) if b is not None else n
            if frame.observer_ns is not None:  # only the rows the deque keeps are made into tuples
                ob = frame.observer_ns.array().astype(np.int64)[-3 * self.observer.maxlen:]
                self.observer.extend(map(tuple, ob.reshape(-1, 3).tolist()))
            if frame.first_token_ns is not None:
                ft = frame.first_token_ns.array()[-self.first_tokens.maxlen:]
                self.first_tokens.extend((rx_ns, v / 1e6) for v in ft.tolist())
            if frame.coll_calls is not None:
                self.coll.append((rx_ns, len(t), int(frame.coll_calls.array().sum()),
                                  int(frame.coll_ns.array().sum()), int(frame.coll_bytes.array().sum())))
                while len(self.coll) > 20_000:
                    self.coll.popleft()
        elif isinstance(frame, wire.KernelWindow):
            self.windows.append((rx_ns, frame))
            while len(self.windows) > self.max_windows:
                self.windows.popleft()
        elif isinstance(frame, wire.PmSamples):
            (self.pm_window if frame.window_span else self.pm).extend(pm_columns(rx_ns, frame))
        elif isinstance(frame, wire.NvmlSamples):
            self.nvml.append((rx_ns, frame))
            while len(self.nvml) > self.max_nvml:
                self.nvml.popleft()
        elif isinstance(frame, wire.StepCounts):
            cols = [frame.t_ns.array(), frame.steps.array(), frame.tokens.array(), frame.busy.array(),
                    frame.ended.array()]
            n = min(len(c) for c in cols)
            self.counts.extend(np.vstack([np.full(n, rx_ns, np.float64), *(c[:n] for c in cols)]))
            steps = cols[1][:n]
            self.counts_source = frame.server
            if frame.depth is not None and n:  # the last read with a request decoding (idle reads hold none)
                d = frame.depth.array()[:n]
                d = d[(cols[3][:n] > 0)[:len(d)]]
                if len(d):
                    self.counts_depth = int(d[-1])
            if len(steps):  # only ever up: a ring that wraps, or a server's count that starts again, takes nothing
                prev = np.concatenate([[steps[0] if self._last_steps is None else self._last_steps], steps[:-1]])
                self.steps_seen += float(np.clip(steps - prev, 0.0, None).sum())
                self._last_steps = float(steps[-1])
                toks = cols[2][:n]
                prev_t = np.concatenate([[toks[0] if self._last_count_tokens is None else self._last_count_tokens],
                                         toks[:-1]])
                self.count_tokens_seen += float(np.clip(toks - prev_t, 0.0, None).sum())
                self._last_count_tokens = float(toks[-1])
        elif isinstance(frame, wire.ProbeStatus):
            self._take_status(frame, frame.dropped_records, frame.recent_errors)
        elif isinstance(frame, wire.Stats):  # wire version 1: a dict of words, read into a ProbeStatus
            self._legacy_words.update(frame.state)
            self._take_status(probe_status.from_legacy(frame.state, frame.windows, frame.errors),
                              frame.dropped_records, frame.errors)
        elif isinstance(frame, wire.Hello):
            self.hello = frame
        elif isinstance(frame, wire.RecordingHeader):
            self.header = frame
        elif isinstance(frame, wire.Bye):
            self.bye = frame.reason
        return True

    def _take_status(self, status: wire.ProbeStatus, dropped: int, errors) -> None:
        self.status = probe_status.merge(self.status, status)
        self.state = {**probe_status.describe(self.status), **self._legacy_words}
        self.dropped_records = max(self.dropped_records, dropped)
        for e in errors:
            if e not in self.errors:
                self.errors.append(e)
        del self.errors[:-20]

    # -- views ------------------------------------------------------------------
    def token_times_ns(self, since_rx_ns: int = 0) -> np.ndarray:
        """Token boundaries (engine clock) received at or after `since_rx_ns` (a view: do not keep it)."""
        return self.marks.since(1, since_rx_ns)[0] if since_rx_ns else self.marks.view()[0]

    @property
    def tokens_seen(self) -> int:
        """Token marks received since the start (the ring keeps the newest `max_marks`)."""
        return self.marks.seen

    def tokens_since(self, since_rx_ns: int = 0) -> int | None:
        """The tokens counted in frames received at or after `since_rx_ns`: the marks (a batched engine's steps
        count the tokens each made), else the rise of a step count (a server's tokens, replays, step starts); None
        where the feed counts neither. Only what the rings still keep: a span older than them counts less."""
        if len(self.marks):
            return int(self.batch_since(since_rx_ns).sum()) if self.batched else len(self.token_times_ns(since_rx_ns))
        if not len(self.counts):
            return None
        c = self.counts_since(since_rx_ns)
        col = c["tokens"] if self.counts_source not in (wire.GRAPH_REPLAYS, wire.STEP_STARTS) else c["steps"]
        return int(np.clip(np.diff(col), 0.0, None).sum()) if len(col) > 1 else 0

    def host_collectives(self, since_rx_ns: int = 0):
        """(calls per token, µs per call, bytes per call) the engine reported since `since_rx_ns`, or None."""
        rows = [r for r in self.coll if r[0] >= since_rx_ns] or list(self.coll)[-40:]
        tokens = sum(r[1] for r in rows)
        calls = sum(r[2] for r in rows)
        if not tokens or not calls:
            return None
        return calls / tokens, sum(r[3] for r in rows) / calls / 1e3, sum(r[4] for r in rows) / calls

    def counts_since(self, since_rx_ns: int = 0) -> dict[str, np.ndarray]:
        """COUNT_COLS of the scrapes received at or after `since_rx_ns`."""
        v = self.counts.since(0, since_rx_ns)
        return {k: v[i] for i, k in enumerate(COUNT_COLS)}

    def first_token_ms(self, since_rx_ns: int = 0) -> list[float]:
        """Times to first token (ms) of the requests whose first token arrived at or after `since_rx_ns`."""
        return [ms for rx, ms in self.first_tokens if rx >= since_rx_ns]

    def batch_since(self, since_rx_ns: int = 0) -> np.ndarray:
        """Tokens per mark received at or after `since_rx_ns` (1 each, unless the engine batches)."""
        return self.marks.since(1, since_rx_ns)[3] if since_rx_ns else self.marks.view()[3]

    def depths(self, since_rx_ns: int = 0) -> np.ndarray:
        """The context depth at each token mark received at or after `since_rx_ns` (token_times_ns's order)."""
        return self.marks.since(1, since_rx_ns)[2] if since_rx_ns else self.marks.view()[2]

    def depth(self) -> int:
        """Latest context depth reported by the token clock (a server's step counts: the KV positions its decoding
        requests hold, summed)."""
        return int(self.marks.view()[2, -1]) if len(self.marks) else self.counts_depth

    def pm_since(self, since_rx_ns: int = 0) -> dict[str, np.ndarray]:
        """PM columns (PM_COLS) of the samples received at or after `since_rx_ns`."""
        v = self.pm.since(0, since_rx_ns)
        return {k: v[i] for i, k in enumerate(PM_COLS)}

    def pm_last(self, n: int) -> dict[str, np.ndarray]:
        """PM columns of the newest `n` samples."""
        v = self.pm.view()[:, -n:]
        return {k: v[i] for i, k in enumerate(PM_COLS)}

    def pm_within(self, t0_ns: int, t1_ns: int) -> dict[str, np.ndarray]:
        """PM columns of every kept sample (regular or evaluated for a window) that lies wholly inside
        [t0_ns, t1_ns] of CUPTI's clock, in time order."""
        cols = []
        for ring in (self.pm, self.pm_window):
            v = ring.view()
            a, b = v[PM_COLS.index("gpu_t0_ns")], v[PM_COLS.index("gpu_t1_ns")]
            cols.append(v[:, (a >= t0_ns) & (b <= t1_ns) & (b > a)])
        v = np.concatenate(cols, axis=1)
        v = v[:, np.argsort(v[PM_COLS.index("gpu_t0_ns")], kind="stable")]
        return {k: v[i] for i, k in enumerate(PM_COLS)}

    def latest_window(self):
        """The newest traced window, or None."""
        return self.windows[-1][1] if self.windows else None

    def sm_count(self) -> int:
        """SMs on the device (0 when unknown)."""
        return self.hello.gpu.sm_count if self.hello and self.hello.gpu else 0


def pm_columns(rx_ns: int, f: wire.PmSamples) -> np.ndarray:
    """Raw PM metric rows → PM_COLS columns: rx, GPU busy, SM active, warps active, DRAM %, sample start and end,
    DRAM bytes read and written (9 × n)."""
    m = {name: i for i, name in enumerate(f.metrics)}
    vals = f.values.array()
    if not len(f.metrics) or vals.size == 0:
        return np.zeros((len(PM_COLS), 0))
    vals = vals.reshape(-1, len(f.metrics))

    def col(name):
        i = m.get(name)
        return vals[:, i] if i is not None else np.full(len(vals), np.nan)

    elapsed = col("gr__cycles_elapsed.max")
    # GPU busy: GR compute activity (monitor/counters/sampler.py says why); recordings made before it carry the GR
    # engine's whole activity, front-end work included, and are read as they were
    busy_name = "gr__compute_cycles_active.avg" if "gr__compute_cycles_active.avg" in m else "gr__cycles_active.avg"
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.clip(100.0 * col(busy_name) / elapsed, 0, 100)
        sm = np.clip(100.0 * col("sm__cycles_active.avg") / elapsed, 0, 100)
    warps = col("sm__warps_active.avg.pct_of_peak_sustained_active")
    dram = col("dram__throughput.avg.pct_of_peak_sustained_elapsed")
    n = len(vals)
    t0, t1 = f.start_ns.array()[:n], f.end_ns.array()[:n]
    if len(t0) < n or len(t1) < n:
        t0 = t1 = np.zeros(n)
    return np.vstack([np.full(n, float(rx_ns)), busy, sm, warps, dram, t0.astype(np.float64), t1.astype(np.float64),
                      col("dram__bytes_read.sum"), col("dram__bytes_write.sum")]).astype(np.float64)
