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


def token_stats(t_ns: np.ndarray) -> TokenStats | None:
    """ms/token (median, p90, p99) and tokens/s from token boundaries; None with fewer than 3.

    Repeated boundaries (zero-length tokens) are dropped; tokens/s is over the mean token, so a slow token
    lowers it where the median would not move.
    """
    if len(t_ns) < 3:
        return None
    d = np.diff(np.asarray(t_ns, dtype=np.int64)) / 1e6
    d = d[d > 0]
    if len(d) < 2:
        return None
    med = float(np.median(d))
    return TokenStats(tokens=len(d), ms_per_token=med, ms_per_token_p90=float(np.percentile(d, 90)),
                      ms_per_token_p99=float(np.percentile(d, 99)), tokens_per_s=1e3 / float(np.mean(d)))


def counter_intervals(c: dict) -> np.ndarray:
    """Which intervals between a server's successive reads (`c`: feed.COUNT_COLS columns) the clock counts: steps
    made, requests in progress at both reads and none ended in between (an ended request's last steps were never
    seen). A server between requests makes no token, and one that reads a prompt or sends a reply makes no step:
    a rate over that time would be the client's or the prefill's, not the decode step's (llama-server's own
    figures leave it out the same way)."""
    b, e = np.asarray(c["busy"], np.float64), np.asarray(c["ended"], np.float64)
    dt, ds = np.diff(np.asarray(c["t_ns"], np.float64)), np.diff(np.asarray(c["steps"], np.float64))
    return (b[:-1] > 0) & (b[1:] > 0) & (e[1:] == 0) & (dt > 0) & (ds > 0) & np.isfinite(ds)


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
    per = dt[ok] / ds[ok]
    ms = float(dt[ok].sum() / ds[ok].sum())
    return TokenStats(tokens=int(ds[ok].sum()), ms_per_token=ms, ms_per_token_p90=float(np.percentile(per, 90)),
                      ms_per_token_p99=float(np.percentile(per, 99)), tokens_per_s=1e3 / ms)


def counter_throughput(c: dict) -> float | None:
    """Every request's tokens a second over the intervals the clock counts (a server batching several requests
    makes that many tokens a step); None without them."""
    if len(c["t_ns"]) < 3:
        return None
    ok = counter_intervals(c)
    dt = np.diff(np.asarray(c["t_ns"], np.float64))[ok].sum() / 1e9
    return float(np.diff(np.asarray(c["tokens"], np.float64))[ok].sum() / dt) if dt > 0 else None


REPLAY_PAUSE_NS = 400_000_000  # rows this far apart: the replays paused between them (a host that waited)
REPLAY_STEADY_ROWS = 8  # with one pause, this many rows are a steady loop that paused once, fewer a short span


def replay_stats(c: dict) -> TokenStats | None:
    """The figures from the CUDA graph replays the agent counted (`c`: feed.COUNT_COLS columns; each row the time
    of a ship's first replay and the steps counted before it). A host that runs ahead enqueues a burst of steps,
    then waits for the GPU to finish them: the rows that follow a pause start a burst, where the GPU has caught
    up, so ms a step is taken between them, over whole bursts. A loop that replays steadily has no pause, and
    every row counts. p90 and p99 are over the intervals' own ms a step. None with fewer than 3 rows."""
    t, st = np.asarray(c["t_ns"], np.float64), np.asarray(c["steps"], np.float64)
    if len(t) < 3:
        return None
    after_pause = np.flatnonzero(np.diff(t) > REPLAY_PAUSE_NS) + 1
    if len(after_pause) == 1 and len(t) < REPLAY_STEADY_ROWS:
        return None  # one burst's start seen, not two: no whole burst to time yet
    idx = after_pause if len(after_pause) >= 2 else np.arange(len(t))
    dt, ds = np.diff(t[idx]) / 1e6, np.diff(st[idx])
    ok = (dt > 0) & (ds > 0)
    if not ok.any():
        return None
    per = dt[ok] / ds[ok]
    ms = float(dt[ok].sum() / ds[ok].sum())
    return TokenStats(tokens=int(ds[ok].sum()), ms_per_token=ms, ms_per_token_p90=float(np.percentile(per, 90)),
                      ms_per_token_p99=float(np.percentile(per, 99)), tokens_per_s=1e3 / ms)
