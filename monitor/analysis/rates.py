"""Rates read off whole spans: which token clock to trust, ms/token from the GPU's own steps, DRAM bytes a second.

    marks   |||||||||||||......................|||||||||||||.....     bursts: the host enqueued ahead, then
                                                                       waited; marks are not where steps end
    GPU     [step][step][step][step][step][step][step][step][step]    steps start to start: ms/token

Pure: arrays in, numbers out.
"""

from __future__ import annotations

import numpy as np

from decodemon.monitor.analysis.tokens import HOST_AHEAD_BUSY_PCT, TokenStats, interval_stats


def marks_in_bursts(t_ns, ratio: float = 0.25, last: int = 256) -> bool:
    """Token marks that come in bursts (the median interval under `ratio` x the mean over the newest `last`):
    a host that enqueues many steps ahead, then waits for the GPU, marks at enqueue, not where steps end."""
    t = np.asarray(t_ns[-last:], dtype=np.int64)
    if len(t) < 16:
        return False
    d = np.diff(t)
    return bool(d.mean() > 0 and np.median(d) < ratio * d.mean())


BURST_PAUSE_RATIO = 10.0  # a pause between bursts: an interval over this many times the median interval


ENQUEUE_MARK_MS = 1.0  # marks this close together are enqueues: no synced step of a real model is this short
def burst_starts(t_ns) -> np.ndarray:
    """Indices of the marks that start a burst: the first after each pause, a pause being an interval over
    BURST_PAUSE_RATIO x the median and over the geometric mean of the median and the longest (a host whose launch
    queue is full enqueues at the GPU's own pace at a burst's end: an H200 8B loop marked its last ~20 steps
    5.9 ms apart, 11x its 0.5 ms enqueues, against pauses of 0.5-1 s)."""
    t = np.asarray(t_ns, dtype=np.int64)
    d = np.diff(t)
    pos = d[d > 0]
    if len(t) < 4 or not len(pos):
        return np.zeros(0, dtype=np.int64)
    med = float(np.median(pos))
    return np.flatnonzero(d > max(BURST_PAUSE_RATIO * med, float(np.sqrt(med * pos.max())))) + 1


def marks_enqueued(t_ns, gpu_busy_pct: float | None = None, depth=None) -> bool:
    """Are marks in bursts the host's enqueues, ahead of the GPU, rather than tokens of a loop that idles between
    generations (a chat loop waiting for its user, or a tiny CPU model between calls, also marks in bursts)? Not
    where the context depth falls across most pauses (a new generation); else yes where PM says the GPU never
    waited for the host (HOST_AHEAD_BUSY_PCT) or the marks come under ENQUEUE_MARK_MS apart (the median; an H200
    8B loop: 0.50-0.88 ms against its 5.9 ms steps). The caller asks only of a process with a GPU."""
    t = np.asarray(t_ns, dtype=np.int64)
    if depth is not None and len(depth) == len(t) and np.any(depth):
        starts = burst_starts(t)
        dep = np.asarray(depth, dtype=np.int64)
        if len(starts) and np.mean(dep[starts] < dep[starts - 1]) >= 0.5:
            return False
    if gpu_busy_pct is not None and gpu_busy_pct >= HOST_AHEAD_BUSY_PCT:
        return True
    d = np.diff(t)
    d = d[d > 0]
    return bool(len(d)) and float(np.median(d)) / 1e6 <= ENQUEUE_MARK_MS


SLIVER = 0.1  # a burst this small against the median burst, overlapped by the observer: its stall, not the loop


def burst_stats(t_ns, spans=()) -> TokenStats | None:
    """The figures over whole bursts of marks made ahead of the GPU: from the first mark after one pause to the
    first after the next, over the marks between. The host makes that first mark as soon as its wait for the
    GPU returns, where the GPU has finished every step enqueued before it: so burst start to burst start is
    the GPU's time for the burst's steps. p90 and p99 are over each burst's own ms a token. None with fewer
    than two pauses (no whole burst). A sliver of a burst (under SLIVER of the median burst's steps) that the
    observer's own steps overlapped (`spans`: (start, end, ...) ns) is the observer's stall, and left out."""
    t = np.asarray(t_ns, dtype=np.int64)
    starts = burst_starts(t)
    if len(starts) < 2:
        return None
    dt, ds = np.diff(t[starts]) / 1e6, np.diff(starts).astype(np.float64)
    a, b = t[starts[:-1]], t[starts[1:]]
    hit = np.zeros(len(dt), dtype=bool)
    for sp in spans:  # (start, end, ...) ns
        hit |= (a < sp[1]) & (b > sp[0])
    # a sliver of a burst the observer overlapped: its stall split a burst (a one-step burst of ~99 ms between
    # two of 200 on an H200); a whole burst it overlapped stays, as the loop ran it
    drop = hit & (ds < SLIVER * np.median(ds))
    if drop.any() and not drop.all():
        dt, ds = dt[~drop], ds[~drop]
    return interval_stats(dt, ds)


def gpu_step_stats(bounds: list, traced_busy_pct: float, pm_busy_pct: float | None,
                   dram_ratio: float | None = None) -> TokenStats | None:
    """Token figures from GPU step boundaries (each window's start-of-step times, CUPTI ns).

    A traced step is stretched by tracing: in a host-bound loop CUPTI's cost per launch lands on the host thread
    the GPU waits for, and in a replayed CUDA graph on the GPU itself (~1.6 µs a kernel on an H200). A step moves
    the same bytes traced or not, so with DRAM byte counters the untraced step is the traced one times
    `dram_ratio`, DRAM bytes a second while traced over those outside the windows (`traced_dram_ratio`).
    Without them, the untraced step is the step's busy time over PM's GPU busy outside the windows; a GPU-bound
    step (≥ 90% busy traced) is then its own figure. None when no step has a length (a window too short to hold
    two step starts apart).
    """
    steps_ms = np.concatenate([np.diff(np.asarray(b, dtype=np.int64)) / 1e6 for b in bounds] or [np.empty(0)])
    steps_ms = steps_ms[steps_ms > 0]
    if not len(steps_ms):
        return None
    med = float(np.median(steps_ms))
    scale = 1.0
    if dram_ratio is not None:
        scale = dram_ratio
    elif pm_busy_pct and traced_busy_pct < 90.0 and pm_busy_pct < traced_busy_pct:
        scale = traced_busy_pct / pm_busy_pct
    d = steps_ms * scale
    return TokenStats(tokens=len(d), ms_per_token=med * scale, ms_per_token_p90=float(np.percentile(d, 90)),
                      ms_per_token_p99=float(np.percentile(d, 99)), tokens_per_s=1e3 / float(np.mean(d)))


def dram_bytes_per_s(pm: dict) -> float | None:
    """DRAM read + write bytes a second over PM samples (feed.PM_COLS columns) that carry them; None if none do."""
    if not len(pm.get("rx_ns", ())) or "dram_read_bytes" not in pm:
        return None
    b, s, n = _bytes_and_seconds(pm, np.ones(len(pm["rx_ns"]), bool))
    return b / s if n and s > 0 else None


MIN_TRACED_SAMPLES = 5  # PM samples inside the traced steps before their DRAM rate is trusted
TRACED_RATIO_MAX = 1.05  # the traced DRAM rate over the untraced one, at most (the samples' own noise above 1)


def _bytes_and_seconds(pm: dict, keep) -> tuple[float, float, int]:
    """DRAM bytes, seconds and samples over the `keep` samples with regular intervals: a pump's first sample can
    carry a bogus start (an interval of days)."""
    b = pm["dram_read_bytes"] + pm["dram_write_bytes"]
    dt = pm["gpu_t1_ns"] - pm["gpu_t0_ns"]
    ok = keep & np.isfinite(b) & (dt > 0)
    if ok.any():
        ok &= dt <= 4 * np.median(dt[ok])
    return float(b[ok].sum()), float(dt[ok].sum()) / 1e9, int(ok.sum())


def _traced_bytes_and_seconds(traced: list[dict]) -> tuple[float, float, int]:
    """DRAM bytes, seconds and samples over the PM samples inside the traced steps (one dict of PM columns per
    window; those without DRAM byte counters add nothing)."""
    tb = ts = 0.0
    n = 0
    for pm in traced:
        if "dram_read_bytes" in pm and len(pm["rx_ns"]):
            b, s, k = _bytes_and_seconds(pm, np.ones(len(pm["rx_ns"]), bool))
            tb, ts, n = tb + b, ts + s, n + k
    return tb, ts, n


def step_bytes(traced: list[dict], bounds: list) -> float | None:
    """DRAM bytes one GPU step moves: the DRAM rate over the PM samples wholly inside the traced steps (`traced`,
    one dict of PM columns per window) times the traced step's median length. Tracing stretches a step, not the
    bytes it moves. None with fewer than MIN_TRACED_SAMPLES samples or no DRAM byte counters."""
    tb, ts, n = _traced_bytes_and_seconds(traced)
    steps = np.concatenate([np.diff(np.asarray(b, dtype=np.int64)) for b in bounds] or [np.empty(0)])
    steps = steps[steps > 0]
    if n < MIN_TRACED_SAMPLES or ts <= 0 or not len(steps):
        return None
    return tb / ts * float(np.median(steps)) / 1e9


def traced_dram_ratio(traced: list[dict], untraced: dict, spans: list[tuple[int, int]]) -> float | None:
    """DRAM bytes a second inside traced steps (`traced`: PM columns of the samples wholly inside each window's
    whole steps) over the same outside every window (`untraced`, less any sample that overlaps a `span`); None
    without DRAM byte counters or with fewer than MIN_TRACED_SAMPLES samples inside the steps."""
    if "dram_read_bytes" not in untraced or not len(untraced.get("rx_ns", ())):
        return None
    tb, ts, n = _traced_bytes_and_seconds(traced)
    a0, a1 = untraced["gpu_t0_ns"], untraced["gpu_t1_ns"]
    outside = np.ones(len(a0), bool)
    for lo, hi in spans:
        outside &= (a1 <= lo) | (a0 >= hi)
    ub, us, m = _bytes_and_seconds(untraced, outside)
    if n < MIN_TRACED_SAMPLES or m < MIN_TRACED_SAMPLES or ts <= 0 or us <= 0 or ub <= 0 or tb <= 0:
        return None
    ratio = (tb / ts) / (ub / us)
    # tracing never makes a step faster: more DRAM a second inside the windows than outside says the samples
    # outside were not the loop at work (the GPU idle, the process ending), not an untraced step
    return ratio if ratio <= TRACED_RATIO_MAX else None
