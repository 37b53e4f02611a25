"""The JSON summary of `attach --json`, `replay --json` and `report --json`, and the collectives' part of it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from decodemon.monitor.analysis.agreement import busy_disagreement, bytes_per_token_note, kernels_past_step
from decodemon.monitor.analysis.kernels import KERNELS_NOTE
from decodemon.monitor.ceilings import own_kernel_ms
from decodemon.monitor.render.text import in_marks, unit
from decodemon.monitor.rolling import headline
from decodemon.monitor.span import rolling_json, span_json
from decodemon.monitor.token_clock import CLOCK_NOTES, MEAN_CLOCKS, PROVISIONAL_STEPS, STEP_STARTS, clock_kind
if TYPE_CHECKING:
    from decodemon.monitor.analysis.window import WindowMetrics
    from decodemon.monitor.snapshot import Snapshot


COLLECTIVES_KEYS = ("source", "calls_per_token", "us_per_call", "kernel_us_per_call", "launch_gap_us_per_call",
                    "kernel_us_per_call_mean", "wait_ms_per_token", "payload_bytes", "counted_per_token",
                    "host_enqueue_us_per_call", "share_of_step_pct", "over")
# a batched engine's step figures by the step's name, and the one sequence's key that holds the same figure
STEP_KEYS = {"ms_per_step": "ms_per_token", "steps_per_s": "tokens_per_s", "kernels_per_step": "kernels_per_token"}
# the idle's causes, each always said: `unsplit` is 0 where the window traced its launch calls (every gap split)
GAP_KEYS = ("host_late", "short", "other", "tracing", "unsplit")
# what the observer's steps cost the tokens they overlapped: null where no step's span is known
SLOWED_KEYS = ("slowed_tokens", "slowed_extra_ms", "slowed_by")
# the words a figure that was not measured has worn; the summary says each as null
NOT_MEASURED = ("", "-", "—", "n/a")


def collectives_json(s: Snapshot) -> dict | None:
    """Collectives per token, µs per call, payload and share of the step, from traces or the engine's clock."""
    w, m = s.window, s.model
    c = s.diagnosis.candidates.get("comm")
    out = {}
    if w is not None and s.collective_window is not None and s.inputs is not None and s.inputs.collectives_per_token:
        # us_per_call: what a call costs the step (kernel + the idle it adds); the kernel alone beside it. The
        # figures COMM priced, from the span's windows (its detail and `over` say how), not the latest window alone
        calls, kernel_us, gap_us, wait = s.collective_terms()
        pw = s.collective_window or w
        out = {"source": "NCCL kernels (traced window)", "calls_per_token": round(calls, 2),
               "us_per_call": round(s.collective_us_priced, 2), "kernel_us_per_call": round(kernel_us, 2),
               "launch_gap_us_per_call": round(gap_us, 2), "kernel_us_per_call_mean": round(pw.collective_us_per_call, 2),
               "wait_ms_per_token": round(wait, 4), "over": s.inputs.comm_source if s.inputs else None}
    elif s.host_collectives is not None and s.host_clock_is_collective:
        calls, us, nbytes = s.host_collectives
        out = {"source": "engine clock (host-side call time)", "calls_per_token": round(calls, 2),
               "us_per_call": round(us, 2), "payload_bytes": int(nbytes)}
    elif s.host_collectives is not None:
        calls, us, nbytes = s.host_collectives
        out = {"source": "engine clock (calls only: µs per call waits for a traced window)",
               "calls_per_token": round(calls, 2), "us_per_call": None, "payload_bytes": int(nbytes)}
    elif w is not None:
        out = {"source": "traced window", "calls_per_token": 0, "us_per_call": None}
    if m is not None and m.collectives_per_token:
        out["counted_per_token"] = m.collectives_per_token  # from the forward pass
        out.setdefault("payload_bytes", m.collective_bytes)
    if s.host_collectives is not None and not s.host_clock_is_collective:
        out["host_enqueue_us_per_call"] = round(s.host_collectives[1], 2)  # what an eager loop pays per call
    if out and c is not None and c.value is not None:
        out["share_of_step_pct"] = round(c.value, 2)
    if out and s.inputs is not None and s.inputs.comm_source:
        out.setdefault("over", s.inputs.comm_source)  # where COMM's figures come from, as its detail says
    # one set of keys whatever the source: a figure it does not give is null
    return {k: out.get(k) for k in COLLECTIVES_KEYS} if out else None


def kernel_rows_json(w: WindowMetrics | None, sm_count: int, kernels: int = 15) -> list[dict]:
    """The window's hottest `kernels` rows of the kernel table: time, grid against the SMs, occupancy. `label` is the
    row's name on the screen and in DIAGNOSIS: `name` (the short name) with what tells it from another row of that
    name, where two share one."""
    return [
        {"name": r.short_name, "label": r.label, "full_name": r.name, "calls_per_token": round(r.calls_per_token, 2),
         "us_mean": round(r.us_mean, 2), "us_per_token": round(r.us_per_token, 1),
         "grid_blocks": r.grid_blocks, "block_threads": r.block_threads,
         "grid_vs_sms": f"{r.grid_blocks}/{sm_count}", "grid_coverage_pct": round(r.grid_coverage_pct, 1),
         "waves": round(r.waves, 3) if r.waves != float("inf") else None,
         "occupancy_pct": round(r.occupancy_pct, 1), "regs": r.regs, "smem_bytes": r.smem_bytes,
         "idle_sm_us_per_token": round(r.idle_sm_us_per_token, 1)}
        for r in (w.kernels[:kernels] if w else ())
    ]


def _clock_note(s: Snapshot) -> str | None:
    """What the token clock is; a target with no GPU has no traced windows to hold its steps against."""
    note = CLOCK_NOTES.get(s.token_clock)
    if note and s.inputs is not None and s.inputs.no_gpu:
        note = note.replace(", held against the GPU's steps in the traced windows", " (no GPU: no traced window)")
    return note


def _r(x: float | None, nd: int) -> float | None:
    return round(x, nd) if x is not None else None


def _busy_json(s: Snapshot) -> dict:
    """GPU busy from each instrument, with PM's other counters."""
    from decodemon.monitor.probe_status import pm_silence  # with the feed, not the app (it loads the probe's policy)

    w, c, i = s.window, s.pm_check, s.inputs
    return {
        "gpu_busy_pct": _r(s.gpu_busy_pct, 1),
        "gpu_busy_source": s.busy_source if s.gpu_busy_pct is not None else None,
        "pm_gpu_busy_pct": round(s.pm["gpu_busy_pct"], 1) if s.pm else None,
        "pm_silent": pm_silence(s),  # PM armed with no sample: for how long, and what that leaves
        # the kernels' union over the traced tokens' own wall clock, which tracing stretches (the help's "traced-token
        # busy"); traced_gpu_busy_pct is its older name, kept
        "traced_token_busy_pct": round(w.gpu_busy_pct, 1) if w else None,
        "traced_gpu_busy_pct": round(w.gpu_busy_pct, 1) if w else None,
        # the traced kernels' time over the loop's median (untraced) step: the help's "kernel share"
        "kernel_share_of_step_pct": _r(s.kernel_share_pct, 1),
        # the traced kernels' share counts a collective spinning while it waits for a late peer as the step's idle
        "kernel_share_of_step_note": kernel_share_note(s),
        "kernels_past_step": kernels_past_step(s) or None,  # the traced kernels' sum over the median step: why
        # GPU busy over the same PM samples inside the traced tokens: PM's counter and the traced kernels' union
        # over exactly those samples' intervals (a figure of its own: not traced_token_busy_pct, which is the union
        # over the latest window's whole tokens), pooled over the span's windows
        "pm_vs_window": ({"samples": c.samples, "pm_gpu_busy_pct": round(c.pm_busy_pct, 1),
                          "window_gpu_busy_pct": round(c.traced_busy_pct, 1),
                          "over": (f"the {c.samples} PM sample{'s' if c.samples != 1 else ''} wholly inside the "
                                   + ("span's traced tokens" if s.windows_in_span else
                                      "latest traced window's tokens, before the span (it traced none)")
                                   + ", each instrument over the same GPU time")} if c else None),
        "sm_active_pct": round(s.pm["sm_active_pct"], 1) if s.pm else None,
        "warps_active_pct": round(s.pm["warps_active_pct"], 1) if s.pm else None,
        "dram_pct": round(s.pm["dram_pct"], 1) if s.pm else None,
        # DRAM bytes read + written a second over the span's PM samples (device-wide)
        "dram_gbs": _r(s.inputs.dram_gbs, 1) if s.inputs is not None else None,
        "busy_sources_disagree": busy_disagreement(s.pm["gpu_busy_pct"] if s.pm else None, s.kernel_share_pct, s.pm_check),
    }


def _windows_words(s: Snapshot) -> str:
    """Which traced windows a figure the diagnosis was given is the median of."""
    n = s.windows_in_span
    if n > 1:
        return f"the median of the span's {n} traced windows"
    return "the span's one traced window" if n == 1 else "the latest traced window, before the span"


def kernel_share_note(s: Snapshot) -> str | None:
    """The arithmetic of kernel_share_of_step_pct, with the figures it used: the GPU time the traced kernels cover
    a token (their union; the median of the span's windows, where kernel_busy_ms_per_token is the latest's), less
    the collectives' wait for a late peer where it is named, over the median step."""
    i = s.inputs
    if s.kernel_share_pct is None or i is None or i.kernel_ms is None or not i.ms_per_token:
        return None
    k, step = i.kernel_ms, i.ms_per_token
    wait = i.collective_wait_ms_per_token or None  # as the share is taken: any wait, however small, is left out
    own = k - min(wait or 0.0, k)
    where = _windows_words(s)
    several = s.windows_in_span > 1  # the JSON's kernel_busy_ms_per_token and wait_ms_per_token are the latest's
    name = "kernel_busy_ms_per_token" if i.kernel_busy_ms_per_token is not None else "kernel_sum_ms_per_token"
    line = (f"the traced kernels {k:.4g} ms/token{i.kernels_overlap_words} ({where}"
            + (f"; {name} is the latest window's, kernels_from.verdict_kernel_ms_per_token this one)" if several
               else ")"))
    if wait:
        line += (f" less {wait:.3g} ms/token of collectives waiting for a late peer (the step's idle, as LAUNCH "
                 f"counts it; {where})" + f" = {own:.4g} ms")
    pct = 100.0 * own / step
    return (line + f" over the {step:.4g} ms {clock_kind(s.token_clock)} step = {pct:.1f}%"
            + (", capped at 100" if pct > 100 else ""))


def kernels_from_json(s: Snapshot) -> dict | None:
    """Which traced window the kernel figures (kernels and launches a token, kernel time, the gaps, the kernel
    table, the collectives) are read from: the span's latest, or, where the span received none, the latest
    before it, with when it arrived (seconds into the source, the span's clock); and the kernels' ms a token the
    verdict took (LAUNCH, the kernel share), which is the median of the span's windows where it has several."""
    if s.window is None or s.window_rx_ns is None:
        return None
    at_s = s.window_rx_ns / 1e9
    start_s = s.rx_ns / 1e9 - (s.span_s or 0.0)
    inside = s.windows_in_span > 0
    i = s.inputs
    k = i.kernel_ms if i is not None else None
    return {"window": "the span's latest traced window" if inside else "the latest traced window, before the span",
            "window_received_s": round(at_s, 3), "windows_in_span": s.windows_in_span, "in_span": inside,
            "s_before_span": None if inside else round(max(start_s - at_s, 0.0), 3),
            # kernel_busy_ms_per_token (else kernel_sum_ms_per_token) as the verdict read it, and of which windows
            "verdict_kernel_ms_per_token": _r(k, 4),
            "verdict_kernel_ms_from": _windows_words(s) if k is not None else None}


def kernels_from_words(s: Snapshot) -> str:
    """A report's line where the kernel figures come from a window outside the span ("" where inside)."""
    k = kernels_from_json(s)
    if k is None or k["in_span"]:
        return ""
    start_s = s.rx_ns / 1e9 - (s.span_s or 0.0)
    return (f"kernel figures: the latest traced window, received at {k['window_received_s']:g} s, before this "
            f"span ({start_s:.3f}–{s.rx_ns / 1e9:.3f} s), which traced none")


def _kv_dtype(s: Snapshot) -> str | None:
    m = s.model
    return (m.kv_dtype or m.dtype or None) if m is not None else None


def step_bytes_json(s: Snapshot) -> dict:
    """A batched engine's bytes: the DRAM counters and the model price a step (every sequence's KV, the weights
    once), named as a step's here (`bytes_per_step*`), and divided by the step's tokens where `bytes_per_token*`
    means a token's: one name, one figure, whichever the clock's mark is."""
    tps = s.tokens_per_step
    out = {"bytes_per_step": s.bytes_per_token,  # what the floor divides: a step's bytes, as its ms/step is a step's
           "bytes_per_step_measured": round(s.bytes_per_token_measured) if s.bytes_per_token_measured else None,
           "bytes_per_step_model": round(s.bytes_per_token_model) if s.bytes_per_token_model else None}
    if tps:
        out["bytes_per_token"] = s.bytes_per_token / tps if s.bytes_per_token else None
        out["bytes_per_token_measured"] = round(s.bytes_per_token_measured / tps) if s.bytes_per_token_measured else None
        out["bytes_per_token_model"] = round(s.bytes_per_token_model / tps) if s.bytes_per_token_model else None
    return out


def _clock_json(s: Snapshot) -> dict:
    """The token clock's figures over the span: the median token, its p90 and p99, the rate and what a mark is."""
    tk = s.tokens
    return {
        # the median token of the span (a counted clock: its seconds over its steps); tokens_per_s is over the mean
        "ms_per_token": round(tk.ms_per_token, 4) if tk else None,
        "ms_per_token_p90": round(tk.ms_per_token_p90, 4) if tk else None,
        "ms_per_token_p99": round(tk.ms_per_token_p99, 4) if tk else None,
        "ms_per_token_note": (("ms_per_token is the clock's intervals' seconds over the steps in them (a mean), "
                               "with the p90 and p99 over its steps, each at its interval's ms a step; tokens_per_s is its inverse"
                               if s.token_clock in MEAN_CLOCKS else
                               "ms_per_token is the median of the clock's steps, with their p90 and p99; "
                               "tokens_per_s is over their mean; "
                               + ("every step counts, those the observer's own steps slowed too (the loop's rate as "
                                  "it ran; observer_cost.slowed_tokens says how many)" if s.token_clock == STEP_STARTS
                                  else "the steps the observer's own steps overlapped are left out of both "
                                       "(observer_cost.slowed_tokens)"))
                              + ("; the clock's marks are a batched engine's decode steps: ms_per_token, "
                                 "tokens_per_s and kernels_per_token are one sequence's, whose every token takes a "
                                 "step (ms_per_step, steps_per_s and kernels_per_step name them as the step's); "
                                 "bytes_per_token* are a token's share, a step's ÷ its tokens (bytes_per_step* are "
                                 "the step's, which the floor divides); throughput_tokens_per_s counts every "
                                 "request's tokens, so throughput ÷ steps_per_s is the mean step's tokens, where "
                                 "tokens_per_step is the median step's" if s.tokens_per_step is not None else ""))
        if tk else None,
        # what one of the clock's marks is: "step" for a batched engine (tokens_per_step tokens each), else "token"
        "clock_unit": unit(s) if tk else None,
        "tokens_per_s": round(tk.tokens_per_s, 2) if tk else None,
        "token_clock": s.token_clock or None,
        "token_clock_note": _clock_note(s),
        # the steps (or tokens) the rate and its p90 and p99 rest on, and the seconds from the first to the last
        # (the steps the observer slowed, left out of the rate, among them) where the clock has boundaries of its
        # own (a clock that counts more than the span reaches back for them); provisional under PROVISIONAL_STEPS
        "clock_steps": tk.tokens if tk else None,
        "clock_span_s": _r(tk.span_s, 3) if tk else None,
        "clock_end_unix_s": _r(s.clock_end_unix_s, 3),  # where the clock's steps end, if not at span_end_unix_s
        "clock_provisional": tk.tokens < PROVISIONAL_STEPS if tk else None,
        "throughput_tokens_per_s": _r(s.throughput_tokens_per_s, 2),
    }


def host_launch_calls(s: Snapshot) -> float | None:
    """The host's launch calls a token: kernel launch calls (runtime and driver alike) plus graph launches, from
    the latest traced window (None before one)."""
    w = s.window
    if w is None:
        return None
    return round(w.kernel_launch_calls_per_token + w.graph_launches_per_token, 2)


def _window_json(s: Snapshot) -> dict:
    """What the latest traced window read: kernels and launches a token, GPU busy, the idle's causes, the
    collectives and the NVTX ranges."""
    w = s.window
    aw = s.api_window or w
    return {
        # kernels a token runs, however launched (LAUNCH divides its idle by them); a launch is a host call (the
        # help's "launch"): kernel launch calls, one kernel each, and graph launches, a whole graph each
        "kernels_per_token": round(w.kernels_per_token, 1) if w else None,
        "graph_launches_per_token": round(w.graph_launches_per_token, 2) if w else None,
        # the host's, whichever API layer made them (the kernels' correlation ids)
        "kernel_launch_calls_per_token": round(w.kernel_launch_calls_per_token, 1) if w else None,
        # those the runtime API made, from the latest window that traced its calls (an attach's second window:
        # Attach.api_every); the rest came through the driver (libraries such as cuBLAS launch some there)
        "runtime_launch_calls_per_token": (round(s.api_window.runtime_launch_calls_per_token, 1)
                                           if s.api_window is not None
                                           and s.api_window.runtime_launch_calls_per_token is not None else None),
        "host_launch_calls_per_token": host_launch_calls(s),
        "memcpys_per_token": round(w.memcpys_per_token, 2) if w else None,
        "kernel_sum_ms_per_token": round(w.kernel_sum_ms_per_token, 4) if w else None,
        # the GPU time those kernels cover: their union, kernels that run at once (two streams) counted once; the
        # step's idle (LAUNCH, the kernel share) is taken against it, the median of the span's windows where it has
        # several (kernels_from.verdict_kernel_ms_per_token)
        "kernel_busy_ms_per_token": _r(w.kernel_busy_ms_per_token, 4) if w else None,
        **_busy_json(s),
        # the idle's causes and the launch calls from the latest window that traced its launch calls
        "gap_ms_per_token": _gaps_json(aw.gap_ms_per_token) if aw else None,
        # the traced token those gaps were read in: tracing stretches it past ms_per_token, so the gaps can sum to
        # more than the untraced token
        "traced_token_ms": round(aw.traced_ms_per_token, 4) if aw else None,
        "gap_note": (("the idle gaps are read in the traced token (traced_token_ms), which tracing stretches past "
                      "ms_per_token: they can sum to more than the untraced token")
                     + ("; both are of the latest window that traced its launch calls (launch_calls_traced_s_ago), "
                        "not the kernels' window (kernels_from), so they sum with that window's kernel time, not "
                        "with kernel_busy_ms_per_token, and traced_token_busy_pct is the kernels' window's"
                        if aw is not w and w is not None else "") if aw else None),
        "launch_calls_traced_s_ago": _r(s.api_window_age_s, 1),
        # which window the figures above and the kernel table are read from: outside the span where it traced none
        "kernels_from": kernels_from_json(s),
        "collectives": collectives_json(s),
        # NVTX ranges pushed from Python inside the latest window (engine_adapter/nvtx_ranges.py)
        "nvtx_ranges": [{"name": n, "per_token": round(k, 3), "us": round(us, 2), "level": lv}
                        for n, k, us, lv in w.nvtx] if w else None,
    }


def _gaps_json(gaps: dict) -> dict:
    """The idle's causes, ms a token, with every cause said (GAP_KEYS first). A window that traced no launch calls
    cannot tell a host launching late (`host_late` null: not measured, as the timeline says) from the rest of the
    idle it leaves `unsplit`; one that traced them split every gap (`unsplit` 0)."""
    out = {k: round(gaps.get(k, 0.0), 4) for k in (*GAP_KEYS, *(k for k in gaps if k not in GAP_KEYS))}
    if "unsplit" in gaps:
        out["host_late"] = None
    return out


def _observer_json(o: dict | None) -> dict | None:
    """The observer's cost with the slowed tokens' keys always said (null where not known)."""
    return None if o is None else {**o, **{k: o.get(k) for k in SLOWED_KEYS}}


def not_measured_as_null(x):
    """`x` with every empty word (NOT_MEASURED) and every NaN or infinity made null: the summary has one way to
    say that a figure was not measured."""
    if isinstance(x, dict):
        return {k: not_measured_as_null(v) for k, v in x.items()}
    if isinstance(x, list):
        return [not_measured_as_null(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, str) and x.strip() in NOT_MEASURED:
        return None
    return x


def summary_json(s: Snapshot, kernels: int = 15) -> dict:
    """The JSON summary of `attach --json`, `replay --json` and `report --json`."""
    w = s.window
    out = {
        # first: what the figures cover (the whole recording or attach, or its last seconds: monitor/span.py)
        "span": span_json(s),
        "source": s.label, "pid": s.pid, "device": s.device, "sm_count": s.sm_count,
        "tp_degree": s.model.tp_degree if s.model else None,
        "tp_rank": s.model.tp_rank if s.model else None,
        "tokens": s.tokens_total if (s.tokens_total or s.token_clock) else None,  # no clock: none counted
        # the figures below are over span_s seconds of the feed, ending at span_end_unix_s ("span" above)
        "span_s": _r(s.span_s, 3),
        "span_end_unix_s": _r(s.span_end_unix_s, 3),
        **_clock_json(s),
        **_window_json(s),
        "bytes_per_token": s.bytes_per_token,
        "bytes_per_token_measured": round(s.bytes_per_token_measured) if s.bytes_per_token_measured else None,
        "bytes_per_token_model": round(s.bytes_per_token_model) if s.bytes_per_token_model else None,
        # the KV depth the model's bytes are priced at: the last token's, where the depth changed over the span
        "bytes_per_token_model_depth": s.depth if s.bytes_per_token_model else None,
        # the type the model's KV bytes are priced in (llama.cpp's cache: f16, q8_0, q4_0; else the weights' own)
        "bytes_per_token_model_kv_dtype": _kv_dtype(s) if s.bytes_per_token_model else None,
        "bytes_per_token_note": bytes_per_token_note(s),
        "dram_check": s.dram_check,
        "bandwidth_gbs": s.bandwidth_gbs,
        "bandwidth_source": s.bandwidth_source,
        "windows": s.windows_seen,
        "nvml": s.nvml,
        "other_gpu_pids": list(s.other_pids),
        "probe": s.probe,
        "observer_cost": _observer_json(s.observer),
        "dropped_records": s.dropped_records,
        "errors": list(s.errors),
        # frames left out as impossible (NaN, negative counts, time running backwards), with the first few reasons
        "rejected_frames": s.rejected_frames,
        "rejected_why": list(s.rejected_why),
        "kernels": kernel_rows_json(w, s.sm_count, kernels),
        "kernels_note": KERNELS_NOTE if w else None,
    }
    # the last 5 s alone, beside a longer span: the live screen's figures, the loop's state at the end
    out["rolling_5s"] = rolling_json(s, summary_json)
    return not_measured_as_null(_verdict_json(s, out))


def _per_kernel_figures(s: Snapshot, note: str | None) -> str | None:
    """us_per_kernel_note with the figures it divided, where the idle was measured: the kernels' ms are the span's
    windows' median union less collectives waiting for a late peer (the top level's kernel_busy_ms_per_token is the
    latest window's), so the arithmetic can be done again from the note alone."""
    i, d = s.inputs, s.diagnosis
    if not note or i is None or d.candidates["launch"].quantity != "idle_pct_of_step" or i.kernel_ms is None \
            or not (i.ms_per_token and i.kernels_per_token) or d.us_per_kernel is None:
        return note
    own = own_kernel_ms(i.kernel_ms, i.collective_wait_ms_per_token)
    return (f"{note}: (the {i.ms_per_token:.4g} ms {clock_kind(s.token_clock)} step − {own:.4g} ms, the kernels' "
            f"union in {_windows_words(s)}{' less collectives waiting for a late peer' if own < i.kernel_ms else ''}"
            f", floored at 0) ÷ {i.kernels_per_token:.0f} kernels = {d.us_per_kernel:.4g} µs")


def _verdict_json(s: Snapshot, out: dict) -> dict:
    """The diagnosis, a batched engine's step figures, the headline verdict and its history, after `out`."""
    out.update(s.diagnosis.as_json())
    out["us_per_kernel_note"] = _per_kernel_figures(s, out["us_per_kernel_note"])
    batched = s.tokens_per_step is not None  # a batched engine: ms/token is a step's, each sequence's latency
    if unit(s) == "step":  # the diagnosis prices one mark, a batched engine's step: its words say so, as on screen
        for c in out["candidates"].values():
            c["detail"] = in_marks(s, c["detail"])
        out.update({k: in_marks(s, out[k]) for k in ("remedy", "falsify", "predicted_win") if out[k]})
    out["tokens_per_step"] = s.tokens_per_step
    out["steps"] = s.steps_total if batched else None
    out["time_to_first_token"] = s.first_token if batched else None
    out["time_to_first_token_note"] = ("not seen: no request's arrival came with these steps (an adapter notes them "
                                       "where the engine stamps them)" if batched and s.first_token is None else None)
    out.update(step_bytes_json(s) if batched else {"bytes_per_step": None, "bytes_per_step_measured": None,
                                                   "bytes_per_step_model": None})
    # a batched engine's step figures under the step's own names (null where a mark is a token)
    out.update({step: out.get(token) if batched else None for step, token in STEP_KEYS.items()})
    out["bandwidth_floor_note"] = ("a step's floor: bytes_per_step ÷ bandwidth_gbs, against ms_per_step "
                                   "(bytes_per_token is a token's share of the step's bytes)"
                                   if batched and out.get("bandwidth_floor_ms") is not None else None)
    if out.get("dram_check"):  # what its two rates are: it checks two PM counters, not the token clock
        rate = ("bytes_per_step_measured × tokens_per_s (steps a second)" if batched else
                "bytes_per_token_measured × tokens_per_s")
        out["dram_check"] = {**out["dram_check"], "of": (
            f"{rate}: the DRAM byte counters' own rate (bytes over the clock's steps), or the traced steps' bytes "
            "where a clock read from the GPU's steps took them (the top level's dram_gbs); against PM's DRAM "
            "throughput counter × the peak (dram_pct × peak_gbs: NVML's peak, which dram_pct is a share of). Two counters of "
            "one rate: it checks neither the token clock nor bytes_per_token")}
    out["verdict"], pending = headline(s.diagnosis, s.rolling)
    out["verdict_pending"] = pending or None
    out["history"] = [c.text() for c in s.rolling.history]
    out["ended"] = s.ended or None  # why the source ended; null while it runs
    return out
