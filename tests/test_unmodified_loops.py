"""Decode loops with no line of decodemon in them, recorded on the H200 and replayed here.

Made by `python benchmarks/unmodified.py OUT` on one NVIDIA H200 (driver 580.159.04, torch 2.11.0+cu130,
transformers 5.17.0), 2026-12-01: transformers' own `generate()` (Qwen3-0.6B shape, random bf16 weights) under
`decodemon run` and, started with plain `python3`, attached by injection; its static-cache generate() (the
forward compiled by transformers, CUDA graphs); the demo engine with `--no-marks`. torch.profiler's figures for
the same loops (`--profile`) sit beside them in tests/data/*.profile.json.
"""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.api import replay
from decodemon.probes import wire
from tests.conftest import DATA, REC


def profile(name: str) -> dict:
    return json.loads((DATA / f"h200_{name}.profile.json").read_text())


@pytest.fixture(scope="module")
def hf_eager():
    return replay(DATA / "h200_hf_generate_eager.dmon").as_json()


def test_generate_eager_is_launch_bound_with_torch_profilers_kernel_count(hf_eager):
    assert hf_eager["verdict"] == "launch"
    assert hf_eager["token_clock"] == "mark_token"  # the transformers adapter marked every step
    assert hf_eager["clock_unit"] == "token"  # one request: a step is a token
    assert hf_eager["kernels_per_token"] == profile("hf_generate_eager")["kernels_per_step"] == 1636
    assert hf_eager["graph_launches_per_token"] == 0
    assert "CUDA graph" in hf_eager["falsify"]


def test_generate_eager_model_facts_came_from_the_adapter_and_the_counters_agree(hf_eager):
    # parameter bytes of the Qwen3-0.6B shape in bf16 plus its KV cache at depth, read off the model by the adapter
    assert 1.19e9 < hf_eager["bytes_per_token_model"] < 1.25e9
    # the DRAM counters' read + write per token, no model facts needed: within 25% of the weights read
    assert hf_eager["bytes_per_token_measured"] == pytest.approx(hf_eager["bytes_per_token_model"], rel=0.25)
    assert hf_eager["bandwidth_source"].startswith("measured copy (decodemon")


def test_the_tokens_generate_made_are_the_tokens_counted():
    """The recording's token rate against the loop's own log of the same seconds (tokens/s 27.95 against 27.88)."""
    frames = [f for _, f in wire.read_recording(DATA / "h200_hf_generate_eager.dmon")]
    marks = [t for f in frames if isinstance(f, wire.TokenMarks) for t in f.t_ns.array()]
    assert len(marks) > 100
    rate = (len(marks) - 1) / ((marks[-1] - marks[0]) / 1e9)
    assert rate == pytest.approx(27.88, rel=0.02)


def test_generate_attached_by_injection_into_plain_python_reads_the_same():
    j = replay(DATA / "h200_hf_generate_injected.dmon").as_json()
    hello = next(f for _, f in wire.read_recording(DATA / "h200_hf_generate_injected.dmon")
                 if isinstance(f, wire.Hello))
    assert hello.argv[0].endswith("hf_generate.py")  # started as `python3 hf_generate.py`, no decodemon run
    assert j["verdict"] == "launch" and j["kernels_per_token"] == 1636 and j["token_clock"] == "mark_token"


def test_static_cache_generate_is_read_on_the_gpu_step_its_host_marks_ahead_of():
    """transformers' static-cache generate() marks each token at enqueue: under a fifth of the kernels its window
    traced started between its marks. Read on the GPU's own step, the kernel time a token is torch.profiler's
    (2.06 against 1.90 ms), and the step's GPU busy agrees with PM's (55% against 54%): 45% of the step is
    idle, more of the graphed step than the small grids (20%) or the bandwidth floor (8%) could claim: the host's
    work between replays sets the token (LAUNCH, said so). Half the SMs sit idle when the GPU is busy, but the
    grids lost that comparison, so OCCUPANCY does not bind beside LAUNCH."""
    j = replay(DATA / "h200_hf_generate_static.dmon").as_json()
    prof = profile("hf_generate_static")
    assert j["graph_launches_per_token"] == 1.0
    assert j["kernels_per_token"] == pytest.approx(prof["kernels_per_step"], rel=0.01)
    assert j["kernel_sum_ms_per_token"] == pytest.approx(prof["kernel_ms_per_step"], rel=0.1)
    assert j["kernel_share_of_step_pct"] == pytest.approx(j["pm_gpu_busy_pct"], abs=5)
    assert j["busy_sources_disagree"] is None
    launch = j["candidates"]["launch"]
    assert launch["state"] == "binding" and j["verdict"] == "launch"
    assert "host's work between replays" in launch["detail"] and "idle 45%" in launch["detail"]
    assert "between replays" in j["remedy"] and "capture" not in j["falsify"].lower()
    occ = j["candidates"]["occupancy"]
    assert occ["state"] == "unknown" and "not what binds: the GPU's idle between replays" in occ["detail"]
    assert j["bytes_per_token_measured"] == pytest.approx(j["bytes_per_token_model"], rel=0.1)


def test_the_demo_engine_with_its_marks_off_gets_the_verdict_it_gets_with_them_on():
    off = replay(DATA / "h200_eager_nomarks.dmon").as_json()
    on = replay(REC["eager"]).as_json()
    # nothing marked: the GPU's own steps are the clock, and their count stands beside the rate
    assert off["tokens"] > 0 and off["token_clock"] == "kernel period"
    assert off["verdict"] == on["verdict"] == "launch"
    assert off["kernels_per_token"] == on["kernels_per_token"] == 1863


def test_a_compiled_8b_loop_that_never_syncs_per_token_reads_right_off_its_gpu_steps():
    """The torch.compile(mode="reduce-overhead") Llama-3-8B-shaped loop (benchmarks/loops/compiled_decode.py),
    never syncing per token, one window traced by time. Its own clock read 5.715 ms/token over the recorded
    seconds; torch.profiler, 776.0 kernels and 5.67 ms of kernels a step. The weights it reads per token: 7.50 G
    bf16 parameters (all but the input embedding), 15.0 GB. (The process did not live past that window's
    finalize: such processes get no window by time, see docs/benchmarks.md.)"""
    import numpy as np

    from decodemon.monitor.analysis.window import window_metrics
    from decodemon.monitor.feed import Feed
    from decodemon.monitor.token_clock import gpu_steps, reclocked

    frames = [f for _, f in wire.read_recording(DATA / "h200_compiled_llama8b_nomarks.dmon")]
    feed = Feed()
    for i, f in enumerate(frames):
        feed.add(i, f)
    (w,) = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert w.clock == "time"
    steps = gpu_steps(w)
    prof = profile("compiled_llama8b")
    assert steps.clock == "graph replays" and steps.steps >= 40
    assert steps.period_kernels == prof["kernels_per_step"] == 776
    assert abs(steps.step_ms / 5.715 - 1) < 0.03
    m = window_metrics(reclocked(w, steps), 132, "9.0")
    assert abs(m.kernel_sum_ms_per_token / prof["kernel_ms_per_step"] - 1) < 0.03
    pm = feed.pm_within(steps.bounds_ns[0], steps.bounds_ns[-1])  # the samples over the traced steps
    dt = (pm["gpu_t1_ns"] - pm["gpu_t0_ns"]).sum() / 1e9
    bytes_per_step = (pm["dram_read_bytes"] + pm["dram_write_bytes"]).sum() / dt * steps.step_ms / 1e3
    weights = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096)
    assert len(pm["rx_ns"]) > 100 and abs(bytes_per_step / weights - 1) < 0.10
    assert np.isfinite(bytes_per_step)


def test_a_copy_bandwidth_measured_beside_a_busy_loop_is_not_the_floors():
    """The compiled 8B recording's header kept the copy it measured while the loop kept DRAM busy (2,217 GB/s, 46%
    of the H200's 4,814 GB/s NVML peak; the same device alone copies ~4,248): the floor is priced on the peak,
    said to be a spec figure and why, not on a figure that would halve it."""
    j = replay(DATA / "h200_compiled_llama8b_nomarks.dmon").as_json()
    assert j["bandwidth_gbs"] == pytest.approx(4814.3) and "spec figure" in j["bandwidth_source"]
    assert "2216 GB/s" in j["bandwidth_source"]
    j = replay(DATA / "h200_hf_generate_static.dmon").as_json()  # a copy measured alone is kept as measured
    assert j["bandwidth_gbs"] == pytest.approx(4248.3) and j["bandwidth_source"].startswith("measured copy")


def test_the_compiled_8b_summary_reads_its_step_bytes_and_bandwidth_off_the_traced_steps():
    """The summary a user gets (`replay --json`) of the compiled 8B recording: the process ended after its one
    window, so the PM samples outside it are an idle GPU, not untraced steps. ms/token and bytes per token come
    from the traced steps themselves: within 3% of the loop's own 5.715 ms and 10% of the 15.0 GB of weights."""
    j = replay(DATA / "h200_compiled_llama8b_nomarks.dmon").as_json()
    weights = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096)
    assert j["token_clock"] == "graph replays" and abs(j["ms_per_token"] / 5.715 - 1) < 0.03
    assert abs(j["bytes_per_token_measured"] / weights - 1) < 0.10
    assert j["ceiling"] == "bandwidth" and j["candidates"]["bandwidth"]["state"] == "binding"


def test_the_compiled_8b_loop_is_timed_by_its_graph_replays_with_no_window_at_all():
    """The same compiled 8B loop recorded for 8 s under `decodemon run` (H200, 2026-12-01 21:15 UTC, tree of
    3046e97). A process that replays CUDA graphs and marks nothing gets no traced window, so its clock is the
    replays the adapter counted: the host enqueues ~200 steps in a burst, then waits for the GPU, and the rate is
    read between the bursts' starts. The loop's own clock read 5.700 ms/token over the recorded seconds."""
    j = replay(DATA / "h200_compiled_llama8b_replays.dmon").as_json()
    frames = [f for _, f in wire.read_recording(DATA / "h200_compiled_llama8b_replays.dmon")]
    assert not any(isinstance(f, (wire.KernelWindow, wire.TokenMarks)) for f in frames)
    weights = 2 * (32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 128256 * 4096)
    assert j["token_clock"] == "replay_count" and abs(j["ms_per_token"] / 5.700 - 1) < 0.03
    assert j["tokens"] >= 800 and j["kernels_per_token"] is None  # no window: no launch count, and none made up
    assert abs(j["bytes_per_token_measured"] / weights - 1) < 0.10
    assert j["ceiling"] == "bandwidth" and j["candidates"]["bandwidth"]["state"] == "binding"
    assert j["candidates"]["bandwidth"]["value"] == pytest.approx(1.74, abs=0.03)
