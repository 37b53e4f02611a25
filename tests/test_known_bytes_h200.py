"""Bytes per token held against loops of known bytes, from H200 recordings made by benchmarks/counters.py: every
loop was started with plain python3 (or as a plain binary) and attached by pid, PM read by decodemon's own sidecar.
The bytes each step must move, and the loop's own clock over the recorded seconds, are in h200_known_bytes.json
beside the recordings."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.render import summary_json
from decodemon.monitor.sources.collect import collect
from tests.conftest import DATA, cli

FACTS = json.loads((DATA / "h200_known_bytes.json").read_text())
CASES = FACTS["cases"]
GRAPHED = [n for n in CASES if "reduce" in n or "kv262k" in n]


def _summary(name: str) -> dict:
    return summary_json(collect(DATA / name).snapshot())


@pytest.mark.parametrize("name", GRAPHED)
def test_bytes_per_step_of_a_graphed_loop_match_what_it_moves(name):
    """A graphed reduction of 1.5 or 8.6 GB a step within 5%, with and without marks (the replay count is the
    clock without them); a Llama-1B-shaped step over a 262,144-position KV cache within 10% of weights + KV (+ the
    scores, where its attention writes them)."""
    j, case = _summary(name), CASES[name]
    known = case["known"]["known_bytes_per_step"]
    tol = 0.10 if "kv262k" in name else 0.05
    assert j["bytes_per_token_measured"] == pytest.approx(known, rel=tol)
    assert j["ms_per_token"] == pytest.approx(case["own"]["ms_per_step"], rel=0.05)  # the loop's own clock
    assert j["token_clock"] == ("mark_token" if "marks" in name else "replay_count")
    assert "sidecar" in j["probe"]["pm"] and "nvidia-cuda-cupti 13.4" in j["probe"]["pm"]  # read outside the loop


@pytest.mark.parametrize("name", ["h200_known_kv262k.dmon", "h200_known_kv262k_marks.dmon"])
def test_a_kv_dominated_step_is_bandwidth_bound_within_2x_of_its_floor(name):
    j = _summary(name)
    bw = j["candidates"]["bandwidth"]
    assert j["verdict"] == "bandwidth" and bw["state"] == "binding" and bw["value"] <= 2.0
    assert j["dram_check"]["apart"] is None  # bytes x tokens/s and PM's DRAM share tell one rate


def test_the_kv_steps_traced_kernels_match_torch_profiler():
    """The marked KV step's window: kernel time and launches a step against torch.profiler's count of the same
    loop (no decodemon in it)."""
    j, prof = _summary("h200_known_kv262k_marks.dmon"), FACTS["kv262k_profiler"]
    assert j["kernel_sum_ms_per_token"] == pytest.approx(prof["kernel_ms_per_step"], rel=0.10)
    assert j["kernels_per_token"] == pytest.approx(prof["kernels_per_step"], rel=0.10)


def test_a_cuda_program_with_no_python_gets_the_device_wide_view():
    """A C++ loop reading 8 GiB a step, attached by pid: no clock decodemon can read, so no tokens, but GPU busy and
    DRAM bytes a second from PM, within 5% of the loop's own GB/s, and a verdict from the counters alone."""
    r = cli("replay", DATA / "h200_cuda_loop_8gib.dmon", "--json")
    assert r.returncode == 0, r.stderr
    j, own = json.loads(r.stdout), CASES["h200_cuda_loop_8gib.dmon"]["own"]
    assert j["tokens"] is None and j["ms_per_token"] is None and j["probe"]["token_clock"] == "none"
    assert j["dram_gbs"] == pytest.approx(own["gbs"], rel=0.05)
    assert j["pm_gpu_busy_pct"] > 95
    assert j["verdict"] == "bandwidth" and j["candidates"]["bandwidth"]["state"] == "binding"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_a_window_whose_kernels_came_back_without_times_is_not_read_as_zero(k):
    """The compiled Llama-8B loop marking at enqueue, recorded before the agent waited for the GPU at a window's
    close: CUPTI returned 67-100% of each window's kernel records without times. Read as they were, its kernel
    time came out 0.0 ms a token and its launches 776-1,203 (torch.profiler: 776). Now the window is left out and
    said to be: kernel time and launches unknown, never wrong, and ms/token still from the loop's own clock."""
    name = f"h200_compiled_llama8b_enqueue_{k}.dmon"
    j = _summary(name)
    assert j["kernel_sum_ms_per_token"] is None and j["kernels_per_token"] is None
    assert any("without times" in e and "not counted" in e for e in j["errors"])
    own = FACTS["compiled_llama8b_enqueue"]["own_ms_per_token"][name]
    assert j["ms_per_token"] == pytest.approx(own, rel=0.05)
    assert j["bytes_per_token_measured"] == pytest.approx(15.7e9, rel=0.05)  # the weights, ~15 GB, and the KV


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_the_compiled_loop_marking_at_enqueue_reads_torch_profilers_kernels_once_the_gpu_is_waited_for(k):
    """The same loop once the decode thread waits for the GPU before tracing stops, five records in a row: ms/token
    within 5% of the loop's own on all five, bytes within 10% of the unmarked run's 15.0 GB, and each window's
    kernels back with times: kernel time and launches a token within 10% of torch.profiler's count of the loop.
    The first record, the attach that loaded the agent, closed no window within its 5 s: no kernel figures, said
    as unknown."""
    name = f"h200_compiled_llama8b_enqueue_synced_{k}.dmon"
    j, prof = _summary(name), FACTS["compiled_llama8b_enqueue"]["profiler"]
    own = FACTS["compiled_llama8b_enqueue_synced"]["own_ms_per_token"][name]
    assert j["ms_per_token"] == pytest.approx(own, rel=0.05)
    assert j["bytes_per_token_measured"] == pytest.approx(15.0e9, rel=0.10)
    assert j["verdict"] == "bandwidth"
    if k == 1:
        assert j["windows"] == 0 and j["kernel_sum_ms_per_token"] is None and j["kernels_per_token"] is None
        return
    assert j["kernel_sum_ms_per_token"] == pytest.approx(prof["kernel_ms_per_step"], rel=0.10)
    assert j["kernels_per_token"] == pytest.approx(prof["kernels_per_step"], rel=0.10)
    assert j["candidates"]["launch"]["state"] == "ruled_out"
