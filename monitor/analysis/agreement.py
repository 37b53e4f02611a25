"""Two instruments that measure the same quantity, and what to say when they disagree by more than 1.5×.

GPU busy is read two ways: PM's compute-busy counter (device-wide, over the last seconds) and the kernels' share
of the step in the traced window (one process, over the traced tokens). They differ for known reasons: a traced
token is stretched by CUPTI's own cost, so kernels cover less of it; PM counts every process on the GPU; a host
that marks ahead of the GPU cuts the step short. A screen that shows both numbers says which, and why.
"""

from __future__ import annotations

from decodemon.monitor.ceilings import own_kernel_ms
from decodemon.monitor.token_clock import clock_kind

FLAG_RATIO = 1.5


def busy_disagreement(pm_busy_pct: float | None, traced_share_pct: float | None, pm_check=None) -> str | None:
    """One line when PM's GPU busy and the traced kernels' share of the step are more than FLAG_RATIO apart, with
    the likely reason; None when they agree or one is missing. `pm_check` (Snapshot.pm_check): PM's own busy over
    the traced tokens; where it agrees with the kernels, PM's average over the span is what stands apart."""
    if pm_busy_pct is None or traced_share_pct is None or pm_busy_pct <= 0 or traced_share_pct <= 0:
        return None
    hi, lo = max(pm_busy_pct, traced_share_pct), min(pm_busy_pct, traced_share_pct)
    if hi / lo <= FLAG_RATIO:
        return None
    near = getattr(pm_check, "pm_busy_pct", None)
    if near and max(near, traced_share_pct) / min(near, traced_share_pct) <= FLAG_RATIO:
        why = (f"over the traced tokens PM itself read {near:.1f}%, as the kernels do, so the span's average is what "
               f"stands apart: the GPU was {'busier' if pm_busy_pct > near else 'idler'} outside the traced window "
               "(another process, or a loop that changed over the span)")
    elif pm_busy_pct > traced_share_pct:
        why = ("the traced step is stretched by CUPTI's own cost, its marks were made ahead of the GPU (its kernels "
               "ran after them), or another process keeps the GPU busy (PM counts the whole device)")
    else:
        why = "the traced step is cut short by marks made ahead of the GPU, or PM's samples missed the traced tokens"
    return (f"GPU busy {pm_busy_pct:.0f}% (PM) against kernels {traced_share_pct:.0f}% of the step (traced "
            f"window): {hi / lo:.1f}× apart; {why}")


def kernels_past_step(s) -> str:
    """Where the traced kernels' time (their union: kernels that run at once count once) is longer than the median
    step of snapshot `s`: said, never clipped to 100% ("" otherwise)."""
    i = s.inputs
    if i is None or i.kernel_ms is None or not i.ms_per_token:
        return ""
    own = own_kernel_ms(i.kernel_ms, i.collective_wait_ms_per_token)  # a late peer's wait is idle
    if own <= i.ms_per_token:
        return ""
    kind = clock_kind(getattr(s, "token_clock", None))  # a sweep's band has no clock of its own: its median
    return (f"kernels {own:.3g} ms are {100 * own / i.ms_per_token:.0f}% "
            f"of the {i.ms_per_token:.4g} ms {kind} step: traced kernels run longer than untraced ones")


DRAM_CHECK_PCT = 10.0  # bytes per token × tokens a second against PM's DRAM share of the peak: apart by more is said


def dram_check(bytes_per_token: float | None, tokens_per_s: float | None, dram_pct: float | None,
               peak_gbs: float | None) -> dict | None:
    """Bytes per token times tokens a second (the DRAM byte counters' rate over the span, as bytes a token are
    that rate over the tokens counted) against PM's DRAM throughput counter, a share of the device's peak (NVML's
    figure, which is what PM's percentage is of): two counters that should tell one rate. None when any is
    missing; "apart" names a disagreement over DRAM_CHECK_PCT."""
    if not (bytes_per_token and tokens_per_s and dram_pct and peak_gbs):
        return None
    by_tokens = bytes_per_token * tokens_per_s / 1e9
    by_pm = dram_pct / 100.0 * peak_gbs
    off = 100.0 * (by_tokens / by_pm - 1.0)
    out = {"bytes_x_tokens_per_s_gbs": round(by_tokens, 1), "pm_dram_pct_x_peak_gbs": round(by_pm, 1),
           "peak_gbs": round(peak_gbs, 1), "off_pct": round(off, 1) + 0.0, "apart": None}  # + 0.0: never -0.0
    if abs(off) > DRAM_CHECK_PCT:
        out["apart"] = (f"bytes per token × tokens/s is {by_tokens:.0f} GB/s, PM's DRAM {dram_pct:.0f}% of "
                        f"{peak_gbs:.0f} GB/s is {by_pm:.0f}: {off:+.0f}%; either the steps the clock counts do not cover the seconds PM "
                        "averages over (the GPU idle between bursts or generations), or bytes per token were taken "
                        "over other GPU time than those steps")
    return out


def bytes_note(measured: float | None, model: float | None) -> str | None:
    """When the DRAM counters and the model disagree by more than 2x: the three parts of bytes per token."""
    if not (measured and model):
        return None
    r = measured / model
    if 0.5 <= r <= 2.0:
        return None
    return (f"DRAM read {r:.2g}x the model's bytes per token: count the three parts (the weights actually read, "
            "e.g. active experts, not all; the KV cache at this depth; activations and writes) before pricing "
            "the floor")


def _no_depth_note(s) -> str | None:
    """The model's bytes priced with no KV where tokens were made but no depth came with them (a recording of
    llama-server made before its /slots depth was read, or an engine that reports none)."""
    m = s.model
    if s.bytes_per_token_model and not s.depth and s.tokens_total and m is not None and m.kv_bytes_per_position:
        return ("the model's bytes are its weights alone: no KV depth came with these tokens, so the KV cache "
                f"({m.kv_bytes_per_position} bytes a position) is not counted")
    return None


def bytes_per_token_note(s) -> str | None:
    """What snapshot `s`'s bytes per token are where a reader could take them for what they are not: the model's
    and the counters' over 2x apart; the model's weights alone (no depth came); the model's where no DRAM counter
    read the span (bytes_per_token is then not measured)."""
    note = bytes_note(s.bytes_per_token_measured, s.bytes_per_token_model) or _no_depth_note(s)
    if s.bytes_per_token_model and not s.bytes_per_token_measured:
        pct = (s.pm or {}).get("dram_pct")
        why = (f"PM read DRAM throughput ({pct:.1f}% of the peak: dram_pct) but no DRAM byte counts over these "
               "tokens" if pct else "no DRAM counters read this span")
        model = note or "bytes_per_token is the model's (bytes_per_token_model: its weights + KV at the depth reported)"
        note = f"{model}; not measured: {why}"
    return note
