"""Plain-text renderings: the verdict and its candidates, and what watching costs the loop, in words."""

from __future__ import annotations

from decodemon.monitor.ceilings import ORDER
from decodemon.monitor.diagnosis import Diagnosis
from decodemon.monitor.numbers import said
from decodemon.monitor.safe_text import visible
from decodemon.monitor.token_clock import STEP_STARTS


def runtime_split(s) -> str:
    """How the host's kernel launch calls split between the runtime API and the driver (a library's), where a
    window traced the runtime's calls and the two differ: " (1638 through the runtime, 225 through the driver)"."""
    w, aw = s.window, s.api_window
    if w is None or aw is None or aw.runtime_launch_calls_per_token is None:
        return ""
    rt = aw.runtime_launch_calls_per_token
    drv = w.kernel_launch_calls_per_token - rt
    if round(drv) < 1:
        return ""
    when = f", the runtime's calls traced {s.api_window_age_s:.0f} s ago" if aw is not w and s.api_window_age_s else ""
    return f" ({rt:.0f} through the runtime, {drv:.0f} through the driver{when})"


def counted(n: float, one: str, many: str) -> str:
    """A count with its noun: "1 graph launch", "0 graph launches", "4 copies"."""
    return f"{n:.0f} {one if round(n) == 1 else many}"


def token_bytes(s) -> tuple[float | None, float | None]:
    """A token's bytes (measured, the model's): a batched engine's figures are its step's, so ÷ its tokens."""
    tps = s.tokens_per_step or 1.0
    return tuple((b / tps if b else None) for b in (s.bytes_per_token_measured, s.bytes_per_token_model))


def unit(s) -> str:
    """What one mark is: a batched engine's marks are steps."""
    return "step" if s.tokens_per_step is not None else "token"


_PER_TOKEN = ("ms/token", "µs/token", "launches/token", "kernels/token", "calls/token", "GB/token", "traced token",
              "median token", "mean token", "latest token", "ms token", "the token's")


def in_marks(s, text: str) -> str:
    """`text` with its per-token figures named per step where the source's marks are a batched engine's steps (the
    diagnosis prices one mark, whatever it is)."""
    if unit(s) != "step":
        return text
    for words in _PER_TOKEN:
        text = text.replace(words, words.replace("token", "step"))
    return text.replace("tok/s ceiling", "steps/s ceiling")


def diagnose_text(d: Diagnosis) -> str:
    """The verdict and the four candidates as terminal text."""
    lines = [f"ceiling: {d.ceiling.upper()}"]
    for k in ORDER:
        c = d.candidates[k]
        v = "?" if c.value is None else f"{said(c.value, 4)} {c.unit}"
        lines.append(f"  {k:<10} {c.state:<9} {v:<28} {c.detail}")
        lines.append(f"  {'':<10} threshold: {c.threshold}")  # the rule it was held to, as on screen
    if d.us_per_kernel is not None:
        lines.append(f"µs {d.per_kernel_word} per kernel: {d.us_per_kernel:.3g}")
    if d.serial_fraction is not None:
        s = d.serial_fraction
        lines.append(f"serial fraction: {s:.3f}" if 0.0 <= s <= 1.0 else
                     f"Amdahl's s solved: {s:.3f}, not a fraction (outside 0..1: no serial fraction explains that "
                     "speedup, so Amdahl's law does not apply; --json's serial_fraction is null)")
    if d.edge:  # the verdict sits on a threshold: as --json's edge and the screen say
        lines.append(f"{d.ceiling.upper()} is {d.edge}")
    lines += [f"remedy: {d.remedy}", f"predicted win: {d.predicted_win}", f"falsify: {d.falsify}"]
    return "\n".join(lines)


def slowed_part(o: dict | None) -> str | None:
    """The tokens the observer's steps overlapped, in words, or None."""
    if not o or not o.get("slowed_tokens"):
        return None
    n = o["slowed_tokens"]
    return (f"the observer overlapped {n} token{'s' if n != 1 else ''} ({', '.join(o['slowed_by'])}): "
            f"+{o['slowed_extra_ms']:.1f} ms over the others' median, left out of the loop's figures")


def left_out(s, short: bool = False) -> str:
    """", N the observer's steps slowed, left out" beside a count of clock steps (", N slowed left out" on the
    screen's header), where a marked clock left them out of its steps and its rate (step starts count every
    step); "" otherwise."""
    n = (s.observer or {}).get("slowed_tokens")
    if not n or s.token_clock == STEP_STARTS:
        return ""
    return f", {n} slowed left out" if short else f", {n} the observer's steps slowed, left out"


def observer_parts(o: dict | None) -> list[str]:
    """Session.observer_cost in words: ["watching: 21.5 ms probe + 46.4 ms tracing per window", ", one per 3.9 s =
    1.8% of the decode thread's time"] (the second only with the time between windows; nothing of windows without
    the probe's own time), the decode thread's waits and the agent thread's CPU beside them, then the tokens the
    observer's steps overlapped (slowed_part)."""
    slowed = slowed_part(o)
    agent = bool(o) and (o.get("agent_cpu_ms_per_s") is not None or o.get("decode_waits_per_s") is not None)
    if not o or (o.get("probe_ms_per_window") is None and not agent):
        return [slowed] if slowed else []
    if o.get("probe_ms_per_window") is None:
        parts = ["watching: no traced window billed in the span"]
    else:
        parts = [f"watching: {o['probe_ms_per_window']:.1f} ms probe + {o['tracing_ms_per_window']:.1f} ms tracing "
                 "per window"]
        if o.get("cupti_start_off_thread_ms"):
            parts[0] += f" (CUPTI start {o['cupti_start_off_thread_ms']:.0f} ms off-thread)"
    if o.get("share_of_loop_pct") is not None:
        parts.append(f", one per {o['window_every_s']:.1f} s = {o['share_of_loop_pct']:.1f}% of the decode "
                     "thread's time")
    if o.get("decode_waits_per_s") is not None:
        parts.append(f"; the decode thread blocked {o['decode_waits_per_s']:.0f}×/s (waits for the GIL, its own too)")
    if o.get("agent_cpu_ms_per_s") is not None:
        cpu = o["agent_cpu_ms_per_s"]
        parts.append(f"; the agent thread used {cpu:.1f} ms of CPU "
                     + (f"a second over the attach's {o['agent_cpu_over_s']:.0f} s" if o.get("agent_cpu_over_s")
                        else "in the last second it reported (an older probe: it reports its last second, not the whole "
                             "attach)")
                     + f", {cpu / 10:.1f}% of a core beside the loop (not billed to the decode thread: it "
                       "holds the loop back only while it holds the GIL)")
        apart = [f"{o[k]:.0f} ms in CUPTI's {what}" for k, what in (("cupti_start_cpu_ms", "start-up"),
                                                                     ("cupti_finalize_cpu_ms", "finalizes"))
                 if o.get(k)]
        if apart:
            parts.append(f" (and {' and '.join(apart)}, without the GIL)")
    if slowed:
        parts.append(f"; {slowed}")
    return parts


def rejected_text(s) -> str:
    """The frames a source sent that were left out as impossible (Snapshot.rejected_frames), in words."""
    n, why = s.rejected_frames, s.rejected_why
    more = f"; {len(why) - 1} other reason{'s' if len(why) > 2 else ''}" if len(why) > 1 else ""
    first = visible(why[0]) if why else "?"  # it may quote the recording (a field's name): shown, never obeyed
    return f"{n} frame{'s' if n != 1 else ''} left out as impossible ({first}{more})"
