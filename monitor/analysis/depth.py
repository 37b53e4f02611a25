"""The diagnosis per context depth: ms/token, kernels/token, bytes/token and the verdict for each depth band.

The mix that binds a token moves with depth: near an empty KV cache the weights dominate the bytes read, deep in
a long generation the attention's reduction over the cache does (and a kernel with one block per head leaves the
GPU underfilled however deep it goes). One profile at one depth is a diagnosis of that depth only, so the token
marks' depth splits the session into bands by powers of two (0-63, 64-127, 128-255, ...) and each band gets its
own figures and verdict.

    token marks (t_ns, rx_ns, depth) --> band per mark --> ms/token per band (steps of one position only)
    traced windows (rx_ns, metrics)  --> band of the mark before the window --> launches, kernel time per band
    model facts                      --> bytes/token at the band's median depth
    the session's Inputs             --> the same Inputs with the band's figures --> diagnose --> verdict

Pure: arrays and frozen values in, frozen values out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from decodemon.monitor import diagnosis as dx

SHALLOW_BAND_TOP = 63  # the first band holds every depth below 64


@dataclass(frozen=True)
class DepthBand:
    """One depth band's figures and the ceiling that binds there."""

    lo: int  # lowest depth in the band (inclusive)
    hi: int  # highest depth in the band (inclusive)
    tokens: int  # token steps measured inside the band
    depth_median: int
    ms_per_token: float | None
    kernels_per_token: float | None
    bytes_per_token: float | None
    kernel_sum_ms_per_token: float | None
    windows: int  # traced windows that fell in the band
    verdict: str
    kernel_busy_ms_per_token: float | None = None  # the kernels' union: those that run at once counted once

    @property
    def label(self) -> str:
        """'256-511'."""
        return f"{self.lo}-{self.hi}"

    def as_json(self) -> dict:
        """The band as plain JSON values."""
        r = (lambda x, nd: None if x is None else round(float(x), nd))
        return {"depth_band": self.label, "lo": self.lo, "hi": self.hi, "tokens": self.tokens,
                "depth_median": self.depth_median, "ms_per_token": r(self.ms_per_token, 4),
                "kernels_per_token": r(self.kernels_per_token, 1), "bytes_per_token": r(self.bytes_per_token, 0),
                "kernel_sum_ms_per_token": r(self.kernel_sum_ms_per_token, 4),
                "kernel_busy_ms_per_token": r(self.kernel_busy_ms_per_token, 4), "windows": self.windows,
                "verdict": self.verdict}


def band_of(depth: int) -> tuple[int, int]:
    """The power-of-two band (lo, hi) holding `depth`: 0-63, 64-127, 128-255, ..."""
    d = max(int(depth), 0)
    if d <= SHALLOW_BAND_TOP:
        return (0, SHALLOW_BAND_TOP)
    lo = 1 << (d.bit_length() - 1)
    return (lo, 2 * lo - 1)


def _band_lo(depths: np.ndarray) -> np.ndarray:
    """band_of(d)[0] for each depth, vectorised."""
    d = np.maximum(depths.astype(np.int64), 0)
    lo = np.left_shift(1, np.floor(np.log2(np.maximum(d, 1))).astype(np.int64))
    return np.where(d <= SHALLOW_BAND_TOP, 0, lo)


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def depth_bands(t_ns: np.ndarray, rx_ns: np.ndarray, depth: np.ndarray, windows=(), model=None,
                base: dx.Inputs | None = None, min_tokens: int = 2) -> tuple[DepthBand, ...]:
    """The bands the marks visited, shallow first, each with its figures and verdict.

    `t_ns`, `rx_ns`, `depth`: the token marks (engine clock, arrival, context depth), in arrival order.
    `windows`: (rx_ns, WindowMetrics) pairs; a window belongs to the band of the last mark that arrived before it.
    `model`: wire.ModelFacts (bytes/token at the band's median depth), or None.
    `base`: the session's diagnosis inputs; each band replaces the figures it measured itself and keeps the rest
    (bandwidth, collectives, GPU busy, grids). A band with fewer than `min_tokens` steps is left out.
    A token's time counts only when its depth is one past the previous mark's: a cache reset or a new request
    starts a new run of depths, and the time across it is not a decode step at either depth.
    """
    t, rx, d = (np.asarray(a, dtype=np.int64) for a in (t_ns, rx_ns, depth))
    n = min(len(t), len(rx), len(d))
    t, rx, d = t[:n], rx[:n], d[:n]
    if n < 2:
        return ()
    step = np.diff(d) == 1
    dt_ms = np.diff(t)[step] / 1e6
    step_lo = _band_lo(d[1:][step])
    mark_lo = _band_lo(d)
    win_lo: dict[int, list] = {}
    for wrx, m in windows:
        i = int(np.searchsorted(rx, wrx, side="right")) - 1
        if i >= 0:
            win_lo.setdefault(int(mark_lo[i]), []).append(m)
    out = []
    for lo in sorted(set(step_lo.tolist())):
        sel = dt_ms[step_lo == lo]
        if len(sel) < min_tokens:
            continue
        hi = band_of(lo)[1]
        in_band = d[(d >= lo) & (d <= hi)]
        dmed = int(np.median(in_band)) if len(in_band) else lo
        wins = win_lo.get(lo, [])
        out.append(_band(lo, hi, sel, dmed, wins, model, base))
    return tuple(out)


def _band(lo: int, hi: int, dt_ms: np.ndarray, dmed: int, wins: list, model, base: dx.Inputs | None) -> DepthBand:
    """One band's figures, and its verdict through the same diagnosis as the whole session's."""
    ms = float(np.median(dt_ms))
    launches = _median([w.kernels_per_token for w in wins])
    ksum = _median([w.kernel_sum_ms_per_token for w in wins])
    kbusy = _median([w.kernel_busy_ms_per_token for w in wins if w.kernel_busy_ms_per_token is not None])
    bpt = float(model.bytes_per_token(dmed)) if model is not None else None
    b = base or dx.Inputs()
    busy = b.gpu_busy_pct
    own = kbusy if kbusy is not None else ksum
    if own is not None and b.sm_active_pct is None:  # no PM counters: busy is kernel time over the step
        busy = min(100.0, 100.0 * own / ms) if ms else None
    inp = replace(b, ms_per_token=ms, bytes_per_token=bpt if bpt is not None else b.bytes_per_token,
                  kernels_per_token=launches if launches is not None else b.kernels_per_token,
                  kernel_sum_ms_per_token=ksum if ksum is not None else b.kernel_sum_ms_per_token,
                  kernel_busy_ms_per_token=kbusy if ksum is not None else b.kernel_busy_ms_per_token,
                  gpu_busy_pct=busy,
                  small_grid_share_pct=(_median([w.small_grid_share_pct for w in wins]) if wins
                                        else b.small_grid_share_pct))
    verdict = dx.diagnose(inp).ceiling
    return DepthBand(lo=lo, hi=hi, tokens=int(len(dt_ms)), depth_median=dmed, ms_per_token=ms,
                     kernels_per_token=inp.kernels_per_token, bytes_per_token=inp.bytes_per_token,
                     kernel_sum_ms_per_token=inp.kernel_sum_ms_per_token, windows=len(wins), verdict=verdict,
                     kernel_busy_ms_per_token=inp.kernel_busy_ms_per_token)


def session_depth_bands(session, snapshot=None) -> tuple[DepthBand, ...]:
    """The depth bands of a `Session` (its kept marks and windows), with its latest snapshot's inputs as the base."""
    snap = snapshot if snapshot is not None else session.snapshot()
    v = session.feed.marks.view()
    model = session.feed.hello.model if session.feed.hello else None
    return depth_bands(v[0], v[1], v[2], session.metrics, model, snap.inputs)
