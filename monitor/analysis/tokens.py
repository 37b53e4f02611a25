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


def counter_stats(t_ns, steps, busy) -> TokenStats | None:
    """The figures from a server's own step counter read at each scrape (watched from outside).

    Only the intervals with requests in progress at both scrapes and steps made in between count: a server
    between requests makes no token, and a rate over its idle time would be the client's, not the loop's.
    ms/token is those intervals' seconds over their steps; p90 and p99 are over the intervals' own ms a step (a
    scrape's resolution, not a token's). None with fewer than 2 such intervals.
    """
    t, s, b = (np.asarray(x, dtype=np.float64) for x in (t_ns, steps, busy))
    if len(t) < 3:
        return None
    dt, ds = np.diff(t) / 1e6, np.diff(s)
    ok = (b[:-1] > 0) & (b[1:] > 0) & (ds > 0) & (dt > 0) & np.isfinite(ds)
    if ok.sum() < 2:
        return None
    per = dt[ok] / ds[ok]
    ms = float(dt[ok].sum() / ds[ok].sum())
    return TokenStats(tokens=int(ds[ok].sum()), ms_per_token=ms, ms_per_token_p90=float(np.percentile(per, 90)),
                      ms_per_token_p99=float(np.percentile(per, 99)), tokens_per_s=1e3 / ms)
