"""Where the GPU sat idle between the analysed kernels, and why.

    CPU  |launch|  |launch|        |launch|          host API calls
    GPU      [k1]      [k2]  gap       [k3]          kernels
                  ^^^^^^  host_late: k3's launch began after k2 ended,
                          the GPU waited for the host (the launch bill)
         short:   the launch was queued in time; the gap is the device's
                  own latency between kernels (a few µs)
         other:   anything else (copies, syncs, kernels with no launch record, the token's tail)
         tracing: a graphed window's head, the traced cudaGraphLaunch held
                  back while CUPTI instruments every node (the observer's)
         unsplit: a window that traced kernels only: idle longer than a
                  short gap, whose host part needs the launch calls

The classes add up to the analysed tokens' idle time: the head before the first kernel, every gap between
overlapping runs of kernels, and the tail after the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.monitor.analysis.launches import LaunchCalls
from decodemon.monitor.analysis.records import TracedRecords

SHORT_GAP_NS = 5_000


@dataclass(frozen=True)
class IdleGaps:
    """The idle before each analysed kernel after the first, in start order, and what its launch says."""

    order: np.ndarray  # kernel rows sorted by start
    gap_ns: np.ndarray  # idle before sorted kernel i+1 after every earlier kernel ended (<= 0: none)
    launch_known: np.ndarray  # bool: that kernel's launch is known to have been queued (a traced call, or its graph's)
    host_late: np.ndarray  # bool: its launch call began only once the GPU had gone idle
    head_ns: int  # first analysed token's start to the first kernel (<= 0: none)
    tail_ns: int  # last kernel's end to the last analysed token's end (<= 0: none)


@dataclass(frozen=True)
class GapBreakdown:
    """The analysed tokens' idle time by cause, in ns over the whole window."""

    ns: dict  # class -> ns: host_late, short, other, tracing (and unsplit for a kernels-only window)
    tracing_head_ns: int  # the part of `tracing` that is a graphed window's head

    def ms_per_token(self, tokens: int) -> dict:
        """The same classes in ms per token."""
        return {k: v / tokens / 1e6 for k, v in self.ns.items()}


def idle_gaps(rec: TracedRecords, calls: LaunchCalls) -> IdleGaps | None:
    """The idle before each kernel and whether the host was late for it, and the head and tail around them (a
    token of one kernel has those alone); None with no kernel."""
    start, end = rec.start_ns, rec.end_ns
    if len(start) < 1:
        return None
    o = np.argsort(start, kind="stable")
    s, e, corr = start[o], end[o], rec.kernels["correlation"][o]
    run_end = np.maximum.accumulate(e)
    launch_start = {}
    a_corr, a_start = rec.apis.get("correlation", np.zeros(0)), rec.apis.get("start", np.zeros(0))
    sel = calls.kernel | calls.graph
    for c, st in zip(a_corr[sel].tolist(), a_start[sel].tolist()):
        launch_start[c] = st
    ls = [launch_start.get(c) for c in corr[1:].tolist()]
    known = np.array([x is not None for x in ls], dtype=bool)
    late = known & (np.array([x if x is not None else 0 for x in ls], dtype=np.int64) >= run_end[:-1])
    if not rec.apis_traced:
        # no launch calls: a kernel is known to have been queued before the GPU went idle only when it comes from
        # the same cudaGraphLaunch as the kernel before it (one call queued them all), as a full window would find
        # from that call's start
        gid = rec.kernels.get("graph_id", np.zeros(len(start), np.int64))[o]
        known = (corr[1:] == corr[:-1]) & (gid[1:] != 0)
        late = np.zeros_like(known)
    return IdleGaps(order=o, gap_ns=s[1:] - run_end[:-1], launch_known=known, host_late=late,
                    head_ns=int(s[0]) - rec.lo_ns, tail_ns=rec.hi_ns - int(run_end[-1]))


def classify_gaps(idle: IdleGaps | None, graph_launches: int, apis_traced: bool) -> GapBreakdown:
    """Sum the idle by cause; the head is the tracer's in a graphed window, the host's otherwise."""
    gaps = {"host_late": 0, "short": 0, "other": 0, "tracing": 0}
    if not apis_traced:
        gaps["unsplit"] = 0
    if idle is None:
        return GapBreakdown(ns=gaps, tracing_head_ns=0)
    for i in np.flatnonzero(idle.gap_ns > 0).tolist():
        g = int(idle.gap_ns[i])
        if idle.host_late[i]:
            gaps["host_late"] += g
        elif g <= SHORT_GAP_NS:
            gaps["short"] += g
        elif not idle.launch_known[i] and not apis_traced:
            gaps["unsplit"] += g
        else:
            gaps["other"] += g
    head_ns = 0
    if idle.head_ns > 0:
        if graph_launches:
            # a traced cudaGraphLaunch is stretched by CUPTI instrumenting every node (~µs untraced): that wait is
            # the observer's, not the engine's
            gaps["tracing"] += idle.head_ns
            head_ns = idle.head_ns
        else:
            gaps["host_late"] += idle.head_ns
    if idle.tail_ns > 0:
        gaps["other"] += idle.tail_ns
    return GapBreakdown(ns=gaps, tracing_head_ns=head_ns)
