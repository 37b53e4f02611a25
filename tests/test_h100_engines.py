"""Engines on an H100 attached by pid from decodemon's own venv, with nothing of decodemon installed in the engine's:
gpt-fast's compiled Llama-8B loop with marks, five records in a row of one process (tests/data/
h100_compiled_llama8b_marks.json), and the demo engine, eager and graphed. The traced windows come from decodemon's
CUPTI library loaded into the target; PM from the sidecar in decodemon's process."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.api import replay
from tests.conftest import BUNDLED, DATA

FACTS = json.loads((DATA / "h100_compiled_llama8b_marks.json").read_text())
RECORDS = sorted(FACTS["own_ms_per_token"])


def test_five_records_in_a_row():
    assert len(RECORDS) == 5


@pytest.mark.parametrize("name", RECORDS)
def test_every_record_the_first_included_traces_a_window_that_agrees_with_torch_profiler(name):
    j = replay(DATA / name).as_json()
    prof = FACTS["profiler"]
    assert j["windows"] >= 1
    assert j["kernels_per_token"] == pytest.approx(prof["kernels_per_step"], rel=0.10)
    assert j["kernel_sum_ms_per_token"] == pytest.approx(prof["kernel_ms_per_step"], rel=0.10)
    assert j["ms_per_token"] == pytest.approx(FACTS["own_ms_per_token"][name], rel=0.05)
    assert j["token_clock"] == "mark_bursts"
    assert j["candidates"]["launch"]["state"] == "ruled_out"  # one graph replay a step, the GPU ~99% busy


@pytest.mark.parametrize("name", RECORDS)
def test_cupti_starts_off_the_decode_thread_in_every_record_and_the_agent_stays_under_2_ms_a_second(name):
    """The process's CUPTI start-ups took 0.7-1.2 s here: made on the agent thread before each window
    (probes/policy.start_off_loop), the decode thread's share of a window is a few ms, not a token that long; and
    the agent thread's own CPU over the attach, start-up apart, stays under 2 ms a second, the first record's too."""
    o = replay(DATA / name).as_json()["observer_cost"]
    assert o["cupti_start_off_thread_ms"] > 500 and o["probe_ms_per_window"] < 20
    assert o["agent_cpu_ms_per_s"] <= 2.0 and o["agent_cpu_over_s"] >= 3


def test_a_record_whose_newest_marks_hold_one_bursts_tail_is_still_read_over_whole_bursts():
    """Its last 256 marks were mostly at the GPU's own pace (a full launch queue), so they alone did not look like
    bursts, and the token clock read the enqueues: 0.90 ms a token against the loop's own 7.11. Over the span's
    every mark they do."""
    name = "h100_compiled_llama8b_marks_5.dmon"
    j = replay(DATA / name).as_json()
    assert j["token_clock"] == "mark_bursts"
    assert j["ms_per_token"] == pytest.approx(FACTS["own_ms_per_token"][name], rel=0.02)


@pytest.mark.parametrize("name", RECORDS)
def test_pm_is_read_in_decodemons_own_process_from_its_own_libcupti(name):
    j = replay(DATA / name).as_json()
    assert "in the sidecar" in j["probe"]["pm"] and "nvidia-cuda-cupti 13.4" in j["probe"]["pm"]
    assert j["bytes_per_token_measured"] > 0 and j["verdict"] == "bandwidth"


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_the_demo_engine_on_the_h100_shows_a_measured_byte_beside_the_models(mode):
    """The demo engine recorded 8 s by pid from decodemon's own venv, PM armed in the sidecar: bytes a token from the
    DRAM counters beside the model's, and the window traced by decodemon's CUPTI library."""
    j = replay(BUNDLED / f"h100_{mode}.dmon").as_json()
    assert j["bytes_per_token_measured"] == pytest.approx(j["bytes_per_token_model"], rel=0.10)
    assert j["windows"] >= 1 and j["kernels_per_token"] in (1863, 1864)
    assert j["verdict"] == {"eager": "launch", "graph": "occupancy"}[mode]
