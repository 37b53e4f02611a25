"""What the probe can and cannot see, in words for the panels (plain functions of a snapshot, no Textual)."""

from __future__ import annotations

from decodemon.monitor.render.text import unit
from decodemon.monitor.token_clock import clock_kind

# the probe's reasons for having no GPU (probes.device.Unavailable), shortened for the device line
_NO_GPU_CAUSES = (("CUDA driver is not found", "no CUDA driver in the process"),
                  ("cuInit failed", "the CUDA driver did not start"),
                  ("no CUDA device", "no CUDA device"))


def probe_field(s, key: str) -> str:
    """One field of the probe's status as text ("" when the probe has not reported it)."""
    probe = s.probe
    value = probe.get(key) if isinstance(probe, dict) else getattr(probe, key, None)
    return "" if value is None else str(value)


def _unavailable_reason(text: str) -> str | None:
    """"unavailable (why)" → "why"; None when the text does not say unavailable."""
    if not text.startswith("unavailable"):
        return None
    inner = text[len("unavailable"):].strip()
    return inner[1:-1] if inner.startswith("(") and inner.endswith(")") else inner


def has_no_gpu(s) -> bool:
    """Whether the target runs without a GPU the probe can use (a CPU-only engine): what the diagnosis was told."""
    return bool(s.inputs is not None and s.inputs.no_gpu)


def device_line(s) -> str:
    """The device as the header shows it: name, SMs and clock, or why there is none."""
    if has_no_gpu(s):
        why = _unavailable_reason(probe_field(s, "gpu")) or _unavailable_reason(s.device) or ""
        cause = next((words for prefix, words in _NO_GPU_CAUSES if why.startswith(prefix)), "")
        return "no GPU (CPU-only engine" + (f": {cause})" if cause else ")")
    if s.device == "?":
        return "device not reported yet"
    clocks = f"  SM {s.nvml['sm_clock_mhz']} MHz" if s.nvml else ""
    return f"{s.device}  {s.sm_count} SMs{clocks}"


def tracing_unavailable(s) -> str | None:
    """Why no traced window will come, or None while one may still come."""
    if has_no_gpu(s):
        return "no GPU in the target: there are no kernels to trace"
    trace = probe_field(s, "trace")
    if trace == "off":
        return "tracing is off for this attach"
    why = _unavailable_reason(trace)
    if why is not None:
        return f"tracing is unavailable: {why}" if why else "tracing is unavailable"
    if probe_field(s, "window_clock").startswith("none"):
        return "no step end to close a window at (graph replays, no marks where steps end): counters only"
    return None


def still_measured(s) -> str:
    """What is measured without traced windows: the token clock, and PM and NVML where they run."""
    parts = []
    if s.tokens is not None:
        clock = {"server_metrics": "the server's own step counter",
                 "replay_count": "its CUDA graph replays",
                 "step_starts": "its steps, timed at their embedding lookups"}.get(s.token_clock, "the engine's clock")
        span = "" if not s.span_s else f" in the last {s.span_s:.0f} s" if s.span_s >= 1 else \
            f" in the last {s.span_s:.1g} s"
        mark = unit(s)  # a batched engine's clock counts its steps
        parts.append(f"{s.tokens.tokens} {mark}s timed{span} at {s.tokens.ms_per_token:.3f} ms/{mark} "
                     f"{clock_kind(s.token_clock)} ({clock})")
    else:
        hint = (" (with no GPU steps to find, a loop that marks no token has no clock: an engine adapter, "
                "mark_token() or --token-range NAME gives it one)" if has_no_gpu(s) else "")
        parts.append(f"tokens and ms/token from the engine's clock, once it decodes{hint}")
    if s.pm:
        parts.append("GPU busy, SM active and DRAM from PM counters")
    if s.nvml:
        parts.append("clocks and power from NVML")
    return "still measured: " + "; ".join(parts)


def latest_error(s) -> str | None:
    """The probe's most recent error, if it reported any."""
    return s.errors[-1] if s.errors else None
