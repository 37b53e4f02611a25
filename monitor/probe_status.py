"""The probe's status in words: wire.ProbeStatus (fields with units) in, a dict of short texts out.

The probe sends words and numbers, never sentences; the monitor writes the sentences here, in one place. Also:
merging the status frames of one source (the agent's and its NVML sidecar's each say part of it), and reading
the wire-version-1 `Stats` dict that older recordings carry back into a ProbeStatus.
"""

from __future__ import annotations

import re

import msgspec

from decodemon.probes import policy, wire

PM_FIRST_SESSION_NOTE = ("first PM session in this process: on an H200 it left a graphed loop ~13% faster for the "
                         "rest of the process (clocks unchanged, +16 W) after ~0.3 s of slow tokens; compare "
                         "unobserved speeds taken after it, or attach with --no-pm")

REASONS = {
    "no_gpu": "no GPU",
    "no_permission": ("no permission for GPU performance counters: run as root or set the nvidia module option "
                      "NVreg_RestrictProfilingToAdminUsers=0; traced windows still work"),
    "hardware_busy": "counters held by another profiler (DCGM, Nsight, or an earlier session still releasing them)",
    "foreign_profiler": "torch.profiler is recording in the target",
    "sidecar_exited": "sidecar exited",
    "not_importable": "cupti-python is not in decodemon's own environment (pip install 'decodemon[gpu]' there)",
    "no_library": "no CUPTI library for the agent's windows",
    "library": "decodemon's CUPTI library did not load in the target",
    "libcupti": "no libcupti that PM sampling works with",
    "no_python": ("watched from outside: no Python in the process for an agent; a traced window needs CUPTI loaded "
                  "at its start (CUDA_INJECTION64_PATH)"),
}
_PAUSED = ("torch.profiler is recording in the target: no window opens while it runs (its CUPTI session would end "
           "with ours)")
_CLOCK_REASONS = {"no_marks": "no token marks for 2 s", "bursts": "token marks come in bursts: the host runs ahead "
                  "of the GPU", "native": "a process with no Python: decodemon's CUPTI injection library traces by time"}
# a word and the fields said with it: when a frame says the word, its reason and error come with it (even empty)
_GROUPS = {"gpu": ("gpu_error",), "trace": ("trace_reason", "trace_error"),
           "pm": ("pm_reason", "pm_error", "pm_holders", "pm_lib"),
           "nvml": ("nvml_reason", "nvml_error"), "window_clock": ("window_clock_reason",)}
_DEFAULTS = {f: getattr(wire.ProbeStatus(), f) for f in wire.ProbeStatus.__struct_fields__}


def merge(old: wire.ProbeStatus, new: wire.ProbeStatus) -> wire.ProbeStatus:
    """`old` with what `new` says: every field `new` sets away from its default, a word with its reason."""
    changes = {}
    grouped = {f for fields in _GROUPS.values() for f in fields}
    for f in wire.ProbeStatus.__struct_fields__:
        v = getattr(new, f)
        if f in grouped or v == _DEFAULTS[f]:
            continue
        changes[f] = v
        for g in _GROUPS.get(f, ()):
            changes[g] = getattr(new, g)
    return msgspec.structs.replace(old, **changes) if changes else old


def _word(word: str, reason: str, error: str, detail: str = "") -> str:
    """"word (reason in words; error; detail)", leaving out what is empty."""
    inner = "; ".join(p for p in (REASONS.get(reason, ""), error, detail) if p)
    return f"{word} ({inner})" if inner else word


def pm_lost_words(full_pumps: int, overflow_pumps: int, image_samples: int, interval_us: int,
                  pump_s: float) -> str | None:
    """What PM sampling has lost in this session, in words, or None."""
    parts = []
    if full_pumps:
        parts.append(f"{full_pumps} pumps found more samples than their {image_samples}-sample image holds and "
                     f"dropped the rest")
    if overflow_pumps:
        parts.append(f"the hardware buffer overflowed at {overflow_pumps} pumps (the newest samples are dropped)")
    if not parts:
        return None
    return "; ".join(parts) + (f" (the agent thread was held up, or sampling every {interval_us} us outruns a "
                               f"pump every {pump_s:g} s: try a longer interval: --probe pm_interval_us=N)")


def pm_lost_of(pm) -> str | None:
    """pm_lost_words from a sampler-like object (full_pumps, overflows, max_samples, interval_us, pump_s)."""
    return pm_lost_words(pm.full_pumps, pm.overflows, pm.max_samples, pm.interval_us, getattr(pm, "pump_s", 1.0))


# seconds after the first frame with PM armed and no sample before the screen says so
PM_SILENT_AFTER_S = 3.0


def pm_silence(s) -> str | None:
    """PM armed in a snapshot `s` with no sample: silent since the attach, or, where samples came before, over the
    span its figures cover; said once PM_SILENT_AFTER_S have passed (None otherwise)."""
    pm_word = str(s.probe.get("pm") or "")
    if s.pm or not pm_word.startswith("armed"):
        return None
    had = any(v == v for v in (s.series or {}).get("gpu_busy_pct", ()))
    seconds = (s.span_s or 0.0) if had else s.rx_ns / 1e9
    return pm_silent_words(pm_word, seconds, s.busy_source) if seconds >= PM_SILENT_AFTER_S else None


def pm_silent_words(pm: str, seconds: float, busy_source: str) -> str:
    """PM armed with no sample after `seconds`: said, with what that leaves."""
    where = "in the target's agent thread" if "in process" in pm else "in the sidecar"
    return (f"PM sampling: armed {where}, but no sample in {seconds:.0f} s and no error or loss reported: GPU busy "
            f"comes from {busy_source}; SM active and DRAM are not measured")


def _pm_cpu(s: wire.ProbeStatus) -> str | None:
    if s.pm_cpu_ms_per_pump is None or s.pm_pumps < 2:
        return None
    text = (f"{s.pm_cpu_ms_per_pump:.2f} ms of agent CPU per pump outside GIL-free libcupti calls, "
            f"{s.pm_image_reset_ms_per_pump or 0.0:.2f} of it resetting {s.pm_image_reset_bytes / 2**20:.1f} MB of "
            f"the counter-data image, the part the last decode wrote ({s.pm_pumps - 1} pumps; the first, with all "
            f"the samples since the arm, {s.pm_first_pump_cpu_ms or 0.0:.1f} ms)")
    if s.pm_held_calls and s.pm_handbacks_per_pump is not None:
        text += (f"; {s.pm_held_calls} short calls held the GIL, given up {s.pm_handbacks_per_pump:.1f}x per pump "
                 "between them")
    return text


def _pm(s: wire.ProbeStatus) -> str:
    detail = ""
    if s.pm == "armed":
        where = "in process" if s.pm_where == "in_process" else "in the sidecar" if s.pm_where == "sidecar" else ""
        bits = [b for b in (where, f"{s.pm_interval_us} us interval" if s.pm_interval_us else "",
                            "DRAM bytes" if s.pm_dram_bytes else "") if b]
        detail = ", ".join(bits)
    if s.pm_lib:
        detail = (detail + "; " if detail else "") + f"libcupti {s.pm_lib}"
    if s.pm_reason == "hardware_busy":
        detail = ("held by " + ", ".join(s.pm_holders)) if s.pm_holders else "no counter-taking profiler seen on "\
            "this host (one in another container, or a driver still releasing them)"
    text = _word(s.pm, s.pm_reason, s.pm_error, detail)
    if s.pm_restarts:
        text += f"; re-armed {s.pm_restarts}x after {s.pm_restart_cause or 'an error'}"
    if s.pm == "armed" and s.pm_armed_after_s is not None:
        text += f"; armed {s.pm_armed_after_s:.1f} s after the attach (the counters were busy until then)"
    elif s.pm_reason == "hardware_busy" and s.pm_busy_tries:
        text += f"; tried again at {s.pm_busy_tries} pumps since"
    if s.pm_last_release and s.pm_reason == "hardware_busy":  # a likely cause; after a finalize it often fails
        text += "; releasing the previous PM session failed at " + ", ".join(s.pm_last_release)  # harmlessly
    return text


def _windows(s: wire.ProbeStatus, out: dict) -> None:
    if s.windows_in_process:
        out["cupti_windows"] = (f"{s.windows_in_process} in this process (they keep up to "
                                f"~{s.windows_in_process * policy.CUPTI_KB_PER_WINDOW / 1024:.0f} MB)")
    if s.window_budget_state == "spent":
        out["window_budget"] = (f"{s.windows_in_process} windows in this process: no more traced windows (their "
                                "memory is capped); PM and the token clock go on")
    elif s.window_budget_state == "rationed":
        out["window_budget"] = (f"{s.window_budget} windows reached: one window every {policy.BUDGET_PERIOD_S:g} s "
                                f"from now on (memory ≤ ~"
                                f"{policy.CUPTI_KB_PER_WINDOW * 3600 / policy.BUDGET_PERIOD_S / 1024:.0f} MB/hour, none "
                                f"after {policy.BUDGET_CAP * s.window_budget} windows)")
    if s.window_clock == "time":
        out["window_clock"] = f"time ({_CLOCK_REASONS.get(s.window_clock_reason, s.window_clock_reason)})"
    elif s.window_clock == "tokens":
        out["window_clock"] = "tokens"
    elif s.window_clock == "none":
        out["window_clock"] = ("none: the process replays CUDA graphs and its token marks (if any) are not where "
                               "its steps end, so no traced window can be closed safely; counters only (the DRAM "
                               "rate prices the floor). Steady marks (mark_token, or an engine adapter) give "
                               "traced windows")


def describe(s: wire.ProbeStatus) -> dict[str, str]:
    """The status as short texts by key (token_clock, gpu, trace, pm, nvml, pm_note, pm_stride, pm_cpu, pm_lost,
    trace_paused, cupti_windows, window_budget, window_clock, decode_waits_per_s, agent_cpu_ms_per_s,
    agent_cpu_over_s, cupti_start_cpu_ms, cupti_finalize_cpu_ms, errors);
    only what the status says."""
    out: dict[str, str] = {}
    if s.token_clock:
        out["token_clock"] = s.token_clock
    if s.gpu:
        out["gpu"] = f"unavailable ({s.gpu_error})" if s.gpu == "unavailable" and s.gpu_error else s.gpu
    if s.trace:
        detail = (f"{s.window_tokens} tokens every {s.window_period_s:g} s"
                  if s.trace == "armed" and s.window_tokens else "")
        out["trace"] = _word(s.trace, s.trace_reason, s.trace_error, detail)
        if s.trace == "paused" and s.trace_reason == "foreign_profiler":
            out["trace_paused"] = _PAUSED
    if s.pm:
        out["pm"] = _pm(s)
    if s.pm_first_session:
        out["pm_note"] = PM_FIRST_SESSION_NOTE
    if s.pm_stride:
        out["pm_stride"] = str(s.pm_stride)
    cpu = _pm_cpu(s)
    if cpu:
        out["pm_cpu"] = cpu
    lost = pm_lost_words(s.pm_full_pumps, s.pm_overflow_pumps, s.pm_image_samples, s.pm_interval_us, s.pm_pump_s)
    if lost:
        out["pm_lost"] = lost
    if s.nvml:
        out["nvml"] = _word(s.nvml, s.nvml_reason, s.nvml_error, f"{s.nvml_hz:g} Hz" if s.nvml == "armed"
                            and s.nvml_hz else "")
    _windows(s, out)
    if s.decode_waits_per_s is not None:
        out["decode_waits_per_s"] = f"{s.decode_waits_per_s:.1f}"
    if s.agent_cpu_ms_per_s is not None:
        out["agent_cpu_ms_per_s"] = f"{s.agent_cpu_ms_per_s:.1f}"
    if s.agent_cpu_over_s is not None:
        out["agent_cpu_over_s"] = f"{s.agent_cpu_over_s:.1f}"
    if s.cupti_start_cpu_ms is not None:
        out["cupti_start_cpu_ms"] = f"{s.cupti_start_cpu_ms:.1f}"
    if s.cupti_finalize_cpu_ms is not None:
        out["cupti_finalize_cpu_ms"] = f"{s.cupti_finalize_cpu_ms:.1f}"
    if s.step_count_ns:
        out["step_count_ns"] = f"{s.step_count_ns:.0f}"
    if s.errors:
        out["errors"] = str(s.errors)
    return out


_WORD = re.compile(r"^\s*([a-z_ ]+?)\s*(?:\((.*)\))?\s*$", re.S)


def _split(text: str) -> tuple[str, str]:
    """"armed (in process, 2000 us interval)" -> ("armed", "in process, 2000 us interval")."""
    m = _WORD.match(text or "")
    return (m.group(1).strip(), (m.group(2) or "").strip()) if m else ((text or "").strip(), "")


def _num(pattern: str, text: str, cast=int, default=0):
    m = re.search(pattern, text or "")
    try:
        return cast(m.group(1)) if m else default
    except ValueError:
        return default


def _float_or_none(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def from_legacy(state: dict[str, str], windows: int = 0, errors: list[str] | None = None) -> wire.ProbeStatus:
    """A wire-version-1 `Stats.state` dict read back into a ProbeStatus (what its words and numbers say)."""
    f: dict = {"windows": int(windows), "recent_errors": list(errors or [])}
    if "token_clock" in state:
        f["token_clock"] = _split(state["token_clock"])[0]
    for key in ("gpu", "trace", "pm", "nvml"):
        if key in state:
            word, inner = _split(state[key])
            f[key] = word.split()[0] if word else ""
            if word == "sidecar exited":
                f[key], f[f"{key}_reason"] = "lost", "sidecar_exited"
            elif f[key] in ("unavailable", "off", "error", "overflow") and inner:
                f[f"{key}_error" if key == "gpu" else f"{key}_reason"] = inner if key == "gpu" else "other"
                if key != "gpu":
                    f[f"{key}_error"] = inner
    trace = state.get("trace", "")
    f["window_tokens"] = _num(r"(\d+) tokens every", trace)
    f["window_period_s"] = _num(r"tokens every ([\d.]+) s", trace, float, 0.0)
    pm = state.get("pm", "")
    f["pm_interval_us"] = _num(r"(\d+) us interval", pm) or _num(r"every (\d+) us", state.get("pm_lost", ""))
    f["pm_where"] = "sidecar" if "sidecar" in pm and "in process" not in pm else "in_process" if pm else ""
    f["pm_restarts"] = _num(r"re-armed (\d+)x", pm)
    f["nvml_hz"] = _num(r"([\d.]+) Hz", state.get("nvml", ""), float, 0.0)
    f["pm_first_session"] = "pm_note" in state
    f["pm_stride"] = _num(r"(\d+)", state.get("pm_stride", ""))
    lost = state.get("pm_lost", "")
    f["pm_full_pumps"] = _num(r"(\d+) pumps found more samples", lost)
    f["pm_image_samples"] = _num(r"than their (\d+)-sample image", lost)
    f["pm_overflow_pumps"] = _num(r"overflowed at (\d+) pumps", lost)
    f["pm_pump_s"] = _num(r"a pump every ([\d.]+) s", lost, float, 0.0)
    if "trace_paused" in state:
        f["trace"], f["trace_reason"] = "paused", "foreign_profiler"
    f["windows_in_process"] = _num(r"^(\d+) in this process", state.get("cupti_windows", ""))
    budget = state.get("window_budget", "")
    if "no more traced windows" in budget:
        f["window_budget_state"] = "spent"
        f["windows_in_process"] = max(f["windows_in_process"], _num(r"^(\d+) windows", budget))
    elif budget:
        f["window_budget_state"], f["window_budget"] = "rationed", _num(r"^(\d+) windows reached", budget)
    f["decode_waits_per_s"] = _float_or_none(state.get("decode_waits_per_s"))
    f["agent_cpu_ms_per_s"] = _float_or_none(state.get("agent_cpu_ms_per_s"))
    f["cupti_start_cpu_ms"] = _float_or_none(state.get("cupti_start_cpu_ms"))
    f["cupti_finalize_cpu_ms"] = _float_or_none(state.get("cupti_finalize_cpu_ms"))
    f["agent_cpu_over_s"] = _float_or_none(state.get("agent_cpu_over_s"))
    f["errors"] = _num(r"(\d+)", state.get("errors", ""))
    return wire.ProbeStatus(**f)
