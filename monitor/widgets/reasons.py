"""How the verdict was reached, in words for the verdict panel: each candidate's inputs with where each came from,
and the one sentence that decides between candidates (plain functions of a snapshot, no Textual).

Everything here reads the snapshot's own figures (`Snapshot.inputs`, the candidates, the sources); nothing is
re-derived, so the screen says what the diagnosis was given.
"""

from __future__ import annotations

from decodemon.monitor.analysis.agreement import kernels_past_step
from decodemon.monitor.ceilings import BINDING, ORDER, UNKNOWN, own_kernel_ms, peer_wait_named
from decodemon.monitor.numbers import bandwidth_short
from decodemon.monitor.render.text import in_marks, unit  # noqa: F401 - the widgets' words for a mark
from decodemon.monitor.rolling import headline
from decodemon.monitor.token_clock import clock_kind
from decodemon.monitor.widgets.format import value_words
from decodemon.monitor.widgets.probe_words import has_no_gpu

# a traced window's NCCL kernels this much of its kernel time while COMM prices the step under 10%: the kernels
# mostly waited for a peer (both ranks traced in the same tokens run late by turns)
PEER_WAIT_SHARE_PCT = 20.0


def span_words(s) -> str:
    """The seconds the figures cover, as the panels name them ("5 s"; "" when not known)."""
    if not s.span_s:
        return ""
    return f"{s.span_s:.0f} s" if s.span_s >= 1 else f"{s.span_s:.1g} s"


def per(s) -> str:
    """ms per mark, named for what the mark is."""
    return f"ms/{unit(s)}"


def clock_span_words(s) -> str:
    """The seconds ms/token's median and tok/s's mean are over, as the header and the candidates both name them:
    the clock's own seconds where they are not the span's (a clock reaching back for its steps, or marks that
    began inside the span: " over 0.2 s"), else the span's (" of the last 5 s"); "" when neither is known."""
    tk = s.tokens
    if tk and tk.span_s and s.span_s and abs(tk.span_s / s.span_s - 1) > 0.2:
        return f" over {tk.span_s:.1f} s"
    return f" of the last {span_words(s)}" if s.span_s else ""


def ms_source(s) -> str:
    """What ms/token is: the median of the clock's steps, over the seconds the header names, and its clock."""
    tk = s.tokens
    timed = f", {tk.tokens} {unit(s)}s timed" if tk else ""
    clock = f", {s.token_clock}" if s.token_clock else ""
    return f"{clock_kind(s.token_clock)}{clock_span_words(s)}{timed}{clock}"


def bytes_short(s) -> str:
    """Where bytes per token came from: PM's DRAM counters or the model's facts."""
    b = s.inputs.bytes_per_token if s.inputs else None
    if b is not None and s.bytes_per_token_measured and abs(b - s.bytes_per_token_measured) <= 1e-6 * b:
        return "PM DRAM counters"
    if b is not None and s.bytes_per_token_model:
        # a depth of 0 where tokens were made: the engine reported none (a batch's steps), so no KV is counted
        kv = f"{s.model.kv_dtype} KV" if s.model is not None and s.model.kv_dtype else "KV"
        return (f"model: weights + {kv} at depth {s.depth}" if s.depth or not s.tokens_total
                else "model: weights only, no depth reported, so no KV counted")
    return "?"


def _windows(s) -> str:
    return f"traced windows of the last {span_words(s)}" if s.span_s else "traced windows"


def _bandwidth(s, c) -> str:
    i = s.inputs
    floor = s.diagnosis.bandwidth_floor_ms
    if floor is not None and i.bytes_per_token and i.bandwidth_gbs:
        # two equations, each of which holds: the ratio, then the floor it divides by
        return (f"{i.ms_per_token:.4g} {per(s)} ({ms_source(s)}) ÷ floor {floor:.3g} ms = {c.value:.3g}×; "
                f"floor {floor:.3g} ms = {i.bytes_per_token / 1e9:.3g} GB/{unit(s)} ({bytes_short(s)}) ÷ "
                f"{i.bandwidth_gbs:.4g} GB/s ({bandwidth_short(s.bandwidth_source)})")
    if c.value is not None and i.dram_gbs and i.bandwidth_gbs:
        return (f"{i.bandwidth_gbs:.4g} GB/s ({bandwidth_short(s.bandwidth_source)}) ÷ {i.dram_gbs:.4g} GB/s DRAM "
                "moved (PM counters): no token count needed")
    return c.detail


def peer_wait(s) -> str:
    """The both-ranks-traced artefact where it applies: NCCL kernels a large part of the kernel time, mostly waiting
    for a late peer, while COMM prices only the calls' own latency ("" where it does not apply)."""
    w, i = s.window, s.inputs
    if w is None or i is None or not w.collective_calls_per_token or not w.kernel_sum_ms_per_token:
        return ""
    nccl_pct = 100 * w.collective_ms_per_token / w.kernel_sum_ms_per_token
    wait = w.collective_wait_ms_per_token
    if nccl_pct < PEER_WAIT_SHARE_PCT or wait <= 0.5 * w.collective_ms_per_token:
        return ""
    return (f"NCCL kernels are {nccl_pct:.0f}% of the latest window's kernel time, {wait:.3g} of their "
            f"{w.collective_ms_per_token:.3g} ms/token waiting for a late peer: ranks traced in the same tokens run "
            "late by turns, so COMM prices each call at its own latency, not the wait")


def _comm(s, c) -> str:
    i = s.inputs
    if c.value is None or not i.collectives_per_token or i.us_per_collective is None:
        return c.detail
    traced = s.window is not None and bool(s.window.collective_calls_per_token)
    src = (f"a call priced at its kernel when not waiting plus its launch gap, the lowest of the {_windows(s)}"
           if traced else "a call timed by the engine's clock around it")
    out = (f"{i.collectives_per_token:g} calls/{unit(s)} × {i.us_per_collective:.3g} µs = "
           f"{i.collectives_per_token * i.us_per_collective / 1e3:.3g} ms of {i.ms_per_token:.4g} {per(s)} ({clock_kind(s.token_clock)}); "
           f"{src}")
    wait = peer_wait(s)
    return out + (f"; {wait}" if wait else "")


def _launch(s, c) -> str:
    i = s.inputs
    if c.value is None:
        return c.detail
    if i.kernel_ms is not None and i.kernels_per_token:
        # as the diagnosis counts it: a collective spinning while it waits for a late peer is the step's idle
        kernels = own_kernel_ms(i.kernel_ms, i.collective_wait_ms_per_token)
        wait = i.kernel_ms - kernels
        idle = max(i.ms_per_token - kernels, 0.0)
        waiting = f"; less {wait:.3g} ms NCCL waiting for a peer" if peer_wait_named(wait, i.ms_per_token) else ""
        graphs = i.graph_launches_per_token or 0
        # kernels are what it divides by; how they were launched is the launches panel's count of calls
        how = (f"replayed in {graphs:.0f} graph launch{'es' if round(graphs) != 1 else ''}, not launched one by one"
               if graphs >= 1 else "each launched by the host")
        out = (f"GPU idle {idle:.3g} ms = {i.ms_per_token:.4g} {per(s)} ({clock_kind(s.token_clock)}) − {kernels:.3g} ms "
               f"of kernels{i.kernels_overlap_words} ({_windows(s)}{waiting}): {100 * idle / i.ms_per_token:.0f}% of the step; "
               f"{idle:.3g} ms ÷ {i.kernels_per_token:.0f} kernels/{unit(s)} (traced; {how}) = "
               f"{1e3 * idle / i.kernels_per_token:.3g} µs idle per kernel")
        past = kernels_past_step(s)
        if past:
            out += f"; ⚠ {past}"
        if c.state != BINDING and idle / i.ms_per_token >= 0.5:
            out += f"; {c.detail.rsplit('; ', 1)[-1]}"
        return out
    if i.kernels_per_token is None and i.gpu_busy_pct is not None:
        return (f"GPU idle {c.value:.0f}% = 100% − GPU busy {i.gpu_busy_pct:.0f}% from {s.busy_source}; "
                "no traced window")
    return c.detail


def _occupancy(s, c) -> str:
    i = s.inputs
    if c.value is None:
        return c.detail
    parts = []
    if i.small_grid_share_pct is not None:
        parts.append(f"{i.small_grid_share_pct:.0f}% of kernel time in grids under 25% of {i.sm_count or '?'} SMs "
                     f"({_windows(s)})")
    step = s.kernel_share_pct  # the kernel share: what its 50% rule reads where a window is traced, before PM
    if step is not None:
        parts.append(f"kernel share {step:.0f}% of the step (traced kernels' time ÷ ms/{unit(s)}: its 50% rule "
                     "reads this)")
    if i.gpu_busy_pct is not None and not (step is not None and s.busy_source.startswith("the kernel share")):
        rule = "" if step is not None else ": its 50% rule reads this, no window traced"
        parts.append(f"GPU busy {i.gpu_busy_pct:.0f}% from {s.busy_source}{rule}")
    if i.sm_active_pct is not None:
        share = 100 * i.sm_active_pct / i.gpu_busy_pct if i.gpu_busy_pct else None
        near = share is not None and 45 <= share < 55  # one decimal, where rounding would cross its half
        ratio = "" if share is None else f", {share:.1f}% of GPU busy" if near else f", {share:.0f}% of GPU busy"
        if share is not None and round(share) > 100:  # shown as ≥100% beside the candidate: why it is past 100
            ratio += " (past 100%: the two counters are sampled apart, so read it as SMs active all the busy time)"
        parts.append(f"SM active {i.sm_active_pct:.0f}% from PM counters{ratio}")
    return "; ".join(parts) or c.detail


WHY = {"bandwidth": _bandwidth, "comm": _comm, "launch": _launch, "occupancy": _occupancy}


def inputs_line(s, name: str) -> str:
    """One candidate's number as it was reached: its inputs, each with where it came from."""
    c = s.diagnosis.candidates[name]
    if s.inputs is None:
        return c.detail
    line = WHY[name](s, c)
    rule = _clause(c.detail, "binds:", "ruled out:")  # a rule beyond the threshold decided its state: said
    return f"{line}; {rule}" if rule and rule not in line else line


def _clause(detail: str, *keys: str) -> str:
    """The clause of a candidate's detail that holds one of `keys` ("" if none)."""
    return next((p.strip() for p in detail.split("; ") if any(k in p for k in keys)), "")


def decides(s) -> str:
    """The one sentence that decides the verdict between the candidates."""
    cands = s.diagnosis.candidates
    ceiling, _ = headline(s.diagnosis, s.rolling)
    if has_no_gpu(s):
        return ("no GPU in the target: bandwidth, launches and grids cannot be priced, and no ceiling is claimed; "
                + ("ms/token is the figure measured" if s.tokens is not None else
                   "ms/token is the figure, once a token is marked"))
    binding = [k for k in ORDER if cands[k].state == BINDING]
    order = ", ".join(k.upper() for k in ORDER)
    if len(binding) > 1:
        return (f"{' and '.join(k.upper() for k in binding)} both bind: the verdict is the first in the method's order "
                f"({order}), {binding[0].upper()}")
    if ceiling in cands:
        c = cands[ceiling]
        resolved = _clause(c.detail, "binds:")
        if resolved:  # no candidate bound outright: the kernels fill the step, and the counters chose
            return f"{ceiling.upper()} {resolved}"
        held = [k for k in ORDER if k != ceiling and cands[k].state == UNKNOWN and cands[k].value is not None]
        for k in held:
            why = _clause(cands[k].detail, "so grids", "does not rule", "counters alone")
            if why:
                busy = s.inputs.gpu_busy_pct if s.inputs else None
                gate = ""
                if "so grids" in why and "kernel share is" in why:  # the step's own idle, LAUNCH's figure
                    gate = " (under the 50% its rule needs" + (
                        f"; PM's GPU busy reads {busy:.0f}%, device-wide over the span)" if s.pm and busy is not None
                        else ")")
                elif "so grids" in why and s.kernel_share_pct is not None:  # the figure its rule reads
                    gate = f" (kernel share {s.kernel_share_pct:.0f}% of the step, under the 50% its rule needs)"
                elif "so grids" in why and busy is not None:
                    gate = f" (GPU busy {busy:.0f}%, under the 50% its rule needs)"
                value = value_words(cands[k].value, cands[k].unit)
                # the headline first: the sentence is why the other candidate past its figure does not take it
                return f"{ceiling.upper()} binds, not {k.upper()}: {k.upper()} is unknown at {value}: {why}{gate}"
        return f"{ceiling.upper()} is the only candidate past its threshold"
    remedy = s.diagnosis.remedy
    for lead in ("measure more: ", "measure "):
        if remedy.startswith(lead):
            return f"no candidate is past its threshold; what would decide: {remedy[len(lead):]}"
    return "no candidate is past its threshold"


def history_note(s) -> str:
    """Where the recorded history's last verdict is not the headline: why both stand ("" where they agree)."""
    r = s.rolling
    ceiling, pending = headline(s.diagnosis, r)
    if pending or not r.history or r.history[-1].after == ceiling:
        return ""
    now = "nothing binds" if ceiling == "unknown" else f"{ceiling.upper()} binds"
    return (f"the history's last verdict is {r.history[-1].after.upper()}; over the last {span_words(s) or 'span'} "
            f"{now} (a change is recorded once it holds {r.hold} windows in a row)")
