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
