"""PM sampling for one attach: arm it (retrying while the counters are busy), pump it into frames, re-arm it after
a CUPTI finalize took it down. The status fields it sets are wire.ProbeStatus's `pm*` fields.
"""

from __future__ import annotations

import time

from decodemon.probes import held, pm_config, wire
from decodemon.probes.device import cuda_device_index
from decodemon.probes.facts import PROCESS

# ERROR_HARDWARE_BUSY at the arm: tried this many times in all, this far apart (~1 s). A re-attach to the same
# process can find the counters still held for a moment while the previous attach's PM sampler is released.
BUSY_TRIES = 5
BUSY_WAIT_S = 0.25
# then at pumps, further and further apart (a profiler may hold them for hours): this many tries at most
PUMP_ARM_TRIES = 40
PUMP_ARM_WAIT_MAX_S = 60.0


def arm_pm(settings: wire.Attach, status: dict, sleep=time.sleep, tries: int = BUSY_TRIES):
    """A running PmSampler for this attach, or None; `status` gets the pm fields (armed, or why not)."""
    from decodemon.probes import pm_inproc  # noqa: PLC0415 - numpy and cupti only when a monitor attaches

    status.update(pm_where="in_process", pm_interval_us=int(settings.pm_interval_us), pm_error="", pm_reason="",
                  pm_holders=[], pm_last_release=list(PROCESS.pm_last_release))
    for attempt in range(tries):
        try:
            pm = pm_inproc.PmSampler(cuda_device_index(), settings.pm_interval_us, pump_s=settings.pm_pump_s)
        except PermissionError:
            status.update(pm="unavailable", pm_reason="no_permission")
            return None
        except Exception as exc:
            if pm_config.is_hardware_busy(exc):
                if attempt + 1 < tries:
                    sleep(BUSY_WAIT_S)
                    continue
                status.update(pm="unavailable", pm_reason="hardware_busy", pm_error=_text(exc),
                              pm_holders=pm_config.counter_holders(PROCESS.pm_armed_before))
            else:
                status.update(pm="unavailable", pm_reason="error", pm_error=_text(exc))
            return None
        status.update(pm="armed", pm_dram_bytes=bool(getattr(pm, "dram_bytes", False)))
        if not PROCESS.pm_armed_before:
            PROCESS.pm_armed_before = True
            status["pm_first_session"] = True
        return pm
    return None


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def pm_frames(metrics, starts, ends, rows, extra) -> list:
    """One pump's samples as frames: the regular ones, then (apart) those evaluated for a traced window's span."""
    out = []
    for flag in (False, True):
        idx = [i for i, e in enumerate(extra) if bool(e) == flag]
        if idx:
            out.append(wire.PmSamples(metrics=list(metrics), start_ns=wire.Column.of([starts[i] for i in idx]),
                                      end_ns=wire.Column.of([ends[i] for i in idx]),
                                      values=wire.Column.of([rows[i] for i in idx], "<f8"), window_span=flag))
    return out


def pump_status(pm) -> dict:
    """The status fields a pump leaves: stride, CPU per pump and its parts, losses."""
    pumps = int(getattr(pm, "pumps", 0))
    later = pumps - 1
    out = dict(pm_stride=int(pm.stride), pm_pumps=pumps, pm_full_pumps=int(getattr(pm, "full_pumps", 0)),
               pm_overflow_pumps=int(getattr(pm, "overflows", 0)),
               pm_image_samples=int(getattr(pm, "max_samples", 0)), pm_pump_s=float(getattr(pm, "pump_s", 1.0)))
    if later > 0:
        held_calls = getattr(pm, "_held", {})
        out.update(pm_cpu_ms_per_pump=1e3 * pm.cpu_later_s / later,
                   pm_image_reset_ms_per_pump=1e3 * getattr(pm, "image_s", 0.0),
                   pm_image_reset_bytes=int(getattr(pm, "image_bytes", 0)),
                   pm_first_pump_cpu_ms=1e3 * pm.cpu_first_s,
                   pm_held_calls=len(held_calls) if held.ENABLED else 0,
                   pm_handbacks_per_pump=(getattr(pm, "handbacks", 0) / pumps) if held_calls and held.ENABLED
                   else None)
    return out


def release_pm(pm) -> None:
    """Release a PM session for good (the attach's end); the steps that failed are kept for the next attach."""
    PROCESS.pm_last_release = list(pm.close() or [])


def pump_pm(session, status: dict, rearm=arm_pm, now=time.monotonic) -> list:
    """Decode and evaluate PM samples into frames; re-arm PM if a CUPTI finalize took the session down. Counters
    that were busy at the attach are tried again at each pump: a profiler, or this process's previous session,
    may let them go a few seconds later."""
    pm = session.pm
    if pm is None:
        t = now()
        tries = int(status.get("pm_busy_tries", 0))
        if status.get("pm_reason") == "hardware_busy" and session.settings.pm and tries < PUMP_ARM_TRIES and \
                status.get("pm_where") == "in_process" and t >= getattr(session, "pm_next_try", 0.0):
            with held.GilPolite():
                session.pm = rearm(session.settings, status, tries=1)
            status["pm_busy_tries"] = tries + 1
            session.pm_next_try = t + min(2.0 ** tries, PUMP_ARM_WAIT_MAX_S)  # 1, 2, 4 ... 60 s apart
            if session.pm is not None:
                status["pm_armed_after_s"] = round(t - session.started, 2)
        return []
    try:
        got = pm.samples(dense_spans=session.pm_spans)
        if got is not None and len(got[1]):
            last = max(got[1])
            # covered by this pump (the sample over the window's end had completed), or never going to be
            session.pm_spans = [sp for sp in session.pm_spans if sp[1] > last][-8:]
        status.update(pump_status(pm))
        return pm_frames(getattr(pm, "metrics", pm_config.PM_METRICS), *got) if got is not None else []
    except Exception as exc:
        release_pm(pm)
        session.pm = None
        with held.GilPolite():
            session.pm = rearm(session.settings, status)
        status["pm_restarts"] = int(status.get("pm_restarts", 0)) + 1
        status["pm_restart_cause"] = type(exc).__name__
    return []
