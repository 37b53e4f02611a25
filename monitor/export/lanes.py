"""One traced window as Trace Event Format events, one function per lane.

    CPU process (the decode process's pid)
      tid = pid          launch calls        cat cuda_runtime / cuda_driver    X, with flows (ac2g) to kernels
      tid TOKENS_TID     token clock         ProfilerStep#N slices, boundary instants
      tid WINDOWS_TID    traced windows      one slice per window over its analysed tokens
      tid NVTX_TID       NVTX ranges         cat nvtx
    GPU process (pid = the device's index, as Kineto numbers it)
      tid = stream       kernels             cat kernel, Kineto's args
      tid IDLE_TID       idle, classified    cat gpu_idle, the analysis's gap classes
      counters           PM samples          ph C, one track per counter

CUPTI numbers its correlation ids afresh in every window (it is finalized after each), so each window's ids are
moved past the previous window's (`corr_offset`): HTA and Perfetto join a launch to its kernels by id over the
whole trace. The kernel's args keep CUPTI's own id as `cupti correlation`.

Times are µs from the trace's base (`base_ns`, CUPTI's clock, which is Unix time in ns), three decimals: the
records' own ns. The tokens are named ProfilerStep#N because that is how Kineto marks an iteration, so HTA's
per-iteration views see decodemon's tokens.
"""

from __future__ import annotations

import math

import numpy as np

from decodemon.monitor.analysis.gaps import IdleGaps, classify_gaps, idle_gaps
from decodemon.monitor.analysis.launches import count_launches, launch_calls
from decodemon.monitor.analysis.names import NAME_WHOLE, kernel_tags, range_name, short_kernel_name, tagged
from decodemon.monitor.analysis.records import TracedRecords, analysed_records
from decodemon.probes import wire

TOKENS_TID = 1
WINDOWS_TID = 2
NVTX_TID = 3
IDLE_TID = 1_000_000  # beyond any CUDA stream id

# PM columns of the feed (monitor/feed.PM_COLS) drawn as counter tracks, with the track's name
PM_COUNTERS = {"gpu_busy_pct": "GPU busy (%)", "sm_active_pct": "SM active (%)",
               "warps_active_pct": "warps active (%)", "dram_pct": "DRAM throughput (%)"}
DOMAIN_CAT = {0: "cuda_runtime", 1: "cuda_driver"}


class Clock:
    """CUPTI ns to the trace's µs: `ts(t)` and `dur(t0, t1)`, exact to the ns."""

    def __init__(self, base_ns: int) -> None:
        self.base_ns = int(base_ns)

    def ts(self, t_ns) -> float:
        """µs since the base."""
        return round((int(t_ns) - self.base_ns) / 1e3, 3)

    @staticmethod
    def dur(t0_ns, t1_ns) -> float:
        """µs between two CUPTI times (never negative)."""
        return round(max(int(t1_ns) - int(t0_ns), 0) / 1e3, 3)


def earliest_ns(w: wire.KernelWindow) -> int | None:
    """The first time a window's records or token boundaries hold (None for an empty window)."""
    firsts = [int(c["start"].array().min()) for c in (w.kernels, w.apis, w.memcpys)
              if "start" in c and len(c["start"].data)]
    tb = w.token_bounds_ns.array()
    if len(tb):
        firsts.append(int(tb.min()))
    return min(firsts) if firsts else None


def max_correlation(w: wire.KernelWindow) -> int:
    """The highest correlation id a window's kernels or launch calls carry (0 for none)."""
    highs = [int(c["correlation"].array().max()) for c in (w.kernels, w.apis)
             if "correlation" in c and len(c["correlation"].data)]
    return max(highs, default=0)


def launch_lane(w: wire.KernelWindow, clock: Clock, cpu_pid: int, corr_offset: int = 0) -> list[dict]:
    """The launch calls on the decode process's launch thread: every API record the window traced (the runtime's;
    kernels a library launched through the driver have no record here, only their kernels on the GPU lane)."""
    cols = {k: v.array() for k, v in w.apis.items()}
    if "start" not in cols:
        return []
    out = []
    for cbid, t0, t1, corr, dom in zip(cols["cbid"].tolist(), cols["start"].tolist(), cols["end"].tolist(),
                                       cols["correlation"].tolist(), cols.get("domain", np.zeros(len(cols["start"]),
                                                                                       np.int64)).tolist()):
        corr += corr_offset
        out.append({"ph": "X", "cat": DOMAIN_CAT.get(dom, "cuda_api"),
                    "name": w.api_names.get(f"{dom}:{cbid}") or f"cbid {cbid}",
                    "pid": cpu_pid, "tid": cpu_pid, "ts": clock.ts(t0), "dur": clock.dur(t0, t1),
                    "args": {"cbid": cbid, "correlation": corr, "External id": corr}})
    return out


def trace_labels(names: set[str], table) -> dict[str, str]:
    """One slice name per kernel for the whole trace: the label the hot-kernels table gives it (`table`: the rows
    of the latest window exported, as the screen, `--json` and the report show them, their `#n` included); a
    kernel that table leaves out (one of an earlier window, or of the tracing's first moments) by its short name
    in the same style, tagged among those, and never a name a table row already has."""
    out = {r.name: r.label for r in table}
    rest = sorted(names - out.keys())
    heads = [short_kernel_name(n, NAME_WHOLE) for n in rest]
    used = set(out.values())
    for n, h, t in zip(rest, heads, kernel_tags([(n, h, 0) for n, h in zip(rest, heads)])):
        label = k = tagged(h, t, n)
        i = 2
        while k in used:
            k, i = f"{label} [{i}]", i + 1
        used.add(k)
        out[n] = k
    return out


def kernel_lane(w: wire.KernelWindow, clock: Clock, device: int, sm_count: int, corr_offset: int = 0,
                labels: dict[str, str] | None = None) -> list[dict]:
    """Every kernel on its stream's thread of the GPU process, with Kineto's kernel args."""
    k = {name: col.array().tolist() for name, col in w.kernels.items()}
    if "start" not in k:
        return []
    labels = labels or {}
    out = []
    for i, (t0, t1) in enumerate(zip(k["start"], k["end"])):
        grid = [k["grid_x"][i], k["grid_y"][i], k["grid_z"][i]]
        block = [k["block_x"][i], k["block_y"][i], k["block_z"][i]]
        blocks = grid[0] * grid[1] * grid[2]
        warps_per_block = math.ceil(block[0] * block[1] * block[2] / 32)
        name = w.names[k["name"][i]] if 0 <= k["name"][i] < len(w.names) else "?"
        corr, stream = k["correlation"][i] + corr_offset, k["stream"][i]
        args = {"device": device, "stream": stream, "correlation": corr, "External id": corr,
                "cupti correlation": k["correlation"][i],
                "grid": grid, "block": block, "registers per thread": k["regs"][i],
                "shared memory": k["smem_static"][i] + k["smem_dynamic"][i],
                "static shared memory": k["smem_static"][i], "dynamic shared memory": k["smem_dynamic"][i],
                "graph id": k["graph_id"][i], "graph node id": k["graph_node_id"][i], "mangled name": name}
        if sm_count:
            args["blocks per SM"] = round(blocks / sm_count, 4)
            args["warps per SM"] = round(blocks * warps_per_block / sm_count, 4)
        label = labels.get(name, name)
        out.append({"ph": "X", "cat": "kernel", "name": label, "pid": device, "tid": stream,
                    "ts": clock.ts(t0), "dur": clock.dur(t0, t1), "args": args})
    return out


def flow_lane(w: wire.KernelWindow, clock: Clock, cpu_pid: int, device: int, corr_offset: int = 0) -> list[dict]:
    """Arrows from each launch call to the first kernel it launched (Kineto's ac2g flows)."""
    if "correlation" not in w.apis or "correlation" not in w.kernels:
        return []
    first = {}
    k = {name: w.kernels[name].array().tolist() for name in ("correlation", "start", "stream")}
    for corr, t0, stream in sorted(zip(k["correlation"], k["start"], k["stream"]), key=lambda r: r[1]):
        first.setdefault(corr, (t0, stream))
    out = []
    a = {name: w.apis[name].array().tolist() for name in ("correlation", "start")}
    for corr, t0 in zip(a["correlation"], a["start"]):
        if corr in first:
            kt0, stream = first.pop(corr)
            flow = {"cat": "ac2g", "name": "ac2g", "id": corr + corr_offset}
            out.append({**flow, "ph": "s", "pid": cpu_pid, "tid": cpu_pid, "ts": clock.ts(t0)})
            out.append({**flow, "ph": "f", "bp": "e", "pid": device, "tid": stream, "ts": clock.ts(kt0)})
    return out


def token_lane(w: wire.KernelWindow, clock: Clock, cpu_pid: int, first_step: int) -> list[dict]:
    """The window's token boundaries (instants), its tokens as ProfilerStep#N slices (the guard as a guard
    token) and the window as one slice over its analysed tokens."""
    tb = w.token_bounds_ns.array().tolist()
    analysed = w.tokens if w.clock == "tokens" else 0
    out = []
    for i, t in enumerate(tb):
        out.append({"ph": "i", "s": "t", "cat": "token", "name": "token boundary", "pid": cpu_pid,
                    "tid": TOKENS_TID, "ts": clock.ts(t),
                    "args": {"window": w.window_id, "boundary": i, "analysed": i <= analysed}})
    for i, (t0, t1) in enumerate(zip(tb, tb[1:])):
        name = f"ProfilerStep#{first_step + i}" if i < analysed else (
            "guard token" if w.clock == "tokens" else "traced span")
        out.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": cpu_pid, "tid": TOKENS_TID,
                    "ts": clock.ts(t0), "dur": clock.dur(t0, t1), "args": {"window": w.window_id}})
    span = w.analysed_span()
    if span is not None:
        out.append({"ph": "X", "cat": "window", "name": f"window {w.window_id}", "pid": cpu_pid,
                    "tid": WINDOWS_TID, "ts": clock.ts(span[0]), "dur": clock.dur(*span),
                    "args": {"window": w.window_id, "tokens": w.tokens, "guard_tokens": w.guard_tokens,
                             "clock": w.clock, "apis_traced": bool(w.apis_traced),
                             "dropped_records": w.dropped_records}})
    return out


def _gap_class(gap_ns: int, known: bool, late: bool, head: bool, graph_launches: int, apis_traced: bool) -> str:
    """One idle stretch's class, by the analysis's own rule: classify_gaps over that stretch alone."""
    one = IdleGaps(order=np.zeros(0, np.int64), gap_ns=np.array([] if head else [gap_ns], np.int64),
                   launch_known=np.array([] if head else [known], bool),
                   host_late=np.array([] if head else [late], bool),
                   head_ns=gap_ns if head else 0, tail_ns=0)
    sums = classify_gaps(one, graph_launches, apis_traced).ns
    return max(sums, key=sums.get)


def classified_gaps(rec: TracedRecords) -> list[tuple[int, int, str]]:
    """(start ns, end ns, class) of every idle stretch of the analysed tokens, classed as the analysis classes
    them: the head, each gap between overlapping runs of kernels, and the tail (always "other")."""
    calls = launch_calls(rec)
    idle = idle_gaps(rec, calls)
    if idle is None:
        return []
    graph_launches = count_launches(rec, calls).graph_launches
    s = rec.start_ns[idle.order]
    run_end = np.maximum.accumulate(rec.end_ns[idle.order])
    out = []
    if idle.head_ns > 0:
        out.append((rec.lo_ns, int(s[0]),
                    _gap_class(idle.head_ns, False, False, True, graph_launches, rec.apis_traced)))
    for i in np.flatnonzero(idle.gap_ns > 0).tolist():
        out.append((int(run_end[i]), int(s[i + 1]),
                    _gap_class(int(idle.gap_ns[i]), bool(idle.launch_known[i]), bool(idle.host_late[i]), False,
                               graph_launches, rec.apis_traced)))
    if idle.tail_ns > 0:
        out.append((int(run_end[-1]), rec.hi_ns, "other"))
    return out


def gap_lane(w: wire.KernelWindow, clock: Clock, device: int) -> list[dict]:
    """The analysed tokens' idle GPU time as slices on their own track, named by cause."""
    if w.clock != "tokens" or w.analysed_span() is None:
        return []
    return [{"ph": "X", "cat": "gpu_idle", "name": f"idle: {cls.replace('_', ' ')}", "pid": device,
             "tid": IDLE_TID, "ts": clock.ts(t0), "dur": clock.dur(t0, t1),
             "args": {"class": cls, "window": w.window_id}}
            for t0, t1, cls in classified_gaps(analysed_records(w))]


def nvtx_lane(w: wire.KernelWindow, clock: Clock, cpu_pid: int) -> list[dict]:
    """NVTX ranges pushed from Python inside the window (wire.KernelWindow.nvtx: name, an index into
    `nvtx_names`, start, end, level); a window without them (older recordings, an engine that pushes none) has
    none."""
    cols = getattr(w, "nvtx", None) or {}
    if "start" not in cols or "end" not in cols:
        return []
    start, end = cols["start"].array().tolist(), cols["end"].array().tolist()
    idx = cols["name"].array().tolist() if "name" in cols else [-1] * len(start)
    level = cols["level"].array().tolist() if "level" in cols else [0] * len(start)
    return [{"ph": "X", "cat": "nvtx", "name": range_name(w, n),
             "pid": cpu_pid, "tid": NVTX_TID, "ts": clock.ts(t0), "dur": clock.dur(t0, t1),
             "args": {"window": w.window_id, "level": lv}}
            for t0, t1, n, lv in zip(start, end, idx, level)]


def counter_lane(pm: dict, clock: Clock, device: int) -> list[dict]:
    """PM samples (feed columns, CUPTI's clock) as counter tracks; a sample a counter lacks (NaN) is left out."""
    out = []
    for col, track in PM_COUNTERS.items():
        for t0, v in zip(pm["gpu_t0_ns"].tolist(), pm[col].tolist()):
            if math.isfinite(v):
                out.append({"ph": "C", "cat": "pm", "name": track, "pid": device, "tid": 0, "ts": clock.ts(t0),
                            "args": {"value": round(v, 3)}})
    return out
