"""Per-window metrics: a traced window of whole tokens in, frozen figures out.

What a window says, in the first seed's vocabulary (§3.1, §4):

    CPU  |launch|  |launch|        |launch|          host API calls
    GPU      [k1]      [k2]  gap       [k3]          kernels
                  ^^^^^^  host_late: k3's launch began after k2 ended,
                          the GPU waited for the host (the launch bill)
         short:   the launch was queued in time; the gap is the device's
                  own latency between kernels (a few µs)
         other:   anything else (copies, syncs, kernels with no launch record)

Pure: no clock, no socket, no terminal.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.probes import wire

SHORT_GAP_NS = 5_000
SMALL_GRID_FRACTION = 0.25  # §4/§7: a hot kernel whose grid covers under 25% of the SMs


@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits that bound how many blocks can be resident."""

    max_warps: int = 64
    max_blocks: int = 32
    regs: int = 65536
    smem_bytes: int = 233472


def sm_limits(cc: str) -> SmLimits:
    """Limits for a compute capability ('9.0', '8.0', ...); Hopper's when unknown."""
    if cc.startswith("8.") and cc != "8.0":
        return SmLimits(48, 16 if cc == "8.6" else 24, 65536, 102400)
    if cc == "8.0":
        return SmLimits(64, 32, 65536, 167936)
    return SmLimits()


def blocks_per_sm(block_threads: int, regs: int, smem: int, lim: SmLimits) -> int:
    """How many blocks of this shape fit on one SM at once (the occupancy calculator's arithmetic)."""
    warps = max(1, -(-block_threads // 32))
    by_warps = lim.max_warps // warps
    by_regs = lim.max_blocks
    if regs > 0:
        regs_per_warp = -(-regs * 32 // 256) * 256
        by_regs = lim.regs // (regs_per_warp * warps)
    by_smem = lim.smem_bytes // (smem + 1024)
    return max(0, min(lim.max_blocks, by_warps, by_regs, by_smem))


@dataclass(frozen=True)
class KernelRow:
    """One kernel name's figures within a window."""

    name: str
    short_name: str
    calls_per_token: float
    us_mean: float
    us_per_token: float
    share_pct: float  # of the kernel time
    grid_blocks: int
    block_threads: int
    regs: int
    smem_bytes: int
    grid_coverage_pct: float  # min(blocks, SMs) / SMs
    waves: float
    occupancy_pct: float  # theoretical, from block size, registers and shared memory
    idle_sm_us_per_token: float  # time x idle SMs, the §4 sort key
    is_collective: bool


@dataclass(frozen=True)
class Timeline:
    """One token drawn as intervals relative to its start (ns): CPU launch calls over GPU kernels."""

    token_ns: int
    cpu: np.ndarray  # (n, 2) int64: start, end of each host launch call
    gpu: np.ndarray  # (n, 2) int64: start, end of each kernel


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
    # a collective's own latency: per NCCL kernel name, the median of the calls that did not wait for a peer (no
    # longer than twice the window's fastest call). A kernel starts when its rank arrives and ends after the last
    # rank's: the mean adds waiting for a late peer. Two H200s, eager TP=2, a window opened while the other rank was
    # traced: mean 229 µs, median 112 µs, calls that did not wait 4.9 µs (2026-11-29)
    collective_us_unwaited: float = 0.0
    # device idle a collective adds around its kernel beyond the window's usual kernel-to-kernel gap (median per
    # call; gaps the host caused are LAUNCH's, not counted). Graphed on two H200s an NCCL kernel waited 1.4-2.2 µs
    # to start where other kernels waited 0.1: a CUDA-event microbenchmark pays it too (2026-11-29)
    collective_gap_us: float = 0.0
    # what the window cost the decode thread in the probe's own calls (CUPTI's start-up in open, close, flush,
    # finalize), and the tokens it traced beyond the analysed ones (a graph process's guard)
    probe_host_ms: float = 0.0
    prepare_ms: float = 0.0  # CUPTI's start-up on the agent thread before the window (0: made in open, or older)
    guard_tokens: int = 0
    # False: the window traced kernels only (Attach.api_every): launches counted from the kernels' correlation
    # ids, no CPU lane, and idle longer than a short gap is "unsplit" (its host part needs the launch calls)
    apis_traced: bool = True

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


def _collective_gap_ns(gap, coll, device_side) -> float:
    """Median device idle a collective kernel adds before and after itself, beyond the usual gap (ns).

    `gap[i]` is the idle before sorted kernel i+1; `coll` marks collective kernels in the same order. A gap counts
    only where `device_side[i]`: the kernel's launch call was traced and began before the GPU went idle (a
    graph's, or a queue's); an untraced launch is not counted.
    """
    n = len(coll)
    if n < 3 or not coll.any():
        return 0.0
    g = np.maximum(gap, 0)
    plain = device_side & ~coll[1:] & ~coll[:-1]
    base = float(np.median(g[plain])) if plain.any() else 0.0
    added = []
    for k in np.flatnonzero(coll).tolist():
        a = 0.0
        if k >= 1 and device_side[k - 1]:
            a += max(0.0, g[k - 1] - base)
        if k < n - 1 and device_side[k]:
            a += max(0.0, g[k] - base)
        added.append(a)
    return float(np.median(added))


def demangle_head(name: str) -> str:
    """The qualified name of an Itanium-mangled symbol, templates dropped (`_ZN2at6native6kernelI...` -> at::native::kernel)."""
    if not name.startswith("_Z"):
        return name
    i = 2
    nested = i < len(name) and name[i] == "N"
    if nested:
        i += 1
        while i < len(name) and name[i] in "rVK":  # cv-qualifiers of a nested name
            i += 1
    parts = []
    while i < len(name) and name[i].isdigit():
        j = i
        while j < len(name) and name[j].isdigit():
            j += 1
        n = int(name[i:j])
        parts.append(name[j:j + n])
        i = j + n
        if not nested:
            break
    if not parts:
        return name
    return "::".join("(anon)" if p.startswith("_GLOBAL__N") else p for p in parts)


def short_kernel_name(name: str, width: int = 48) -> str:
    """A readable kernel name: demangled, templates and argument lists dropped, namespaces trimmed."""
    n = demangle_head(name)
    depth, out = 0, []
    for ch in n:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    n = "".join(out).strip() or name
    n = n.replace("void ", "").split(" ")[-1]
    parts = [p for p in n.split("::") if p and p != "(anon)"]
    n = "::".join(parts[-2:]) if len(parts) > 2 else "::".join(parts) or n
    return n if len(n) <= width else n[: width - 1] + "…"


def _segments(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    seg_s, seg_e = _segments(starts, ends)
    return int((seg_e - seg_s).sum())


def busy_within(starts: np.ndarray, ends: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each interval [a_i, b_i]: the share (%) of it covered by at least one of the kernels (starts, ends)."""
    seg_s, seg_e = _segments(np.asarray(starts, np.float64), np.asarray(ends, np.float64))
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


def window_metrics(w: wire.KernelWindow, sm_count: int, cc: str = "9.0") -> WindowMetrics:
    """Reduce one traced window to per-token figures, gap causes and the per-kernel grid table."""
    cols = {k: v.array() for k, v in w.kernels.items()}
    bounds = w.token_bounds_ns.array()
    tokens = max(int(w.tokens), 1)
    nb = min(tokens, len(bounds) - 1) if len(bounds) >= 2 else 0
    lo, hi = (int(bounds[0]), int(bounds[nb])) if nb else (0, 0)
    wall = max(hi - lo, 1)
    start, end = cols.get("start", np.zeros(0, np.int64)), cols.get("end", np.zeros(0, np.int64))
    valid = (start >= lo) & (end <= hi) & (end >= start) if nb else np.ones(len(start), bool)
    invalid = int(((start >= lo) & (start < hi) & ~valid).sum()) if nb else 0
    cols = {k: v[valid] for k, v in cols.items()}
    start, end = cols.get("start", np.zeros(0, np.int64)), cols.get("end", np.zeros(0, np.int64))
    n = len(start)
    names_idx = cols.get("name", np.zeros(0, np.int64))
    names = [w.names[i] if 0 <= i < len(w.names) else "?" for i in range(len(w.names))]
    is_coll = np.array([("nccl" in nm.lower()) for nm in names], dtype=bool)
    dur = (end - start).astype(np.int64)
    kernel_sum = int(dur.sum())
    busy = _union_ns(start, end)

    api = {k: v.array() for k, v in w.apis.items()}
    if nb and "start" in api:
        keep = (api["start"] >= lo) & (api["start"] < hi)
        api = {k: v[keep] for k, v in api.items()}
    api_names = w.api_names
    a_cbid, a_dom = api.get("cbid", np.zeros(0, np.int64)), api.get("domain", np.zeros(0, np.int64))
    a_name = np.array([api_names.get(f"{d}:{c}", "") for c, d in zip(a_cbid.tolist(), a_dom.tolist())], dtype=object)
    is_graph_launch = np.array(["GraphLaunch" in s for s in a_name], dtype=bool)
    is_kernel_launch = np.array([("LaunchKernel" in s) or s.startswith("cudaLaunch_") or s == "cuLaunch"
                                 for s in a_name], dtype=bool)
    # runtime calls are also seen as driver calls underneath; count launches from the runtime layer when present
    rt = a_dom == 0
    has_rt = bool((is_kernel_launch & rt).any() or (is_graph_launch & rt).any())
    layer = rt if has_rt else (a_dom == 1)
    graph_launches = int((is_graph_launch & layer).sum())
    kernel_launch_calls = int((is_kernel_launch & layer).sum())
    apis_traced = bool(getattr(w, "apis_traced", True))
    kgid = cols.get("graph_id", np.zeros(n, np.int64))
    if not apis_traced and n:
        # no launch calls traced in this window (Attach.api_every): a kernel's correlation id is its launch call's,
        # and every kernel of one cudaGraphLaunch carries that launch's id (checked on the H200 recordings whose
        # windows alternate: tests/data/h200_*_api2.dmon)
        kcorr = cols["correlation"]
        graph_launches = len(np.unique(kcorr[kgid != 0]))
        kernel_launch_calls = len(np.unique(kcorr[kgid == 0]))
    mem = {k: v.array() for k, v in w.memcpys.items()}
    mstart = mem.get("start", np.zeros(0, np.int64))
    memcpys = int(((mstart >= lo) & (mstart < hi)).sum()) if nb else len(mstart)

    # gap causes: for each kernel after the first, when did its launch call begin?
    gaps = {"host_late": 0, "short": 0, "other": 0, "tracing": 0}
    if not apis_traced:
        gaps["unsplit"] = 0  # idle longer than a short gap whose cause needs the launch calls, not traced here
    head_ns = 0
    coll_gap_ns = 0.0
    if n > 1:
        o = np.argsort(start, kind="stable")
        s, e, corr = start[o], end[o], cols["correlation"][o]
        run_end = np.maximum.accumulate(e)
        gap = s[1:] - run_end[:-1]
        launch_start = {}
        a_corr, a_start = api.get("correlation", np.zeros(0)), api.get("start", np.zeros(0))
        sel = is_kernel_launch | is_graph_launch
        for c, st in zip(a_corr[sel].tolist(), a_start[sel].tolist()):
            launch_start[c] = st
        # for the idle before each kernel after the first: was its launch call traced, and did it begin only once
        # the GPU had gone idle (the host was late)?
        ls = [launch_start.get(c) for c in corr[1:].tolist()]
        known = np.array([x is not None for x in ls], dtype=bool)
        late = known & (np.array([x if x is not None else 0 for x in ls], dtype=np.int64) >= run_end[:-1])
        if not apis_traced:
            # no launch calls: a kernel is known to have been queued before the GPU went idle only when it comes
            # from the same cudaGraphLaunch as the kernel before it (one call queued them all), as a full window
            # would find from that call's start
            gid = kgid[o]
            known = (corr[1:] == corr[:-1]) & (gid[1:] != 0)
            late = np.zeros_like(known)
        for i in np.flatnonzero(gap > 0).tolist():
            g = int(gap[i])
            if late[i]:
                gaps["host_late"] += g
            elif g <= SHORT_GAP_NS:
                gaps["short"] += g
            elif not known[i] and not apis_traced:
                gaps["unsplit"] += g
            else:
                gaps["other"] += g
        coll_gap_ns = _collective_gap_ns(gap, is_coll[names_idx[o]], known & ~late)
        head = int(s[0]) - lo  # before the first kernel of the window: the host had not launched yet
        if head > 0:
            if graph_launches:
                # a traced cudaGraphLaunch is stretched by CUPTI instrumenting every node (~µs untraced):
                # that wait is the observer's, not the engine's
                gaps["tracing"] += head
                head_ns = head
            else:
                gaps["host_late"] += head
        tail = hi - int(run_end[-1])
        if tail > 0:
            gaps["other"] += tail
    gap_ms = {k: v / tokens / 1e6 for k, v in gaps.items()}
    observed_wall = max(wall - head_ns * 1, 1)

    lim = sm_limits(cc)
    rows = []
    sms = max(sm_count, 1)
    if n:
        bx, by, bz = cols["block_x"], cols["block_y"], cols["block_z"]
        gx, gy, gz = cols["grid_x"], cols["grid_y"], cols["grid_z"]
        grid = gx * gy * gz
        block = bx * by * bz
        smem = cols["smem_static"] + cols["smem_dynamic"]
        for k in np.unique(names_idx).tolist():
            m = names_idx == k
            d = dur[m]
            g = int(np.bincount(grid[m]).argmax()) if grid[m].max() < 1 << 20 else int(np.median(grid[m]))
            b = int(np.median(block[m]))
            r = int(np.median(cols["regs"][m]))
            sm_b = int(np.median(smem[m]))
            bps = blocks_per_sm(b, r, sm_b, lim)
            cov = min(g, sms) / sms
            tot_us = d.sum() / 1e3
            nm = names[k] if k < len(names) else "?"
            rows.append(KernelRow(
                name=nm, short_name=short_kernel_name(nm), calls_per_token=m.sum() / tokens,
                us_mean=float(d.mean() / 1e3), us_per_token=tot_us / tokens,
                share_pct=100.0 * d.sum() / max(kernel_sum, 1), grid_blocks=g, block_threads=b, regs=r,
                smem_bytes=sm_b, grid_coverage_pct=100.0 * cov,
                waves=g / (sms * bps) if bps else float("inf"),
                occupancy_pct=100.0 * bps * max(1, -(-b // 32)) / lim.max_warps,
                idle_sm_us_per_token=tot_us / tokens * (1 - cov),
                is_collective=bool(is_coll[k]) if k < len(is_coll) else False,
            ))
    rows.sort(key=lambda r: -r.us_per_token)
    coll = [r for r in rows if r.is_collective]
    coll_calls = sum(r.calls_per_token for r in coll)
    unwaited_ns = 0.0
    for k in (np.flatnonzero(is_coll).tolist() if n else ()):
        d = dur[names_idx == k]
        if len(d):
            unwaited_ns += len(d) * float(np.median(d[d <= 2 * d.min()]))
    coll_ms = sum(r.us_per_token for r in coll) / 1e3
    small = sum(r.us_per_token for r in rows if r.grid_coverage_pct < 100 * SMALL_GRID_FRACTION)
    small_share = 100.0 * small / max(sum(r.us_per_token for r in rows), 1e-9) if rows else 0.0

    timeline = None
    if nb:
        t0, t1 = int(bounds[nb - 1]), int(bounds[nb])
        km = (start >= t0) & (start < t1)
        if graph_launches and km.any():
            t0 = int(start[km].min())  # drawn from the first kernel: see tracing_head_ms
        a_start, a_end = api.get("start", np.zeros(0, np.int64)), api.get("end", np.zeros(0, np.int64))
        am = (a_start >= t0) & (a_start < t1) & (is_kernel_launch | is_graph_launch) & layer
        timeline = Timeline(
            token_ns=t1 - t0,
            cpu=np.stack([a_start[am] - t0, a_end[am] - t0], axis=1),
            gpu=np.stack([start[km] - t0, end[km] - t0], axis=1),
        )

    return WindowMetrics(
        window_id=w.window_id, tokens=tokens, traced_ms_per_token=wall / tokens / 1e6,
        kernels_per_token=n / tokens, graph_launches_per_token=graph_launches / tokens,
        kernel_launch_calls_per_token=kernel_launch_calls / tokens, memcpys_per_token=memcpys / tokens,
        kernel_sum_ms_per_token=kernel_sum / tokens / 1e6, gpu_busy_pct=100.0 * busy / observed_wall,
        gap_ms_per_token=gap_ms, kernels=tuple(rows), collective_calls_per_token=coll_calls,
        collective_us_per_call=(coll_ms * 1e3 / coll_calls) if coll_calls else 0.0,
        collective_ms_per_token=coll_ms, small_grid_share_pct=small_share, timeline=timeline,
        tracing_head_ms=head_ns / 1e6,
        collective_gap_us=coll_gap_ns / 1e3,
        collective_us_unwaited=unwaited_ns / 1e3 / tokens / coll_calls if coll_calls else 0.0,
        dropped_records=w.dropped_records + invalid,
        probe_host_ms=w.probe_host_ns / 1e6, prepare_ms=w.prepare_ns / 1e6, guard_tokens=int(w.guard_tokens),
        apis_traced=apis_traced,
    )


@dataclass(frozen=True)
class TokenStats:
    """The token clock's figures over some span."""

    tokens: int
    ms_per_token: float
    ms_per_token_p90: float
    ms_per_token_p99: float
    tokens_per_s: float


def token_stats(t_ns: np.ndarray) -> TokenStats | None:
    """ms/token (median, p90, p99) and tokens/s from token boundaries; None with fewer than 3."""
    if len(t_ns) < 3:
        return None
    d = np.diff(np.asarray(t_ns, dtype=np.int64)) / 1e6
    d = d[d > 0]
    if len(d) < 2:
        return None
    med = float(np.median(d))
    return TokenStats(tokens=len(d), ms_per_token=med, ms_per_token_p90=float(np.percentile(d, 90)),
                      ms_per_token_p99=float(np.percentile(d, 99)), tokens_per_s=1e3 / float(np.mean(d)))
