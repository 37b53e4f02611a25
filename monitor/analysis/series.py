"""The recent history the app draws: GPU busy, SM active, DRAM, clocks and power, ms/token and kernels per token,
in fixed bins of the feed's receive clock (NaN where a bin holds nothing)."""

from __future__ import annotations

import numpy as np

from decodemon.monitor.analysis.tokens import counter_intervals


def _bin_means(bins: np.ndarray, vals: np.ndarray, points: int) -> tuple:
    """Mean of `vals` per bin index 0..points-1 (NaN where a bin is empty or holds a NaN)."""
    ok = (bins >= 0) & (bins < points)
    b = bins[ok].astype(np.int64)
    n = np.bincount(b, minlength=points)[:points]
    with np.errstate(invalid="ignore", divide="ignore"):
        m = np.bincount(b, weights=vals[ok], minlength=points)[:points] / n
    return tuple(float(x) if c else float("nan") for x, c in zip(m, n))


def series(f, metrics: list, rx: int, points: int = 60, step_ns: int = 500_000_000) -> dict:
    """Recent history in `step_ns` bins: GPU busy, SM active, DRAM %, ms/token, clocks, power, launches."""
    lo = rx - points * step_ns
    pm = f.pm_since(lo)
    pm_bin = (pm["rx_ns"] - lo) // step_ns
    out = {k: _bin_means(pm_bin, pm[k], points) for k in ("gpu_busy_pct", "sm_active_pct", "dram_pct")}
    recent = []  # NVML batches of the span, newest first: stop at the first older one
    for rx_n, s in reversed(f.nvml):
        if rx_n < lo:
            break
        recent.append(((rx_n - lo) // step_ns, s))
    for k in ("sm_clock_mhz", "power_w"):
        cols = [(b, getattr(s, k).array()) for b, s in recent]
        out[k] = _bin_means(np.concatenate([np.full(len(c), b) for b, c in cols] or [np.zeros(0, np.int64)]),
                            np.concatenate([c for _, c in cols] or [np.zeros(0)]).astype(np.float64), points)
    v = f.marks.since(1, lo)
    t, r = v[0], v[1]
    edges = np.searchsorted(r, lo + step_ns * np.arange(points + 1))  # marks arrive in rx order
    ms = []
    for i in range(points):
        d = np.diff(t[edges[i]:edges[i + 1]])
        ms.append(float(np.median(d)) / 1e6 if len(d) else float("nan"))
    if not len(f.marks) and len(f.counts) > 2:  # watched from outside: ms a step between reads
        c = f.counts_since(lo)
        with np.errstate(invalid="ignore", divide="ignore"):
            per = np.diff(c["t_ns"]) / 1e6 / np.diff(c["steps"])
        per[~counter_intervals(c) | ~np.isfinite(per) | (per <= 0)] = np.nan
        ms = _bin_means((c["rx_ns"][1:] - lo) // step_ns, per, points)
    out["ms_per_token"] = tuple(ms)
    out["kernels_per_token"] = tuple(m.kernels_per_token for rxw, m in metrics if rxw <= rx)[-points:]
    out["graph_launches_per_token"] = tuple(m.graph_launches_per_token for rxw, m in metrics
                                            if rxw <= rx)[-points:]
    return out
