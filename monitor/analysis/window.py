"""A traced window of whole tokens in, its frozen figures out: the composition of the analyzers.

    KernelWindow -> analysed_records -> TracedRecords -+-> launch_calls, count_launches      launches
                                                       +-> idle_gaps, classify_gaps         gaps
                                                       +-> kernel_table, small_grid_share   kernels
                                                       +-> collectives                      collectives
                                                       +-> window_busy_pct                  busy
                                                       +-> token_timeline                   timeline
                                                       '-> all of them -> WindowMetrics
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.monitor.analysis.busy import union_ns, window_busy_pct
from decodemon.monitor.analysis.collectives import collectives
from decodemon.monitor.analysis.gaps import classify_gaps, idle_gaps
from decodemon.monitor.analysis.kernels import KernelRow, kernel_table, small_grid_share_pct
from decodemon.monitor.analysis.launches import count_launches, launch_calls, runtime_calls_for
from decodemon.monitor.analysis.names import range_name
from decodemon.monitor.analysis.records import analysed_records, api_row_names
from decodemon.monitor.analysis.timeline import Timeline, token_timeline, with_nvtx
from decodemon.probes import wire


@dataclass(frozen=True)
class WindowMetrics:
    """Everything one traced window says."""

    window_id: int
    tokens: int
    traced_ms_per_token: float
    kernels_per_token: float
    graph_launches_per_token: float
    kernel_launch_calls_per_token: float
    memcpys_per_token: float
    kernel_sum_ms_per_token: float
    gpu_busy_pct: float
    gap_ms_per_token: dict
    kernels: tuple[KernelRow, ...]
    collective_calls_per_token: float
    collective_us_per_call: float
    collective_ms_per_token: float
    small_grid_share_pct: float
    timeline: Timeline | None
    dropped_records: int
    tracing_head_ms: float = 0.0  # graph windows: time the traced graph launch held the GPU back
    # a collective's own latency: per NCCL kernel name, the median of the calls that did not wait for a peer
    # (analysis.collectives)
    collective_us_unwaited: float = 0.0
    # device idle a collective adds around its kernel beyond the window's usual kernel-to-kernel gap (median per
    # call; gaps the host caused are LAUNCH's, not counted)
    collective_gap_us: float = 0.0
    # what the window cost the decode thread in the probe's own calls (CUPTI's start-up in open, close, flush,
    # finalize), and the tokens it traced beyond the analysed ones (a graph process's guard)
    probe_host_ms: float = 0.0
    prepare_ms: float = 0.0  # CUPTI's start-up on the agent thread before the window (0: made in open, or older)
    guard_tokens: int = 0
    # False: the window traced kernels only (Attach.api_every): no CPU lane, no runtime count, and idle longer
    # than a short gap is "unsplit" (its host part needs the launch calls)
    apis_traced: bool = True
    # the kernel launch calls the runtime API made (None: its calls not traced); kernel_launch_calls_per_token
    # counts the host's, runtime and driver alike, from the kernels' correlation ids
    runtime_launch_calls_per_token: float | None = None
    # NVTX ranges pushed from Python in the window: (name, calls a token, mean µs a call, nesting level), the
    # most time first (nvtx_table)
    nvtx: tuple = ()
    # the GPU time the kernels cover a token: their union over the analysed tokens, kernels that run at once (two
    # streams) counted once; kernel_sum_ms_per_token adds each kernel's own time (None: an older window)
    kernel_busy_ms_per_token: float | None = None

    @property
    def collective_kernel_us(self) -> float:
        """One collective's kernel when it did not wait for a peer (the mean where that is not known)."""
        return self.collective_us_unwaited or self.collective_us_per_call

    @property
    def collective_wait_ms_per_token(self) -> float:
        """The collective kernels' time beyond their own latency: waiting for a late peer."""
        own_ms = self.collective_calls_per_token * self.collective_kernel_us / 1e3
        return max(0.0, self.collective_ms_per_token - own_ms)

    @property
    def collective_in_step_us(self) -> float:
        """What one collective costs the step: its kernel (not waiting for a peer) plus the idle it adds."""
        return self.collective_kernel_us + self.collective_gap_us


def launched_per_token(w: wire.KernelWindow) -> float:
    """Kernels launched in a window of whole tokens, per token, wherever the GPU ran them.

    CUPTI records the kernels launched while a window is open. A host that runs a few steps ahead of the GPU
    launches a token's kernels inside its marks, but they run after them, so counting the kernels that *ran*
    inside the analysed tokens misses most of them (transformers' static-cache generate() on the H200: 130 of
    torch.profiler's 553 a token); counting what was launched over the traced tokens, the guard included, does
    not. For a loop that syncs per token the two counts are the same. Windows by time: 0 (their steps say it)."""
    if getattr(w, "clock", "tokens") != "tokens" or w.tokens <= 0 or "start" not in w.kernels:
        return 0.0
    return len(w.kernels["start"].array()) / (w.tokens + w.guard_tokens)


def launched_by_calls(w: wire.KernelWindow, rec) -> float | None:
    """The kernels that the calls the host made inside the analysed tokens launched, per token, by correlation id,
    wherever the GPU ran them: a host running ahead makes a token's calls inside its marks and their kernels run
    after them, and a guard token's calls (llama.cpp's: eager launches after a graphed token) are not the tokens'.
    Kernels whose call the window did not trace (a library's, through the driver) count where they ran (`rec`).
    None where the window traced no calls, or its kernels carry no ids (launched_per_token counts then)."""
    span = w.analysed_span() if getattr(w, "clock", "tokens") == "tokens" else None
    api, k = w.apis, w.kernels
    if (span is None or not getattr(w, "apis_traced", True) or "correlation" not in api or "start" not in api
            or "correlation" not in k):
        return None
    acorr, astart, kcorr = api["correlation"].array(), api["start"].array(), k["correlation"].array()
    if not len(acorr) or not len(kcorr) or (kcorr == 0).any():
        return None
    n = int(np.isin(kcorr, acorr[(astart >= span[0]) & (astart < span[1])]).sum())
    ran = rec.kernels.get("correlation")
    untraced = int((~np.isin(ran, acorr)).sum()) if ran is not None else 0  # their calls not in the window
    return (n + untraced) / w.tokens if n else None


def runtime_launches_per_token(w: wire.KernelWindow, rec) -> float | None:
    """The runtime's kernel launch calls a token that launched the analysed tokens' own kernels, matched by
    correlation id, never by when the host made them: a host running ahead makes a step's calls a few steps before
    its kernels run, so the calls made while a step runs on the GPU are other tokens' (None: calls not traced, or
    kernels without ids, where the calls begun inside the tokens are counted)."""
    corr = rec.kernels.get("correlation")
    if not rec.apis_traced or corr is None or len(corr) != len(rec.start_ns) or (corr == 0).any():
        return None
    gid = rec.kernels.get("graph_id", np.zeros(len(corr), np.int64))
    api = {c: v.array() for c, v in w.apis.items()}
    n = runtime_calls_for(api_row_names(w, api), api, np.unique(corr[gid == 0]))
    return n / rec.tokens if n is not None else None


def nvtx_table(w: wire.KernelWindow, tokens: int) -> tuple:
    """The window's NVTX ranges by name: (name, calls a token, mean µs a call, level), the most time first. Only
    the ranges that ended inside the analysed tokens count (a graph window's guard token is left out)."""
    cols = getattr(w, "nvtx", None) or {}
    if "name" not in cols or not len(cols["name"].array()):
        return ()
    keep = np.ones(len(cols["name"].array()), bool)
    span = w.analysed_span() if getattr(w, "clock", "tokens") == "tokens" else None
    if span is not None:
        keep = cols["end"].array() <= span[1]
    idx, lv = cols["name"].array()[keep], cols["level"].array()[keep]
    dur = (cols["end"].array()[keep] - cols["start"].array()[keep]) / 1e3
    out = []
    for i in sorted(set(idx.tolist())):
        sel = idx == i
        name = range_name(w, i)
        out.append((name, int(sel.sum()) / max(tokens, 1), float(dur[sel].mean()), int(lv[sel].min()),
                    float(dur[sel].sum())))
    out.sort(key=lambda r: -r[4])
    return tuple(r[:4] for r in out)


def window_metrics(w: wire.KernelWindow, sm_count: int, cc: str = "9.0") -> WindowMetrics:
    """Reduce one traced window to per-token figures, gap causes and the per-kernel grid table."""
    rec = analysed_records(w)
    calls = launch_calls(rec)
    launches = count_launches(rec, calls)
    idle = idle_gaps(rec, calls)
    gaps = classify_gaps(idle, launches.graph_launches, rec.apis_traced)
    rows = kernel_table(rec, sm_count, cc)
    coll = collectives(rec, rows, idle)
    tokens = rec.tokens
    runtime = runtime_launches_per_token(w, rec)
    if runtime is None and launches.runtime_launch_calls is not None:
        runtime = launches.runtime_launch_calls / tokens
    return WindowMetrics(
        window_id=w.window_id, tokens=tokens, traced_ms_per_token=rec.wall_ns / tokens / 1e6,
        kernels_per_token=(by_calls if (by_calls := launched_by_calls(w, rec)) is not None
                           else max(launches.kernels / tokens, launched_per_token(w))),
        graph_launches_per_token=launches.graph_launches / tokens,
        kernel_launch_calls_per_token=launches.kernel_launch_calls / tokens, runtime_launch_calls_per_token=runtime,
        memcpys_per_token=launches.memcpys / tokens,
        kernel_sum_ms_per_token=int(rec.duration_ns.sum()) / tokens / 1e6,
        kernel_busy_ms_per_token=union_ns(rec.start_ns, rec.end_ns) / tokens / 1e6,
        gpu_busy_pct=window_busy_pct(rec, gaps.tracing_head_ns),
        gap_ms_per_token=gaps.ms_per_token(tokens), kernels=rows,
        collective_calls_per_token=coll.calls_per_token, collective_us_per_call=coll.us_per_call,
        collective_ms_per_token=coll.ms_per_token, small_grid_share_pct=small_grid_share_pct(rows),
        timeline=with_nvtx(token_timeline(rec, calls, launches.graph_launches), w),
        tracing_head_ms=gaps.tracing_head_ns / 1e6,
        collective_gap_us=coll.gap_us, collective_us_unwaited=coll.us_unwaited,
        dropped_records=w.dropped_records + rec.dropped_kernels,
        probe_host_ms=w.probe_host_ns / 1e6, prepare_ms=w.prepare_ns / 1e6, guard_tokens=int(w.guard_tokens),
        apis_traced=rec.apis_traced, nvtx=nvtx_table(w, tokens),
    )
