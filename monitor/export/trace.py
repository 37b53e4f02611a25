"""A Session's traced windows as one Trace Event Format document, in Kineto's flavour, and its writer."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from decodemon.monitor.export import lanes
from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.safe_write import check_output, write_whole
from decodemon.monitor.sources.errors import NothingMeasured
from decodemon.probes import wire


class NothingToExport(NothingMeasured):
    """The source holds no traced window (or not the one asked for)."""


def _device_properties(gpu: wire.GpuInfo | None) -> list[dict]:
    """Kineto's deviceProperties for the one device decodemon watched (what the probe knows of it)."""
    if gpu is None:
        return []
    major, _, minor = (gpu.cc or "0.0").partition(".")
    return [{"id": gpu.index, "name": gpu.name, "totalGlobalMem": gpu.memory_total_bytes,
             "computeMajor": int(major or 0), "computeMinor": int(minor or 0), "numSms": gpu.sm_count,
             "warpSize": 32}]


def _distributed_info(model: wire.ModelFacts | None) -> dict:
    """Kineto's distributedInfo: HTA keys a trace's rank by it."""
    info = {"rank": model.tp_rank if model else 0, "world_size": model.tp_degree if model else 1}
    if model is not None and model.collective_backend:
        info["backend"] = model.collective_backend
    return info


def _names(cpu_pid: int, device: int, gpu: wire.GpuInfo | None, streams: set, label: str) -> list[dict]:
    """Metadata events: what each process and thread is."""
    gpu_name = f"GPU {device}" + (f" {gpu.name}" if gpu else "")
    out = [{"ph": "M", "name": "process_name", "pid": cpu_pid, "tid": 0, "ts": 0, "args": {"name": label}},
           {"ph": "M", "name": "process_sort_index", "pid": cpu_pid, "tid": 0, "ts": 0, "args": {"sort_index": 0}},
           {"ph": "M", "name": "process_name", "pid": device, "tid": 0, "ts": 0, "args": {"name": gpu_name}},
           {"ph": "M", "name": "process_labels", "pid": device, "tid": 0, "ts": 0, "args": {"labels": gpu_name}},
           {"ph": "M", "name": "process_sort_index", "pid": device, "tid": 0, "ts": 0, "args": {"sort_index": 1}}]
    threads = [(cpu_pid, cpu_pid, "launch calls"), (cpu_pid, lanes.TOKENS_TID, "token clock"),
               (cpu_pid, lanes.WINDOWS_TID, "traced windows"), (cpu_pid, lanes.NVTX_TID, "NVTX"),
               (device, lanes.IDLE_TID, "GPU idle (classified)")]
    threads += [(device, s, f"stream {s}") for s in sorted(streams)]
    for pid, tid, name in threads:
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
    return out


def _windows_of(session, window_id: int | None) -> list[wire.KernelWindow]:
    where = f"pid {session.label}" if str(session.label).isdigit() else str(session.label)
    wins = [w for _rx, w in list(session.feed.windows)]
    if window_id is not None:
        wins = [w for w in wins if w.window_id == window_id]
        if not wins:
            kept = ", ".join(str(w.window_id) for _rx, w in session.feed.windows) or "none"
            raise SourceError(f"no traced window {window_id} in {where} (windows: {kept})")
    wins = [w for w in wins if lanes.earliest_ns(w) is not None]
    if not wins:
        st = session.feed.status
        words = session.feed.state.get("trace", "")  # the status in words (probe_status.describe)
        why = f" (tracing {words})" if st.trace and st.trace != "armed" and words else ""
        raise NothingToExport(f"{where} holds no traced window{why}: nothing to export")
    return wins


def _table_of(session, w, gpu) -> tuple:
    """The hot-kernels table of window `w` as the session read it (a window it re-timed by the GPU's steps
    included), so the trace names each kernel as the screen, `--json` and the report do."""
    from decodemon.monitor.analysis.window import window_metrics

    for _rx, m in reversed(session.metrics):
        if m.window_id == w.window_id:
            return m.kernels
    return window_metrics(w, gpu.sm_count if gpu else 0, gpu.cc if gpu and gpu.cc else "9.0").kernels


def trace_of(session, window_id: int | None = None) -> dict:
    """The session's traced windows (or the one with `window_id`) as a Kineto-style trace dict."""
    feed = session.feed
    wins = _windows_of(session, window_id)
    hello = feed.hello
    gpu = hello.gpu if hello else None
    model = hello.model if hello else None
    device = gpu.index if gpu else 0
    cpu_pid = hello.pid if hello and hello.pid else 1_000_000  # a pid no device index reaches
    clock = lanes.Clock(min(lanes.earliest_ns(w) for w in wins))
    events, streams, step, corr = [], set(), 0, 0
    labels = lanes.trace_labels({n for w in wins for n in w.names}, _table_of(session, wins[-1], gpu))
    for w in wins:
        events += lanes.launch_lane(w, clock, cpu_pid, corr)
        kernels = lanes.kernel_lane(w, clock, device, gpu.sm_count if gpu else 0, corr, labels)
        streams.update(e["tid"] for e in kernels)
        events += kernels
        events += lanes.flow_lane(w, clock, cpu_pid, device, corr)
        corr += lanes.max_correlation(w) + 1
        events += lanes.token_lane(w, clock, cpu_pid, step)
        step += w.tokens if w.clock == "tokens" else 0
        events += lanes.gap_lane(w, clock, device)
        events += lanes.nvtx_lane(w, clock, cpu_pid)
        tb = w.token_bounds_ns.array()
        if len(tb) >= 2:
            events += lanes.counter_lane(feed.pm_within(int(tb[0]), int(tb[-1])), clock, device)
    label = f"{' '.join(hello.argv[:3])} (pid {hello.pid})" if hello else session.label
    return {
        "schemaVersion": 1,
        "deviceProperties": _device_properties(gpu),
        "distributedInfo": _distributed_info(model),
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": clock.base_ns,
        "traceName": str(session.label),
        "decodemon": {"source": str(session.label), "windows": [w.window_id for w in wins],
                      "tokens": [w.tokens for w in wins], "model": model.name if model else None},
        "traceEvents": _names(cpu_pid, device, gpu, streams, label) + events,
    }


def export(source, window_id: int | None = None, settings: wire.Attach | None = None,
           seconds: float | None = None) -> dict:
    """The trace dict of a recording path, a pid (attached for `seconds`) or a Session already read."""
    from decodemon.monitor.sources.collect import collect

    session = source if hasattr(source, "feed") else collect(str(source), settings, seconds)
    return trace_of(session, window_id)


def write_trace(trace: dict, path) -> Path:
    """Write `trace` as JSON (gzipped when `path` ends in .gz), whole: a failure leaves no partial file
    (sources.write_whole); SourceError with one line when it cannot be written."""
    target = check_output(path)
    data = json.dumps(trace, allow_nan=False, separators=(",", ":")).encode()
    if target.name.endswith(".gz"):
        data = gzip.compress(data, compresslevel=6)
    write_whole(target, data)
    return target
