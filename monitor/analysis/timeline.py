"""One token drawn as intervals: the host's launch calls over the GPU's kernels.

    token_ns  |<------------------------- last analysed token ------------------------->|
    cpu       |=|  |=|  |=|        |=|                     launch calls of the counted layer
    gpu          [k]  [k]  [k]        [k]   [k]           kernels that started in the token
    nvtx      [======== decode_step ========]               NVTX ranges pushed from Python, clipped to it

The last analysed token is drawn. A graphed window's token is drawn from its first kernel: before it, the
traced cudaGraphLaunch held the GPU back (the tracer's head, not the engine's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.monitor.analysis.launches import LaunchCalls
from decodemon.monitor.analysis.names import range_name
from decodemon.monitor.analysis.records import TracedRecords


@dataclass(frozen=True)
class Timeline:
    """One token drawn as intervals relative to its start (ns): CPU launch calls over GPU kernels."""

    token_ns: int
    cpu: np.ndarray  # (n, 2) int64: start, end of each host launch call
    gpu: np.ndarray  # (n, 2) int64: start, end of each kernel
    start_ns: int = 0  # where the token is drawn from (CUPTI ns)
    nvtx: tuple = ()  # (name, start, end) of the NVTX ranges that overlap it, relative to its start, clipped


def with_nvtx(tl: "Timeline | None", w) -> "Timeline | None":
    """`tl` with the window's NVTX ranges that overlap its token (wire.KernelWindow.nvtx), outermost first."""
    cols = getattr(w, "nvtx", None) or {}
    if tl is None or "start" not in cols or not len(cols["start"].array()):
        return tl
    t0, t1 = tl.start_ns, tl.start_ns + tl.token_ns
    a, b = cols["start"].array(), cols["end"].array()
    idx, lv = cols["name"].array(), cols["level"].array()
    keep = np.flatnonzero((b > t0) & (a < t1))
    keep = keep[np.lexsort((a[keep], lv[keep]))]
    rows = tuple((range_name(w, int(idx[i])), max(0, int(a[i]) - t0), min(tl.token_ns, int(b[i]) - t0)) for i in keep)
    return Timeline(token_ns=tl.token_ns, cpu=tl.cpu, gpu=tl.gpu, start_ns=tl.start_ns, nvtx=rows)


def token_timeline(rec: TracedRecords, calls: LaunchCalls, graph_launches: int) -> Timeline | None:
    """The last analysed token's launch calls and kernels; None when the window has no token boundaries."""
    nb = rec.whole_tokens
    if not nb:
        return None
    start, end = rec.start_ns, rec.end_ns
    t0, t1 = int(rec.bounds_ns[nb - 1]), int(rec.bounds_ns[nb])
    km = (start >= t0) & (start < t1)
    if graph_launches and km.any():
        t0 = int(start[km].min())
    a_start = rec.apis.get("start", np.zeros(0, np.int64))
    a_end = rec.apis.get("end", np.zeros(0, np.int64))
    am = (a_start >= t0) & (a_start < t1) & calls.counted
    return Timeline(
        token_ns=t1 - t0,
        cpu=np.stack([a_start[am] - t0, a_end[am] - t0], axis=1),
        gpu=np.stack([start[km] - t0, end[km] - t0], axis=1),
        start_ns=t0,
    )
