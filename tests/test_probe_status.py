"""The probe's status on the wire: typed fields from the probe, words from the monitor, old recordings still read."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from decodemon.monitor import probe_status
from decodemon.monitor.feed import Feed
from decodemon.probes import wire
from tests.conftest import BUNDLED, DATA


def test_the_status_round_trips_and_is_its_own_frame():
    s = wire.ProbeStatus(token_clock="armed", gpu="ok", trace="armed", window_tokens=1, window_period_s=4.0,
                         pm="armed", pm_where="in_process", pm_interval_us=2000, pm_stride=32,
                         decode_waits_per_s=17.5, windows=3, errors=1, recent_errors=["trace: x"])
    back = wire.decode_frame(wire.encode(s))
    assert back == s and isinstance(back, wire.ProbeStatus)
    assert wire.WIRE_VERSION == 2


def test_the_words_are_written_by_the_monitor():
    s = wire.ProbeStatus(token_clock="armed", gpu="ok", trace="armed", window_tokens=1, window_period_s=4.0,
                         pm="armed", pm_where="in_process", pm_interval_us=2000, pm_dram_bytes=True,
                         nvml="armed", nvml_hz=4.0, decode_waits_per_s=17.46, agent_cpu_ms_per_s=3.0)
    d = probe_status.describe(s)
    assert d["trace"] == "armed (1 tokens every 4 s)"
    assert d["pm"] == "armed (in process, 2000 us interval, DRAM bytes)"
    assert d["nvml"] == "armed (4 Hz)"
    assert (d["decode_waits_per_s"], d["agent_cpu_ms_per_s"]) == ("17.5", "3.0")  # as monitor/session.py reads them
    assert "pm_note" not in d and "trace_paused" not in d and "errors" not in d


def test_counters_held_by_another_profiler_are_named():
    s = wire.ProbeStatus(pm="unavailable", pm_reason="hardware_busy", pm_error="cuptiError: ERROR_HARDWARE_BUSY (26)")
    words = probe_status.describe(s)["pm"]
    assert words.startswith("unavailable (counters held by another profiler (DCGM, Nsight, or an earlier session")
    assert "ERROR_HARDWARE_BUSY (26)" in words


def test_the_profilers_that_hold_the_counters_are_named_when_they_can_be_seen():
    s = wire.ProbeStatus(pm="unavailable", pm_reason="hardware_busy", pm_error="cuptiError: ERROR_HARDWARE_BUSY (26)",
                         pm_holders=["nv-hostengine (pid 812)"])
    assert "held by nv-hostengine (pid 812)" in probe_status.describe(s)["pm"]
    none_seen = probe_status.describe(wire.ProbeStatus(pm="unavailable", pm_reason="hardware_busy"))["pm"]
    assert "no counter-taking profiler seen on this host" in none_seen


def test_no_gpu_reads_unavailable_with_the_reason():
    s = wire.ProbeStatus(gpu="unavailable", gpu_error="CUDA driver is not found", trace="unavailable",
                         trace_reason="no_gpu", pm="unavailable", pm_reason="no_gpu")
    d = probe_status.describe(s)
    assert d["gpu"] == "unavailable (CUDA driver is not found)"
    assert d["trace"] == d["pm"] == "unavailable (no GPU)"


def test_the_agents_and_the_sidecars_frames_add_up_and_a_word_brings_its_reason():
    feed = Feed()
    feed.add(1, wire.ProbeStatus(token_clock="armed", trace="paused", trace_reason="foreign_profiler", pm="armed"))
    feed.add(2, wire.ProbeStatus(nvml="armed", nvml_hz=4.0))  # the sidecar says only what it knows
    assert (feed.status.trace, feed.status.pm, feed.status.nvml) == ("paused", "armed", "armed")
    assert "torch.profiler is recording" in feed.state["trace_paused"] and feed.state["nvml"] == "armed (4 Hz)"
    feed.add(3, wire.ProbeStatus(trace="armed", pm="armed", decode_waits_per_s=12.0))  # the profiler stopped
    assert feed.status.trace_reason == "" and "trace_paused" not in feed.state
    assert feed.status.decode_waits_per_s == 12.0
    feed.add(4, wire.ProbeStatus(pm="armed"))  # a frame without the figure leaves the last one
    assert feed.state["decode_waits_per_s"] == "12.0"


def test_errors_reach_the_feed_once_each():
    feed = Feed()
    for rx in range(3):
        feed.add(rx, wire.ProbeStatus(errors=2, recent_errors=["trace: a", "trace: b"], dropped_records=rx))
    assert feed.errors == ["trace: a", "trace: b"] and feed.dropped_records == 2 and feed.state["errors"] == "2"


def test_lost_pm_samples_and_the_first_session_note_in_words():
    s = wire.ProbeStatus(pm="armed", pm_interval_us=200, pm_full_pumps=4, pm_image_samples=1024, pm_pump_s=1.0,
                         pm_first_session=True)
    d = probe_status.describe(s)
    assert d["pm_lost"].startswith("4 pumps found more samples than their 1024-sample image holds")
    assert "every 200 us" in d["pm_lost"] and "--probe pm_interval_us=N" in d["pm_lost"]
    assert d["pm_note"] == probe_status.PM_FIRST_SESSION_NOTE


def test_a_version_1_status_dict_reads_back_into_fields():
    old = {"token_clock": "armed", "gpu": "ok", "trace": "armed (1 tokens every 4 s)",
           "pm": "armed (in process, 2000 us interval); re-armed 2x after CuptiError", "nvml": "armed (4 Hz)",
           "pm_stride": "32", "cupti_windows": "7 in this process (they keep up to ~2 MB)",
           "decode_waits_per_s": "21.5", "agent_cpu_ms_per_s": "4.2", "errors": "3",
           "pm_note": "first PM session in this process: ...",
           "trace_paused": "torch.profiler is recording in the target: ...",
           "window_budget": "500 windows reached: one window every 60 s from now on"}
    s = probe_status.from_legacy(old, windows=2, errors=["e"])
    assert (s.token_clock, s.gpu, s.trace, s.trace_reason, s.pm, s.nvml) == \
        ("armed", "ok", "paused", "foreign_profiler", "armed", "armed")
    assert (s.window_tokens, s.window_period_s, s.pm_interval_us, s.pm_where, s.pm_restarts) == \
        (1, 4.0, 2000, "in_process", 2)
    assert (s.pm_stride, s.windows_in_process, s.decode_waits_per_s, s.agent_cpu_ms_per_s, s.errors) == \
        (32, 7, 21.5, 4.2, 3)
    assert s.pm_first_session and (s.window_budget_state, s.window_budget) == ("rationed", 500)
    assert (s.windows, s.recent_errors, s.nvml_hz) == (2, ["e"], 4.0)
    gone = probe_status.from_legacy({"pm": "unavailable (no permission for GPU performance counters)"})
    assert (gone.pm, gone.pm_error) == ("unavailable", "no permission for GPU performance counters")
    assert probe_status.describe(gone)["pm"] == "unavailable (no permission for GPU performance counters)"


RECORDINGS = sorted(glob.glob(str(DATA / "*.dmon")) + glob.glob(str(BUNDLED / "*.dmon")))
# the recordings made before the typed status (wire version 1): their probes sent wire.Stats
V1_RECORDINGS = [p for p in RECORDINGS
                 if next(f for _, f in wire.read_recording(p) if isinstance(f, wire.RecordingHeader)).wire_version == 1]


@pytest.mark.parametrize("path", V1_RECORDINGS, ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_committed_recording_reads_its_old_status_into_the_typed_one(path):
    feed = Feed()
    stats = 0
    for rx, frame in wire.read_recording(path):
        stats += isinstance(frame, wire.Stats)
        feed.add(rx, frame)
    assert stats > 0  # version-1 recordings: the old frame
    s = feed.status
    assert (s.token_clock, s.gpu, s.trace, s.pm, s.nvml) == ("armed", "ok", "armed", "armed", "armed")
    assert (s.window_tokens, s.pm_interval_us, s.nvml_hz) == (1, 2000, 4.0) and s.window_period_s in (1.0, 4.0)
    assert feed.state["pm"].startswith("armed (in process, 2000 us interval")  # the recording's own words
    assert feed.state["trace"] == f"armed (1 tokens every {s.window_period_s:g} s)"


# the H200 recordings whose probe loaded the PM libraries before cupti-python did: PM did not arm in them
# (`ERROR_INVALID_PARAMETER` at the process's first attach, "could not load the nvperf* libraries" at the next)
PM_FAILED = ("h200_compiled_llama8b_marks_", "h200_hf_cb_")


def test_the_recordings_made_with_the_typed_status_carry_it_and_no_old_frame():
    newer = [p for p in RECORDINGS if p not in V1_RECORDINGS]
    assert len(newer) >= 4 and len(V1_RECORDINGS) >= 18
    for path in newer:
        frames = [f for _, f in wire.read_recording(path)]
        assert not any(isinstance(f, wire.Stats) for f in frames), path
        if Path(path).name.startswith(PM_FAILED):  # said unavailable, with the error that stopped it
            assert any(isinstance(f, wire.ProbeStatus) and f.pm == "unavailable" and
                       ("INVALID_PARAMETER" in f.pm_error or "nvperf" in f.pm_error) for f in frames), path
        else:
            assert any(isinstance(f, wire.ProbeStatus) and f.pm == "armed" for f in frames), path
