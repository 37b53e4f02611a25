"""The token clock's figures: ms per token (median, p90, p99) and tokens per second from token boundaries."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenStats:
    """The token clock's figures over some span."""

    tokens: int
    ms_per_token: float
    ms_per_token_p90: float
    ms_per_token_p99: float
    tokens_per_s: float
    span_s: float | None = None  # the seconds from the first boundary to the last (None: a clock of intervals)


def _overlaps(t: np.ndarray, spans) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of the observer's steps `spans` ((start, end, step) rows), the range [lo, hi) of the tokens between
    the boundaries `t` that it overlaps (a token that only touches it is not in it); and the steps' kinds."""
    sp = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
    lo = np.searchsorted(t[1:], sp[:, 0], side="right")  # the first token that ends after the step starts
    hi = np.searchsorted(t[:-1], sp[:, 1], side="left")  # past the last token that starts before it ends
    return lo, hi, sp[:, 2]


def observed_tokens(t_ns: np.ndarray, spans) -> np.ndarray:
    """Which tokens (the intervals between consecutive boundaries `t_ns`, in order) overlap one of the observer's
    steps `spans` ((start, end, step) rows on the same clock): one bool a token."""
    t = np.asarray(t_ns, dtype=np.int64)
    n = max(len(t) - 1, 0)
    if n == 0 or not len(spans):
        return np.zeros(n, dtype=bool)
    lo, hi, _ = _overlaps(t, spans)
    keep = hi > lo
    edges = np.zeros(n + 1, dtype=np.int64)
    np.add.at(edges, lo[keep], 1)
    np.add.at(edges, hi[keep], -1)
    return np.cumsum(edges[:-1]) > 0


def observer_slowed(t_ns: np.ndarray, spans, names: tuple[str, ...], hit: np.ndarray | None = None) -> dict | None:
    """The tokens the observer's steps overlapped (`hit`, observed_tokens's answer, when the caller has it): how
    many, the ms they took beyond the median of the others, and which steps; None when none did (or too few
    others are left to read the loop by)."""
    t = np.asarray(t_ns, dtype=np.int64)
    hit = observed_tokens(t, spans) if hit is None else hit
    if not hit.any() or (~hit).sum() < 2:
        return None
    d = np.diff(t) / 1e6
    med = float(np.median(d[~hit]))
    lo, hi, kind = _overlaps(t, spans)
    by = sorted({names[int(k)] if 0 <= int(k) < len(names) else str(int(k)) for k in kind[hi > lo]})
    return {"tokens": int(hit.sum()), "extra_ms": round(float(np.clip(d[hit] - med, 0, None).sum()), 2), "by": by}


def token_stats(t_ns: np.ndarray, observed: np.ndarray | None = None) -> TokenStats | None:
    """ms/token (median, p90, p99) and tokens/s from token boundaries; None with fewer than 3.

    Repeated boundaries (zero-length tokens) are dropped; tokens/s is over the mean token, so a slow token
    lowers it where the median would not move. `observed` (a bool a token, `observed_tokens`) leaves out the
    tokens the observer's own steps overlapped, while at least two others remain: the loop's speed is not the
    observer's stall.
    """
    if len(t_ns) < 3:
        return None
    t = np.asarray(t_ns, dtype=np.int64)
    d = np.diff(t) / 1e6
    if observed is not None and len(observed) == len(d) and ((d > 0) & ~observed).sum() >= 2:
        d = d[~observed]
    d = d[d > 0]
    if len(d) < 2:
        return None
    med = float(np.median(d))
    return TokenStats(tokens=len(d), ms_per_token=med, ms_per_token_p90=float(np.percentile(d, 90)),
                      ms_per_token_p99=float(np.percentile(d, 99)), tokens_per_s=1e3 / float(np.mean(d)),
                      span_s=float(t[-1] - t[0]) / 1e9)


MAX_WEIGHTED_STEPS = 1_000_000  # steps the percentiles of a counted clock are taken over, at most


def interval_stats(dt_ms: np.ndarray, steps: np.ndarray) -> TokenStats:
    """The figures over intervals of a counted clock: ms/token is their time over their steps; p90 and p99 are
    over the steps, each at its interval's own ms a step (an interval with no step joins the next one that has
    one): a one-step interval weighs one step, not as much as one of two hundred."""
    ends = np.flatnonzero(steps > 0)
    n = np.diff(np.concatenate([[0.0], np.cumsum(steps)[ends]]))
    per = np.diff(np.concatenate([[0.0], np.cumsum(dt_ms)[ends]])) / n
    ms = float(dt_ms.sum() / steps.sum())
    # each step at its interval's ms, percentiles taken as token_stats takes a marked clock's (numpy's linear rule)
    w = n * min(1.0, MAX_WEIGHTED_STEPS / max(float(n.sum()), 1.0))  # a count past the cap, scaled down to it
    each = np.repeat(per, np.maximum(np.rint(w), 1).astype(np.int64))
    p90, p99 = (float(np.percentile(each, q)) for q in (90, 99))
    return TokenStats(tokens=int(steps.sum()), ms_per_token=ms, ms_per_token_p90=p90, ms_per_token_p99=p99,
                      tokens_per_s=1e3 / ms)


def counter_intervals(c: dict) -> np.ndarray:
    """Which intervals between a server's successive reads (`c`: feed.COUNT_COLS columns) the clock counts: requests
    decoding at both reads and none ended in between. A server between requests makes no token, and one that reads
    a prompt (no token of it decoded yet) or sends a reply makes no step: a rate over that time would be the
    client's or the prefill's, not the decode step's (llama-server's own figures leave it out the same way). An
    interval with requests decoding at both reads and no step in it is counted: the step took longer than the
    interval (a slow model, or a server that got no CPU), and leaving it out would read the server fast."""
    b, e = np.asarray(c["busy"], np.float64), np.asarray(c["ended"], np.float64)
    dt, ds = np.diff(np.asarray(c["t_ns"], np.float64)), np.diff(np.asarray(c["steps"], np.float64))
    return (b[:-1] > 0) & (b[1:] > 0) & (e[1:] == 0) & (dt > 0) & (ds >= 0) & np.isfinite(ds)


def counter_stats(c: dict) -> TokenStats | None:
    """The figures from a server's own step count read at intervals (watched from outside): over the intervals
    `counter_intervals` keeps, ms/token is their seconds over their steps; p90 and p99 are over the intervals' own
    ms a step (a read's resolution, not a token's). None with fewer than 2 such intervals or no step in them."""
    if len(c["t_ns"]) < 3:
        return None
    ok = counter_intervals(c)
    dt, ds = np.diff(np.asarray(c["t_ns"], np.float64)) / 1e6, np.diff(np.asarray(c["steps"], np.float64))
    if ok.sum() < 2 or ds[ok].sum() <= 0:
        return None
    return interval_stats(dt[ok], ds[ok])


def counter_throughput(c: dict) -> float | None:
    """Every request's tokens a second over the intervals the clock counts (a server batching several requests
    makes that many tokens a step); None without them."""
    if len(c["t_ns"]) < 3:
        return None
    ok = counter_intervals(c)
    dt = np.diff(np.asarray(c["t_ns"], np.float64))[ok].sum() / 1e9
    return float(np.diff(np.asarray(c["tokens"], np.float64))[ok].sum() / dt) if dt > 0 else None


REPLAY_PAUSE_NS = 400_000_000  # rows this far apart: the replays paused between them
HOST_AHEAD_BUSY_PCT = 90.0  # a GPU this busy never waits for its host: the host's pauses are waits for the GPU


def replay_stats(c: dict, gpu_busy_pct: float | None = None) -> TokenStats | None:
    """The figures from the CUDA graph replays the agent counted (`c`: feed.COUNT_COLS columns; each row the time
    of a ship's first replay and the steps counted before it). Where the replays pause, either the host ran
    ahead and waits for the GPU to finish a burst (the GPU stays busy, HOST_AHEAD_BUSY_PCT), and ms a step is
    taken between the rows that follow a pause, over whole bursts; or the host itself is idle (between
    `generate()` calls, say), and only the intervals between rows with no pause count. Without PM, runs of one
    or two rows between pauses read as bursts. p90 and p99 are over the intervals' own ms a step. None with
    fewer than 3 rows, or nothing whole to time."""
    t, st = np.asarray(c["t_ns"], np.float64), np.asarray(c["steps"], np.float64)
    if len(t) < 3:
        return None
    gap = np.diff(t) > REPLAY_PAUSE_NS
    if gap.any():
        runs = np.diff(np.flatnonzero(np.concatenate([[True], gap, [True]])))  # rows between pauses
        ahead = gpu_busy_pct >= HOST_AHEAD_BUSY_PCT if gpu_busy_pct is not None else np.median(runs) <= 2
        if ahead:
            idx = np.flatnonzero(gap) + 1  # the rows that start a burst: the GPU has caught up there
            if len(idx) < 2:
                return None  # one burst's start seen, not two: no whole burst to time yet
            dt, ds = np.diff(t[idx]) / 1e6, np.diff(st[idx])
        else:
            dt, ds = (np.diff(t) / 1e6)[~gap], np.diff(st)[~gap]
    else:
        dt, ds = np.diff(t) / 1e6, np.diff(st)
    ok = (dt > 0) & (ds > 0)
    if ok.sum() < (1 if gap.any() else 2):
        return None
    return interval_stats(dt[ok], ds[ok])


def first_token_figures(ms: list[float]) -> dict:
    """Requests' times to first token as {"requests", "median_ms", "p90_ms"} (the two None without a request)."""
    if not ms:
        return {"requests": 0, "median_ms": None, "p90_ms": None}
    return {"requests": len(ms), "median_ms": round(float(np.median(ms)), 2),
            "p90_ms": round(float(np.percentile(ms, 90)), 2)}


def batch_figures(t_ns: np.ndarray, batch: np.ndarray) -> tuple[float | None, float | None]:
    """A batched engine's steps (their times, and the tokens each made): the median tokens per step and the
    tokens a second in all, over the steps after the first; (None, None) with fewer than three."""
    if len(t_ns) < 3 or len(batch) != len(t_ns):
        return None, None
    span_s = (int(t_ns[-1]) - int(t_ns[0])) / 1e9
    made = batch[1:]
    return float(np.median(made)), (float(made.sum()) / span_s if span_s > 0 else None)
