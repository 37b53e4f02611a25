"""What watching costs the loop, read off the traced windows themselves (the probe's calls on the decode thread
and the traced tokens' stretch), and the probe's own figures beside it."""

from __future__ import annotations

import numpy as np


# what share_of_loop_pct bills, said in every observer_cost: the decode thread's time, not the agent thread's CPU
SHARE_COVERS = ("the decode thread's time in the traced windows (the probe's calls and the traced tokens' stretch) "
                "and in the step count's hook; not agent_cpu_ms_per_s, which runs on another core and costs the "
                "loop only while it holds the GIL (decode_waits_per_s counts the decode thread's waits)")


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def observer_cost(metrics: list, state: dict, ts) -> dict | None:
    """What the traced windows cost the decode thread, from the windows themselves.

    Per window: the probe's own calls on the decode thread (CUPTI's start-up in open, the flush, the finalize:
    the window's `probe_host_ns`) plus the traced tokens' stretch over an untraced token (CUPTI's per-launch
    cost while tracing, guard token included). With the median time between windows, the share of the loop's
    time. Not in it: PM pumps and NVML, which run off the decode thread (agent thread, sidecar process), and
    CUPTI's start-up when the agent thread made it (`cupti_start_off_thread_ms`, given beside the bill: on an
    H200 it still cost the eager decode thread ~5 ms of its 14).
    On an H200, eager with the start-up off-thread: 7.5-9.3 ms probe + 10-35 ms tracing per window, one per
    5 s, 0.3-0.9% of the loop; graphed: 23-26 ms + 7 ms, one per 4 s.
    """
    def probe_figure(key: str) -> float | None:  # a number the probe put in its state, if any
        try:
            x = float(state.get(key, "nan"))
        except ValueError:
            return None
        return x if x == x else None

    waits = probe_figure("decode_waits_per_s")  # the decode thread's voluntary switches (agent._SwitchCounter)
    agent_cpu = probe_figure("agent_cpu_ms_per_s")
    probe = {
        # not in the share: each is a wait of the decode thread, mostly for the GIL the agent thread took back (an
        # eager decode thread made 0 a second unobserved on the H200, 45-78 attached)
        "decode_waits_per_s": round(waits, 1) if waits is not None else None,
        # the agent thread's own CPU, ms a second over the attach (the library's reading of the records in it;
        # CUPTI's start-up, GIL-free, apart): on another core, but while it holds the GIL the decode thread waits
        "agent_cpu_ms_per_s": round(agent_cpu, 1) if agent_cpu is not None else None,
        # the seconds it covers: the attach so far; None from a probe that read its last second alone
        "agent_cpu_over_s": probe_figure("agent_cpu_over_s"),
        "cupti_start_cpu_ms": probe_figure("cupti_start_cpu_ms"),
        "cupti_finalize_cpu_ms": probe_figure("cupti_finalize_cpu_ms")}
    ms = [m for _, m in metrics]
    if not ms or ts is None or not ts.ms_per_token:
        # no window to bill: what the probe read of the agent's cost still says what watching took
        if all(v is None for v in probe.values()):
            return None
        return {"probe_ms_per_window": None, "tracing_ms_per_window": None, "window_every_s": None,
                "cupti_start_off_thread_ms": None, "share_of_loop_pct": None, "step_count_pct": None,
                "share_of_loop_covers": SHARE_COVERS, **probe}
    probe_ms_all = [m.probe_host_ms for m in ms if m.probe_host_ms > 0]
    stretch = [max(0.0, m.traced_ms_per_token - ts.ms_per_token) * (m.tokens + m.guard_tokens) for m in ms]
    gaps = np.diff([rx for rx, _ in metrics]) / 1e9
    every_s = float(np.median(gaps)) if len(gaps) else None
    probe_ms = _median(probe_ms_all) if probe_ms_all else None
    tracing_ms = _median(stretch)
    per_window = (probe_ms or 0.0) + tracing_ms
    prep = [m.prepare_ms for m in ms if m.prepare_ms > 0]
    # the step-start hook's own cost a step (engine_adapter/step_starts.py), while it is the clock: one call a step
    count_ns = probe_figure("step_count_ns")
    counting_pct = 100.0 * count_ns / 1e6 / ts.ms_per_token if count_ns else None
    return {"probe_ms_per_window": round(probe_ms, 2) if probe_ms is not None else None,
            "tracing_ms_per_window": round(tracing_ms, 2),
            "window_every_s": round(every_s, 2) if every_s else None,
            "cupti_start_off_thread_ms": round(_median(prep), 2) if prep else None,
            # without the probe's own time (recordings older than probe_host_ns) the bill is incomplete
            "share_of_loop_pct": (round(100.0 * per_window / (every_s * 1e3) + (counting_pct or 0.0), 3)
                                  if every_s and probe_ms is not None else None),
            # in the share: the step count's hook on the decode thread, where it counts the steps
            "step_count_pct": round(counting_pct, 4) if counting_pct is not None else None,
            "share_of_loop_covers": SHARE_COVERS, **probe}
