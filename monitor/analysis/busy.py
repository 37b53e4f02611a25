"""GPU busy from the traced kernels: the union of their intervals over a span, and against PM's counter.

    kernels   [----]  [--]
                 [-----]      [---]
    union     [###########]  [###]      busy = the union's length; overlaps count once
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.monitor.analysis.records import TracedRecords
from decodemon.probes import wire


def segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as sorted, disjoint (start, end) segments."""
    if len(starts) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    o = np.argsort(starts, kind="stable")
    s, e = starts[o], ends[o]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.append(run_end[idx[1:] - 1], run_end[-1])


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """The length of the union of intervals (ns)."""
    seg_s, seg_e = segments(starts, ends)
    return int((seg_e - seg_s).sum())


def window_busy_pct(rec: TracedRecords, tracing_head_ns: int) -> float:
    """GPU busy (%) over the analysed tokens from the kernels' union, a graphed window's tracing head left out."""
    return 100.0 * union_ns(rec.start_ns, rec.end_ns) / max(rec.wall_ns - tracing_head_ns, 1)


def busy_within(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each interval [a_i, b_i]: the share (%) of it covered by at least one of the kernels (starts, ends)."""
    seg_s, seg_e = segments(np.asarray(starts, np.float64), np.asarray(ends, np.float64))
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    out = np.zeros(len(a))
    if not len(seg_s):
        return out
    cum = np.concatenate([[0.0], np.cumsum(seg_e - seg_s)])

    def covered_until(t):  # busy time from the first segment's start to t
        i = np.searchsorted(seg_s, t, side="right")  # segments that started by t
        full = cum[np.maximum(i - 1, 0)]
        last = np.where(i > 0, np.clip(t - seg_s[np.maximum(i - 1, 0)], 0, (seg_e - seg_s)[np.maximum(i - 1, 0)]), 0)
        return np.where(i > 0, full + last, 0.0)

    width = np.maximum(b - a, 1.0)
    return 100.0 * (covered_until(b) - covered_until(a)) / width


@dataclass(frozen=True)
class PmWindowCheck:
    """GPU busy over the same PM samples, two ways: PM's counter, and the traced window's kernel union."""

    samples: int
    pm_busy_pct: float
    traced_busy_pct: float


def pm_window_check(w: wire.KernelWindow, t0: np.ndarray, t1: np.ndarray, pm_busy: np.ndarray) -> PmWindowCheck | None:
    """Set PM's GPU busy beside the window's own kernel records over the same time: the PM samples (t0, t1 in
    CUPTI's clock, as the window's) that lie wholly inside the window's analysed tokens, each sample's busy share
    from the traced kernels over exactly its interval. The head of a graphed window (a traced cudaGraphLaunch
    stretched by CUPTI instrumenting every node, GPU idle) is left out, as in the window's own GPU busy figure."""
    span = w.analysed_span()
    if span is None:
        return None
    lo, hi = span
    ks, ke = w.kernels["start"].array(), w.kernels["end"].array()
    inside = (ks >= lo) & (ke <= hi) & (ke >= ks)
    ks, ke = ks[inside], ke[inside]
    if not len(ks):
        return None
    gid = w.kernels["graph_id"].array()[inside] if "graph_id" in w.kernels else np.zeros(0)
    if len(gid) and (gid != 0).any():
        lo = int(ks.min())
    t0, t1, pm_busy = (np.asarray(x, np.float64) for x in (t0, t1, pm_busy))
    m = (t0 >= lo) & (t1 <= hi) & (t1 > t0) & np.isfinite(pm_busy)
    if not m.any():
        return None
    traced = busy_within(ks, ke, t0[m], t1[m])
    return PmWindowCheck(samples=int(m.sum()), pm_busy_pct=float(pm_busy[m].mean()),
                         traced_busy_pct=float(traced.mean()))
