"""DIAGNOSIS.md: the binding ceiling written down with a number per candidate, the predicted win and the
measurement that would prove it wrong."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from decodemon.monitor.analysis.agreement import busy_disagreement, kernels_past_step
from decodemon.monitor.ceilings import ORDER
from decodemon.monitor.numbers import said
from decodemon.monitor.rolling import headline
from decodemon.monitor.token_clock import GPU_STEP_CLOCKS, PROVISIONAL_STEPS, clock_kind
from decodemon.monitor.span import span_words
from decodemon.monitor.safe_text import markdown as md
from decodemon.monitor.safe_text import markdown_code, visible_lines
from decodemon.monitor.render.json import kernels_from_words
from decodemon.monitor.render.text import (counted, in_marks, left_out, observer_parts, rejected_text, runtime_split,
                                           token_bytes, unit)

if TYPE_CHECKING:
    from decodemon.monitor.snapshot import Snapshot


def _launches(s: Snapshot) -> str:
    """The launch bill in the launches panel's words: kernels, kernel launch calls, graph launches and copies a
    token, and where the launch calls were traced."""
    w = s.window
    line = (f"- {w.kernels_per_token:.0f} kernels/token: {w.kernel_launch_calls_per_token:.0f} kernel launch calls"
            f"{runtime_split(s)} · {counted(w.graph_launches_per_token, 'graph launch', 'graph launches')} · "
            f"{counted(w.memcpys_per_token, 'copy', 'copies')}")
    own = w.kernel_busy_ms_per_token if w.kernel_busy_ms_per_token is not None else w.kernel_sum_ms_per_token
    line += f"; kernel time {own:.3f} ms/token in the latest window"
    if own < w.kernel_sum_ms_per_token / 1.01:
        line += f" ({w.kernel_sum_ms_per_token:.3f} summed: some kernels run at once)"
    med = s.inputs.kernel_ms if s.inputs is not None else None
    if med is not None and f"{med:.3f}" != f"{own:.3f}":  # say which one LAUNCH reads
        line += f" (LAUNCH reads the span's windows' median, {med:.3f})"
    return line


def _per_launch(s: Snapshot) -> str:
    """What the µs idle per kernel divides by: every kernel a token runs ("" with no such figure)."""
    per, n = s.diagnosis.us_per_kernel, s.inputs.kernels_per_token if s.inputs is not None else None
    if per is None or not n:
        return ""
    graphed = s.window is not None and s.window.graph_launches_per_token >= 1
    return f"{n:.0f} kernels/token" + (" (replayed in graph launches, not launched one by one)" if graphed else "")


def _busy(s: Snapshot) -> list[str]:
    """GPU busy and where it comes from, with the flags the screen raises beside it, and PM's other counters."""
    from decodemon.monitor.probe_status import pm_silence  # with the feed, not the app (it loads the probe's policy)

    out = []
    if s.gpu_busy_pct is not None:
        out.append(f"- GPU busy {s.gpu_busy_pct:.0f}% from {s.busy_source}")
    past = kernels_past_step(s)
    apart = busy_disagreement(s.pm.get("gpu_busy_pct"), s.kernel_share_pct, s.pm_check) if s.pm and not past else None
    out += [f"- ⚠ {flag}" for flag in (past, apart) if flag]
    if s.pm:
        out.append(f"- SM active {s.pm['sm_active_pct']:.0f}%, DRAM {s.pm['dram_pct']:.1f}% of peak "
                   "(PM sampling, device-wide)")
    if s.dram_check and s.dram_check.get("apart"):  # as --json's dram_check: the floor's bytes and PM's DRAM apart
        out.append(f"- ⚠ {md(s.dram_check['apart'])}")
    silent = pm_silence(s)
    if silent:
        out.append(f"- {silent}")
    return out


# what one of each clock's steps is (token_clock.CLOCK_NOTES says how each clock reads)
STEP_WORDS = {
    "server_metrics": "one decode step of the server's own counter, read at intervals",
    "mark_bursts": "one mark of a burst, timed over whole bursts",
    "replay_count": "one CUDA graph replay the agent counted",
    "step_starts": "from one step's embedding lookup to the next",
    "graph replays": "one of the GPU's graph replays in a traced window",
    "kernel period": "one period of the GPU's kernels in a traced window",
}


def _tokens_counted(s: Snapshot) -> str:
    """What the clock's steps span, in tokens: a clock step runs from one token mark to the next, so N tokens
    counted give N - 1 steps; and the source's tokens in all where the span holds fewer."""
    # the screen's "tokens timed" are these steps: one count under the name --json gives it (clock_steps)
    step = STEP_WORDS.get(s.token_clock, "from one token mark to the next")
    words = f" (a clock step, one the screen's tokens timed: {step})"
    if s.token_clock in GPU_STEP_CLOCKS:  # the GPU's steps in the traced windows alone
        return words + ", in the traced windows alone" + _provisional(s)
    if s.span_tokens is not None:
        words += f", {s.span_tokens} tokens counted"
        if s.tokens_total > s.span_tokens:
            words += f" of {s.tokens_total} in all"
    elif s.tokens_total:
        words += f", {s.tokens_total} tokens in all"
    return words + _provisional(s)


def _provisional(s: Snapshot) -> str:
    """As --json's clock_provisional: a rate from fewer than PROVISIONAL_STEPS steps says so."""
    if s.tokens is None or s.tokens.tokens >= PROVISIONAL_STEPS:
        return ""
    return f"; provisional: the rate rests on fewer than {PROVISIONAL_STEPS} steps"


def _gb(b: float) -> str:
    """Bytes in GB to the MB (1.252), or to 3 significant digits where that would read 0.000 (a tiny CPU model's
    685 kB: 0.000685)."""
    return f"{b / 1e9:.3f}" if b >= 1e7 or not b else f"{b / 1e9:.3g}"


def _figures(s: Snapshot) -> list[str]:
    """The measured figures as bullet lines: token clock, launches, GPU busy and PM counters, the bandwidth floor."""
    d, tk, w = s.diagnosis, s.tokens, s.window
    out = []
    if tk and s.tokens_per_step is not None:  # a batched engine: a step is the mark, and makes a token a sequence
        out.append(f"- {tk.ms_per_token:.3f} ms/step {clock_kind(s.token_clock)} (p90 {tk.ms_per_token_p90:.3f}), "
                   f"{tk.tokens_per_s:.1f} steps/s over {tk.tokens} clock steps{left_out(s)}; "
                   f"{s.tokens_per_step:g} tokens/step; "
                   f"{s.throughput_tokens_per_s or 0:.1f} tokens/s in all (the tokens counted, not steps/s × "
                   f"tokens/step){_provisional(s)}")
    elif tk:
        out.append(f"- {tk.ms_per_token:.3f} ms/token {clock_kind(s.token_clock)} (p90 {tk.ms_per_token_p90:.3f}), "
                   f"{tk.tokens_per_s:.1f} tokens/s over {tk.tokens} clock steps{left_out(s)}{_tokens_counted(s)}")
    if w:
        elsewhere = kernels_from_words(s)  # the span traced no window: say whose kernel figures these are
        out += [f"- ⚠ {elsewhere}"] if elsewhere else []
        out.append(_launches(s))
    over = _per_launch(s)
    if over:
        out.append(f"- {d.us_per_kernel:.2f} µs {d.per_kernel_word} per kernel, over {over}")
    out += _busy(s)
    if s.pm_check is not None:
        c = s.pm_check
        n = f"{c.samples} PM sample" + ("s" if c.samples != 1 else "")
        where = "the traced tokens" if s.windows_in_span else "the latest traced window's tokens, before the span"
        out.append(f"- over {where}, the same {n}: GPU busy {c.pm_busy_pct:.1f}% from "
                   f"PM's counter, {c.traced_busy_pct:.1f}% from the traced kernels' union over those samples "
                   "(--json pm_vs_window)")
    tps = s.tokens_per_step or 1.0
    measured, model = token_bytes(s)
    if measured or model:  # a token's bytes, both figures where both came (a batched step's are in --json)
        kv = s.model.kv_dtype if s.model is not None else None
        priced = (f"weights + {kv + ' ' if kv else ''}KV at depth {s.depth}, the latest reported" if s.depth else
                  "weights alone, no KV depth reported")
        priced = f" ({priced}" + (f"; a step's ÷ its {tps:g} tokens)" if tps != 1.0 else ")")
        out.append("- bytes a token: " + ", ".join(
            x for x in (f"{_gb(measured)} GB measured (PM DRAM over the tokens counted)" if measured else "",
                        f"the model's {_gb(model)} GB{priced}" if model else "") if x))
    if d.bandwidth_floor_ms is not None:  # a batched engine's floor is a step's: the step's bytes (the snapshot's)
        mark = unit(s)
        out.append(f"- bandwidth floor {d.bandwidth_floor_ms:.3f} ms/{mark} "
                   f"({_gb(s.bytes_per_token or 0)} GB/{mark} at {s.bandwidth_gbs:.0f} GB/s, "
                   f"{md(s.bandwidth_source)})")
    return out


def diagnosis_markdown(s: Snapshot) -> str:
    """DIAGNOSIS.md for one snapshot: binding ceiling, a number per candidate, predicted win, falsification.
    What the target or the recording supplied (the source's name, the GPU's, the reason it ended, kernel names)
    is escaped: it can make no link, HTML or table cell, and sends no escape sequence to a terminal."""
    d, w = s.diagnosis, s.window
    source = f"pid {s.label}" if s.label.isdigit() else s.label  # a pid attached by its number alone
    out = [
        "# DIAGNOSIS",
        "",
        f"Source: {md(source)} · device: {md(s.device)}{f' ({s.sm_count} SMs)' if s.sm_count else ''} · written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} by decodemon",
        "",
        span_words(s) + ".",  # what the figures below cover (monitor/span.py)
        "",
    ]
    if s.ended and s.ended != "detached":  # a detach is how an attach or a record ends: nothing to say
        out += [f"The source ended: {md(s.ended)}. What follows is what arrived before.", ""]
    if s.rejected_frames:
        them = "it" if s.rejected_frames == 1 else "them"
        out += [f"{md(rejected_text(s))}: the figures below are read without {them}.", ""]
    out += [f"## Binding ceiling: **{d.ceiling.upper()}**", ""]
    _, pending = headline(d, s.rolling)
    if pending:  # the screen's and --json's words
        out += [f"{d.ceiling.upper()} {md(pending)}.", ""]
    if d.edge:  # the verdict sits on a threshold: the screen's and --json's words
        out += [f"{d.ceiling.upper()} is {md(d.edge)}.", ""]
    out += _figures(s)
    out += ["", "## The four candidates", "", "| ceiling | state | number | threshold | detail |",
            "|---|---|---|---|---|"]
    for k in ORDER:
        c = d.candidates[k]
        v = "?" if c.value is None else f"{said(c.value, 4)} {c.unit}"
        if k == "launch" and c.value is not None and d.us_per_kernel is not None and _per_launch(s):
            # the seeds' figure beside it, and what it divides by: kernels, not the kernel launch calls
            v += f" ({d.us_per_kernel:.3g} µs {d.per_kernel_word} per kernel, {_per_launch(s)})"
        out.append(f"| {k.upper()} | {c.state} | {v} | {c.threshold} | {md(c.detail)} |")  # it names kernels
    if w and w.kernels:
        out += ["", "## Kernels that leave the most SMs idle (grid vs SMs)", "",
                "| kernel | calls/token | µs/token | idle-SM µs/token | grid | SM coverage | warp occupancy limit |",
                "|---|---|---|---|---|---|---|"]
        for r in sorted(w.kernels, key=lambda r: -r.idle_sm_us_per_token)[:5]:
            out.append(f"| {markdown_code(r.label, cell=True)} | {r.calls_per_token:.1f} "
                       f"| {r.us_per_token:.0f} "
                       f"| {r.idle_sm_us_per_token:.0f} | {r.grid_blocks}/{s.sm_count} "
                       f"| {r.grid_coverage_pct:.0f}% | {r.occupancy_pct:.0f}% |")
    out += ["", "## First change and predicted win", "", f"- remedy: {d.remedy}",
            f"- prediction: {d.predicted_win or 'none: no ceiling is claimed'}",
            "", "## The measurement that would prove this wrong", "", d.falsify, ""]
    watching = "".join(observer_parts(s.observer))
    if watching:  # the screen's timeline words: what the probe took from the loop while it measured
        out += ["## What watching cost", "", md(watching[0].upper() + watching[1:]) + ".", ""]
    hist = [c.text() for c in s.rolling.history]
    if hist:
        out += ["## Verdict history (a diagnosis has a shelf life)", "",
                "The source's verdict changes from its start to the span's end, those before the span among them "
                "(each at its UTC time).", ""] + [f"- {h}" for h in hist] + [""]
    # no control character anywhere else either; the file ends in one newline, as a text file does
    return visible_lines(in_marks(s, "\n".join(out))).rstrip("\n") + "\n"
