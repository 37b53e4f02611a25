"""Token boundaries on the GPU's timeline, found in a traced window's kernels.

A token ends where the GPU finishes one step's work, not where the host enqueued it. A loop whose host runs
ahead of the GPU (graph replay, async scheduling) marks tokens ~100 ms before their kernels run, and a loop that
marks nothing has no host clock at all. Both still repeat one step's kernels, so the step can be read off the
kernel stream itself, best clock first:

    graph replays     one (or k) graph launch per step: each launch's kernels share its correlation id
    kernel period     the period of the kernel-name sequence (any engine, any language)

           step k                     step k+1                   step k+2
    GPU  |a b c d ... a' z|  idle  |a b c d ... a' z|  idle  |a b c d ...
         ^ boundary                ^ boundary (the same name, p kernels later)

A boundary sits before the kernel that follows the largest idle gap of the first period (where a loop that
syncs per token waits for the host), then every p kernels. Whole steps between two boundaries are analysed;
the partial steps at the window's edges are not. ms/token is start-to-start of consecutive steps, so a step's
idle time is part of it.

Pure: arrays in, frozen values out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.probes import wire

MARK_BURSTS = "mark_bursts"  # the token clock over whole bursts of marks made ahead of the GPU (rates.burst_stats)
STEP_STARTS = "step_starts"  # the step starts the agent timed in an eager loop that marks nothing (step_starts.py)
# GPU ms a step in the traced windows over the starts' ms a step: within this, one start a step (an eager loop's
# speed moves ±15-40% between stretches of seconds; two lookups a step would read 2)
STARTS_AGREE = (0.6, 1.6)
PROVISIONAL_STEPS = 100  # a rate from fewer steps than this is provisional

# the clocks that are not the engine's own marks taken one by one, and why the figures come from them (one line)
CLOCK_NOTES = {
    MARK_BURSTS: "marks come in bursts (the host runs ahead of the GPU): ms/token is over whole bursts, from the "
                 "first mark after each wait for the GPU",
    "graph replays": "marks missing or made ahead of the GPU: ms/token is the GPU's own step in the traced windows, "
                     "and tokens counts those steps alone, not every token the loop made",
    "kernel period": "marks missing or made ahead of the GPU: ms/token is the GPU's own step in the traced windows, "
                     "and tokens counts those steps alone, not every token the loop made",
    "replay_count": "no marks: ms/token is the CUDA graph replays the agent counted",
    STEP_STARTS: "no marks: ms/token is the steps the agent timed at their embedding lookups over the whole span, "
                 "held against the GPU's steps in the traced windows",
}

# the clocks whose ms/token is their intervals' seconds over the steps in them (tokens.interval_stats), a mean: a
# server's own count read at intervals, whole bursts of marks, the graph replays the agent counted
MEAN_CLOCKS = frozenset({"server_metrics", MARK_BURSTS, "replay_count"})
# the clocks read off the GPU's own steps in the traced windows (gpu_step_clock): they time no step outside a window
GPU_STEP_CLOCKS = frozenset({"graph replays", "kernel period"})


def clock_kind(token_clock: str | None) -> str:
    """What a clock's ms/token is: a counted clock's seconds over its steps (a mean), else the median mark."""
    return "mean" if token_clock in MEAN_CLOCKS else "median"

MIN_PERIOD = 4  # kernels: shorter repeats are elementwise chains, not steps
MATCH_SHARE = 0.9  # of kernels equal to the kernel one period later
ANCHORS = 48  # the rarest names tried as period anchors


@dataclass(frozen=True)
class GpuSteps:
    """Whole GPU steps found in one traced window."""

    clock: str  # "graph replays" or "kernel period"
    period_kernels: int  # kernels per step
    bounds_ns: tuple[int, ...]  # start of each whole step, and the end of the last (CUPTI clock)
    first_kernel: int  # index (in start order) of the first kernel of the first whole step
    graph_launches_per_step: float

    @property
    def steps(self) -> int:
        """Whole steps between the bounds."""
        return max(len(self.bounds_ns) - 1, 0)

    @property
    def step_ms(self) -> float:
        """Median GPU step, start to start (ms)."""
        return float(np.median(np.diff(np.asarray(self.bounds_ns, dtype=np.int64)))) / 1e6


def match_share(ids: np.ndarray, period: int) -> float:
    """Share of kernels whose name equals the name `period` kernels later."""
    if period <= 0 or period >= len(ids):
        return 0.0
    return float(np.mean(ids[:-period] == ids[period:]))


def kernel_period(ids: np.ndarray, min_period: int = MIN_PERIOD) -> int | None:
    """The step's length in kernels: the shortest evenly spaced repeat of a rare name that the whole sequence
    follows (≥ MATCH_SHARE of kernels equal to the one a period later); None if nothing repeats."""
    ids = np.asarray(ids)
    if len(ids) < 2 * min_period:
        return None
    names, counts = np.unique(ids, return_counts=True)
    order = np.argsort(counts, kind="stable")
    candidates: set[int] = set()
    for j in order[:ANCHORS]:
        if counts[j] < 2:
            continue
        gaps = np.diff(np.flatnonzero(ids == names[j]))
        p = int(np.median(gaps))
        if p >= min_period and np.mean(np.abs(gaps - p) <= max(1, p // 50)) >= 0.8:
            candidates.add(p)
    shares = {p: match_share(ids, p) for p in candidates}
    good = {p: sh for p, sh in shares.items() if sh >= MATCH_SHARE}
    if not good:
        return None
    # a layer repeats almost as well as the step does; the step repeats best, and so do its multiples: the
    # shortest of the best
    top = max(good.values())
    return min(p for p, sh in good.items() if sh >= top - 0.002)


def _phase(start: np.ndarray, end: np.ndarray, period: int) -> int:
    """Index of the kernel after the largest idle gap within the first period: where a step begins."""
    span = min(period, len(start) - 1)
    if span < 1:
        return 0
    gaps = start[1:span + 1] - np.maximum.accumulate(end[:span])
    return int(np.argmax(gaps)) + 1 if gaps.max() > 0 else 0


def _graph_launches(graph_id: np.ndarray, corr: np.ndarray, lo: int, hi: int) -> int:
    inside = graph_id[lo:hi] != 0
    return int(len(np.unique(corr[lo:hi][inside])))


def gpu_steps(w: wire.KernelWindow) -> GpuSteps | None:
    """Whole steps in a window's kernels by the best clock they support; None if they do not repeat."""
    k = w.kernels
    if not k or "start" not in k:
        return None
    start = k["start"].array().astype(np.int64)
    order = np.argsort(start, kind="stable")
    start, end = start[order], k["end"].array().astype(np.int64)[order]
    ids = k["name"].array()[order]
    graph_id = k["graph_id"].array()[order] if "graph_id" in k else np.zeros(len(start), np.int64)
    corr = k["correlation"].array()[order] if "correlation" in k else np.arange(len(start))
    period = kernel_period(ids)
    if period is None:
        return None
    first = _phase(start, end, period)
    idx = list(range(first, len(start), period))  # each a step's first kernel; the last one closes a step
    if len(idx) < 2:  # two periods exactly: a window opened at a step's start
        first, idx = 0, list(range(0, len(start), period))
    if len(idx) < 2:
        return None
    bounds = [int(start[i]) for i in idx]
    launches = _graph_launches(graph_id, corr, idx[0], idx[-1])
    per_step = launches / (len(idx) - 1)
    clock = "graph replays" if launches and abs(per_step - round(per_step)) < 0.05 else "kernel period"
    return GpuSteps(clock=clock, period_kernels=period, bounds_ns=tuple(bounds), first_kernel=first,
                    graph_launches_per_step=per_step)


AHEAD_SHARE = 0.25  # under this share of a token window's kernels started inside its marks: the host marked ahead


def marks_ahead(w: wire.KernelWindow, steps: GpuSteps) -> bool:
    """Did the host mark this token window's tokens ahead of the GPU? Under AHEAD_SHARE of the kernels it traced
    started between its analysed marks: the kernels launched in the window ran after it (an H200 8B graphed loop
    whose launch queue was full: 8%; static-cache generate(): 18-19%). A loop that waits for each step starts all
    of them there, or half with a guard token. Counted by start, not by time: a collective that waits for a late
    peer runs long past the marks it started in."""
    tb = np.asarray(w.token_bounds_ns.array(), dtype=np.int64)
    k = w.kernels
    if getattr(w, "clock", "tokens") != "tokens" or w.tokens < 1 or len(tb) <= w.tokens or "start" not in k:
        return False
    start, end = k["start"].array().astype(np.int64), k["end"].array().astype(np.int64)
    start = start[(start > 0) & (end > start)]  # a record CUPTI could not complete has no times
    if not len(start):
        return False
    return float(np.mean((start >= tb[0]) & (start < tb[w.tokens]))) < AHEAD_SHARE


def reclocked(w: wire.KernelWindow, steps: GpuSteps) -> wire.KernelWindow:
    """The window with its token bounds moved to the GPU's step boundaries, so every per-token analysis reads
    whole GPU steps (and counts what ran in them: its clock becomes "time", as a window the agent timed)."""
    import msgspec

    bounds = np.asarray(steps.bounds_ns, dtype=np.int64)
    return msgspec.structs.replace(w, tokens=steps.steps, guard_tokens=0, clock="time",
                                   token_bounds_ns=wire.Column.of(bounds))
