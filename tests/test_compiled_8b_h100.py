"""gpt-fast's compiled Llama-8B loop with marks on an H100, five records in a row of one process, attached from
decodemon's own venv with nothing of decodemon installed in the engine's: the traced windows come from decodemon's
CUPTI library loaded into the target (tests/data/h100_compiled_llama8b_marks.json)."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.api import replay
from tests.conftest import DATA

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
def test_pm_is_read_in_decodemons_own_process_from_its_own_libcupti(name):
    j = replay(DATA / name).as_json()
    assert "in the sidecar" in j["probe"]["pm"] and "nvidia-cuda-cupti 13.4" in j["probe"]["pm"]
    assert j["bytes_per_token_measured"] > 0 and j["verdict"] == "bandwidth"
