"""llama.cpp on an H100, replayed: llama-cpp-python's CUDA build in process (ggml's graphs on and off) and
llama-server (plain and attached by pid, four slots in flight, under `decodemon run`), each recorded by decodemon
from its own venv while a second process read PM as the reference (tests/data/h100_llama_cpp.json)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from decodemon.monitor.api import replay
from tests.conftest import DATA

FACTS = json.loads((DATA / "h100_llama_cpp.json").read_text())
CASES = sorted(FACTS["cases"])
FOUR = ("bandwidth", "occupancy", "launch", "comm")


def _json(name: str) -> dict:
    return replay(DATA / name).as_json()


@pytest.mark.parametrize("name", CASES)
def test_each_target_reads_its_own_clock_and_the_bytes_of_its_weights_and_the_reference(name):
    f, j = FACTS["cases"][name], _json(name)
    assert j["ms_per_token"] == pytest.approx(f["own"]["ms_per_token"], rel=0.05)
    measured, model = j["bytes_per_token_measured"], j["bytes_per_token_model"]
    assert measured == pytest.approx(model, rel=0.10)  # the weights a token reads (one embedding row) plus KV
    # the reference is a second process's PM over the same run, in bytes a step: a step of N slots is N tokens
    per_step = measured * (j["tokens_per_step"] or 1)
    assert per_step == pytest.approx(f["reference"]["bytes_per_token"], rel=0.10)


@pytest.mark.parametrize("name", CASES)
def test_each_target_names_one_of_the_four_or_unknown_with_what_was_measured(name):
    j = _json(name)
    assert j["verdict"] in (*FOUR, "unknown") and j["ceiling"] == j["verdict"]
    assert "kernels" not in (j["verdict"], j["ceiling"])
    if j["verdict"] == "unknown":
        assert j["candidates"]["bandwidth"]["state"] == "unknown"
        assert 2 < j["candidates"]["bandwidth"]["value"] < 10  # past the seeds' 2x of its floor, not ruled out
        if j["windows"]:  # it says what else was measured and why none binds
            assert "floor" in j["remedy"] and "DRAM" in j["remedy"] and "small grids" in j["remedy"]
        else:  # watched from outside, idle a quarter of its step: what would tell host from kernels
            assert j["candidates"]["launch"]["state"] == "unknown" and j["gpu_busy_pct"] < 80
            assert "traced window" in j["remedy"] and "tells the host's gaps from the kernels'" in j["remedy"]


def test_the_8b_shape_is_bandwidth_bound_in_process_and_served():
    for name in CASES:
        if "8b" in name:
            j = _json(name)
            assert j["verdict"] == "bandwidth", name
            assert j["candidates"]["bandwidth"]["value"] <= 2.0  # within the seeds' 2x of its floor


def test_four_slots_in_flight_read_as_four_tokens_a_step_and_the_clients_total_rate():
    name = next(n for n in CASES if FACTS["cases"][n]["slots"] == 4)
    f, j = FACTS["cases"][name], _json(name)
    assert j["tokens_per_step"] == pytest.approx(4, rel=0.10)
    assert j["throughput_tokens_per_s"] == pytest.approx(f["own"]["tokens_per_s"], rel=0.05)
    # a step's bytes are named as a step's, the floor's among them; every bytes_per_token* is a token's, the
    # step's over its tokens (the note says so)
    assert j["bytes_per_step"] == pytest.approx(j["bytes_per_step_measured"], rel=1e-6)
    assert j["bytes_per_token"] == pytest.approx(j["bytes_per_step"] / j["tokens_per_step"], rel=1e-9)
    assert abs(j["bytes_per_token"] - j["bytes_per_token_measured"]) <= 1  # the counters priced the floor
    assert "bytes_per_token* are a token's share, a step's ÷ its tokens" in j["ms_per_token_note"]
    assert j["bytes_per_step_measured"] == pytest.approx(j["bytes_per_token_measured"] * j["tokens_per_step"],
                                                         rel=0.02)


@pytest.mark.parametrize("shape", ["1b", "8b"])
def test_ggml_graphs_on_and_off_side_by_side_in_compare(shape):
    on = DATA / f"h100_llama_cpp_lcpp{shape}_graphs.dmon"
    off = DATA / f"h100_llama_cpp_lcpp{shape}_nographs.dmon"
    a, b = _json(on.name), _json(off.name)
    assert a["graph_launches_per_token"] == 1 and a["kernel_launch_calls_per_token"] == 0
    assert b["graph_launches_per_token"] == 0 and b["kernel_launch_calls_per_token"] == b["kernels_per_token"]
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "compare", str(on), str(off), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)
    assert c["b_over_a"]["host_launch_calls_per_token"] == pytest.approx(b["host_launch_calls_per_token"]
                                                                        / a["host_launch_calls_per_token"])
    assert c["b_over_a"]["ms_per_token"] > 1  # graphs off is the slower of the two


KVQ = FACTS["kv_quantized"]


@pytest.mark.parametrize("name", sorted(KVQ))
def test_a_quantized_kv_cache_a_third_of_the_bytes_is_measured_within_10_percent_of_weights_plus_kv(name):
    """A q8_0 KV cache at ~60k positions, a third of what a token reads: the DRAM counters' bytes a token against
    the weights a token reads plus the KV at the run's depth (between the prompt and the context's end) in q8_0,
    and against the reference; the model's own figure is priced at the depth /slots read, in the cache's type."""
    f, j = KVQ[name], _json(name)
    kv = f["shape_bytes"]["kv_per_position"]  # q8_0: 34 bytes per 32 values, K and V over every layer
    lo, hi = (f["shape_bytes"]["weights_read"] + kv * d for d in (f["prompt_tokens"], f["ctx"]))
    assert min(f["kv_share"]) >= 1 / 3 - 0.01  # the KV is a third of the bytes
    measured = j["bytes_per_token_measured"]
    assert 0.9 * lo <= measured <= 1.1 * hi
    assert measured == pytest.approx(f["reference"]["bytes_per_token"], rel=0.10)
    assert j["ms_per_token"] == pytest.approx(f["own"]["ms_per_token"], rel=0.05)
    assert j["bytes_per_token_model_kv_dtype"] == "q8_0"
    depth = j["bytes_per_token_model_depth"]
    assert f["prompt_tokens"] <= depth <= f["ctx"]  # the live depth, read from /slots
    assert j["bytes_per_token_model"] == f["shape_bytes"]["weights_read"] + kv * depth  # priced in q8_0
    assert measured == pytest.approx(j["bytes_per_token_model"], rel=0.10) and j["bytes_per_token_note"] is None
    assert j["verdict"] in (*FOUR, "unknown") and j["verdict"] != "kernels"


def test_a_servers_tokens_are_every_requests_not_its_steps():
    """llama-server with four slots, watched from outside: `tokens` counts every request's tokens, as the span's
    count does and as a batched transformers engine's does; `steps` the decode steps."""
    j = _json("h100_llama_cpp_server1b_np4.dmon")
    assert j["tokens"] == j["span"]["tokens"] and j["tokens"] == pytest.approx(4 * j["steps"], rel=0.05)
