"""The GPU-side token clock read off real H200 kernel streams (windows that traced two whole tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from decodemon.monitor.token_clock import gpu_steps, kernel_period, match_share, reclocked
from decodemon.probes import wire
from tests.conftest import REC


def windows(name):
    return [f for _, f in wire.read_recording(REC[name]) if isinstance(f, wire.KernelWindow)]


def ids_in_start_order(w):
    order = np.argsort(w.kernels["start"].array(), kind="stable")
    return w.kernels["name"].array()[order]


@pytest.mark.parametrize("name,per_token,clock", [("eager", 1863, "kernel period"), ("eager_pm", 1863, "kernel period"),
                                                   ("graph", 1864, "graph replays"),
                                                   ("llama8b_graph", 2256, "graph replays")])
def test_the_kernel_sequence_repeats_once_per_token(name, per_token, clock):
    for w in windows(name):
        assert w.tokens + w.guard_tokens == 2  # the traced token and its guard: two whole steps
        s = gpu_steps(w)
        assert s is not None and s.period_kernels == per_token and s.clock == clock
        assert s.steps == 1
        assert s.graph_launches_per_step == (1.0 if clock == "graph replays" else 0.0)


def test_a_layer_repeats_almost_as_well_as_the_step_but_the_step_wins():
    ids = ids_in_start_order(windows("eager")[0])
    assert 0.95 < match_share(ids, 66) < 0.99  # one of 28 layers: the head and tail of the step break it
    assert match_share(ids, 1863) == 1.0
    assert kernel_period(ids) == 1863


def test_the_guard_tokens_step_measures_on_the_gpu_what_the_host_clock_says():
    # in a graphed window the guard token ran at the loop's own pace (the traced token before it is stretched)
    for w in windows("graph"):
        s = gpu_steps(w)
        tb = w.token_bounds_ns.array()
        assert s.step_ms == pytest.approx((tb[2] - tb[1]) / 1e6, rel=0.05)


def test_a_window_reclocked_to_gpu_steps_keeps_its_kernels():
    w = windows("graph")[0]
    s = gpu_steps(w)
    r = reclocked(w, s)
    assert r.tokens == s.steps and r.guard_tokens == 0
    assert tuple(r.token_bounds_ns.array()) == s.bounds_ns
    assert len(r.kernels["start"].array()) == len(w.kernels["start"].array())


def test_nothing_repeats_nothing_is_claimed():
    assert kernel_period(np.arange(500)) is None
    assert kernel_period(np.array([1, 2, 3])) is None


def test_marks_in_bursts_are_told_from_steady_ones():
    from decodemon.monitor.analysis.rates import marks_in_bursts

    steady = np.arange(200) * 5_000_000
    burst = np.concatenate([k * 1_000_000_000 + np.arange(200) * 700_000 for k in range(3)])  # 200 in 140 ms
    assert not marks_in_bursts(steady) and marks_in_bursts(burst)


def test_dram_bytes_a_second_skip_a_pumps_bogus_first_interval():
    """On the H200 a pump's first PM sample came back with a start days before its end; counted, it turned
    1.2 GB a token into a fraction of a byte."""
    from decodemon.monitor.analysis.rates import dram_bytes_per_s
    from decodemon.monitor.feed import Feed
    from tests.conftest import DATA

    f = Feed()
    for rx, fr in wire.read_recording(DATA / "h200_hf_generate_eager.dmon"):
        f.add(rx, fr)
    pm = f.pm_since(0)
    dt = pm["gpu_t1_ns"] - pm["gpu_t0_ns"]
    assert dt.max() > 1e6 * np.median(dt)  # the bogus interval is in the recording
    rate = dram_bytes_per_s(pm)
    assert 1e10 < rate < 1e11  # ~30-40 GB/s: an eager 0.6B loop reading 1.2 GB every ~30 ms


def _pm(t0_ns, dt_ns, bytes_per_s, n):
    import numpy as np

    a = t0_ns + np.arange(n) * dt_ns
    b = np.full(n, bytes_per_s * dt_ns / 1e9 / 2)
    return {"rx_ns": a.astype(float), "gpu_t0_ns": a.astype(float), "gpu_t1_ns": (a + dt_ns).astype(float),
            "dram_read_bytes": b, "dram_write_bytes": b}


def test_a_traced_step_is_scaled_back_by_the_dram_rate_it_lost_to_tracing():
    import numpy as np

    from decodemon.monitor.analysis.rates import gpu_step_stats, traced_dram_ratio

    # a graphed step moves 15 GB: 5.0 ms untraced (3.0 TB/s), 6.0 ms traced (2.5 TB/s)
    traced = _pm(1_000_000_000, 2_000_000, 2.5e12, 20)
    untraced_before = _pm(0, 2_000_000, 3.0e12, 100)
    untraced = {k: np.concatenate([untraced_before[k], traced[k]]) for k in traced}  # the regular ring has both
    span = (1_000_000_000, 1_040_000_000)
    ratio = traced_dram_ratio([traced], untraced, [span])
    assert abs(ratio - 2.5 / 3.0) < 1e-9
    bounds = [1_000_000_000 + k * 6_000_000 for k in range(7)]
    ts = gpu_step_stats([bounds], 99.0, 99.0, ratio)
    assert abs(ts.ms_per_token - 5.0) < 1e-6
    assert traced_dram_ratio([_pm(0, 2_000_000, 2.5e12, 3)], untraced, [span]) is None  # too few samples inside
    no_bytes = {k: v for k, v in untraced.items() if not k.startswith("dram")}
    assert traced_dram_ratio([traced], no_bytes, [span]) is None
    assert gpu_step_stats([bounds], 99.0, 99.0, None).ms_per_token == 6.0  # GPU-bound, no counters: as traced


def test_a_window_too_short_to_hold_a_whole_step_gives_no_step_clock():
    """A window by time of a few milliseconds can hold one step start, or two at the same ns: no ms/token from it
    (not 0 ms, which the verdict would divide by)."""
    from decodemon.monitor.analysis.rates import gpu_step_stats

    assert gpu_step_stats([[5_000_000]], 50.0, 50.0) is None
    assert gpu_step_stats([[5_000_000, 5_000_000]], 50.0, 50.0) is None
    assert gpu_step_stats([[5_000_000, 5_000_000], [7_000_000, 11_000_000]], 99.0, None).ms_per_token == 4.0


REPLAY_LOOP = """
import json, sys, time
import torch.cuda.graphs as g


class StandIn:
    # a CPU-only machine has no CUDA graph to replay: a class with CUDAGraph's replay method stands in for it
    def replay(self):
        time.sleep(0.002)  # as a replay's wait for the GPU, without the GIL


class Enqueued(StandIn):
    # a host that runs ahead: a replay only enqueues, and the wait for the GPU comes once a batch
    def replay(self):
        pass


g.CUDAGraph = StandIn if sys.argv[2] == "steady" else Enqueued
attn, mlp = g.CUDAGraph(), g.CUDAGraph()  # a step replays two graphs, each once
out = open(sys.argv[1], "w")
print("decoding", file=sys.stderr, flush=True)
while True:
    if sys.argv[2] == "steady":
        attn.replay()
        mlp.replay()
        out.write(f"{time.time()}\\n")
    else:  # 40 steps enqueued at once, then 0.7 s for the GPU to run them: the loop's own clock spreads them
        t0 = time.time()
        for _ in range(40):
            attn.replay()
            mlp.replay()
        time.sleep(0.7)
        t1 = time.time()
        out.write("".join(f"{t0 + (t1 - t0) * (k + 1) / 40}\\n" for k in range(40)))
    out.flush()
"""


@pytest.mark.parametrize("mode", ["steady", "bursts"])
def test_cuda_graph_replays_are_the_step_clock_of_a_loop_that_marks_nothing(tmp_path, mode):
    """A loop with no token marks and no traced window (as torch.compile's reduce-overhead decode on a GPU) is
    timed by its graph replays, counted by the adapter the agent installs at attach and removes at detach."""
    import json
    import time

    from tests.conftest import cli, run_script

    script, log = tmp_path / "replays.py", tmp_path / "steps.txt"
    script.write_text(REPLAY_LOOP)
    proc, pid = run_script(script, log, mode)
    try:
        t0 = time.time()
        r = cli("attach", pid, "--json", "--seconds", "6", timeout=60)
        t1 = time.time()
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        own = [float(x) for x in log.read_text().split()]
        own = [t for t in own if t0 + 0.5 < t < t1 - 0.5]
        own_ms = 1e3 * (own[-1] - own[0]) / (len(own) - 1)
        half = len(own) // 2  # the loop's own rate in each half of the span: this machine's noise on it
        halves = [1e3 * (o[-1] - o[0]) / (len(o) - 1) for o in (own[:half], own[half:])]
        noise = abs(halves[0] - halves[1]) / own_ms
        assert got["token_clock"] == "replay_count"
        # a step is both replays, not one; a burst's steps take the GPU's time, not the enqueue's (within 5%, or
        # within twice the loop's own half-to-half spread where a busy machine moves it more)
        assert got["ms_per_token"] == pytest.approx(own_ms, rel=max(0.05, 2 * noise)), \
            (got["ms_per_token"], own_ms, halves)
        assert got["tokens"] > 100 and got.get("throughput_tokens_per_s") is None
        r = cli("attach", pid, "--json", "--seconds", "3", timeout=60)  # the adapter came out and goes in again
        assert json.loads(r.stdout)["token_clock"] == "replay_count"
    finally:
        proc.terminate()
        proc.wait(30)


def _rows(times_s, steps):
    return {"t_ns": np.asarray(times_s, np.float64) * 1e9, "steps": np.asarray(steps, np.float64)}


def test_replays_read_whole_bursts_where_the_host_waits_for_the_gpu_and_skip_an_idle_host():
    from decodemon.monitor.analysis.tokens import replay_stats

    step = 0.0056
    # steady replays, a ship every 0.25 s; the host idle for 2 s between two generate() calls; steady again
    t = [0.25 * k for k in range(6)] + [3.25 + 0.25 * k for k in range(6)]
    s = [0.25 * k / step for k in range(6)] + [(1.5 + 0.25 * k) / step for k in range(6)]
    for busy in (30.0, None):  # PM says the GPU idled; without PM, runs of six rows are no bursts
        assert replay_stats(_rows(t, s), busy).ms_per_token == pytest.approx(5.6)
    # a host that enqueues 500 steps in 1 s (four ships), then waits 1.8 s for the GPU, which stays busy
    t = [2.8 * b + 0.25 * k for b in range(3) for k in range(4)]
    s = [500 * b + 125 * k for b in range(3) for k in range(4)]
    assert replay_stats(_rows(t, s), 99.0).ms_per_token == pytest.approx(5.6)
    assert replay_stats(_rows(t[:6], s[:6]), 99.0) is None  # one burst's start seen: nothing whole to time


def test_the_replays_a_step_makes_are_read_off_their_order():
    from decodemon.probes.policy import replays_per_step

    assert replays_per_step([7] * 40) == 1
    assert replays_per_step([1, 2] * 20) == 2  # attention and MLP graphs, once each a step
    assert replays_per_step([3, 3, 3, 3, 9] * 8) == 5  # a draft graph four times, the verify graph once
    assert replays_per_step([1] * 10 + [2] * 10 + [3] * 10) == 1  # a graph per batch-size bucket
    assert replays_per_step([5, 1] + [1, 2] * 20) == 2  # a one-off prefill graph does not hide the period


def test_the_replay_adapter_counts_only_while_attached_and_leaves_a_later_wrapper_in_place(monkeypatch):
    from decodemon.engine_adapter import cuda_graphs
    from decodemon.probes import session as sess
    from decodemon.probes import wire as w

    class Graph:
        def replay(self):
            return "replayed"

    original = Graph.__dict__["replay"]
    assert cuda_graphs.install(Graph) == "CUDA graph replays" and cuda_graphs.install(Graph) is None
    g = Graph()
    assert g.replay() == "replayed"  # dormant: nothing counted, nothing raised
    s = sess.Session(w.Attach(), None)
    monkeypatch.setattr(sess.ACTIVE, "session", s)
    g.replay(), g.replay()
    assert s.replay_log == [id(g), id(g)] and s.replay_t0 > 0
    cuda_graphs.uninstall()
    assert Graph.__dict__["replay"] is original and not cuda_graphs.installed()
    cuda_graphs.install(Graph)
    theirs = lambda self: "theirs"  # noqa: E731 - someone wrapped replay after us
    Graph.replay = theirs
    cuda_graphs.uninstall()
    assert Graph.__dict__["replay"] is theirs


def test_a_cpu_targets_step_clock_note_holds_its_steps_against_no_gpu_window():
    from types import SimpleNamespace

    from decodemon.monitor.diagnosis import Inputs
    from decodemon.monitor.render.json import _clock_note

    gpu = _clock_note(SimpleNamespace(token_clock="step_starts", inputs=Inputs(ms_per_token=1.0)))
    cpu = _clock_note(SimpleNamespace(token_clock="step_starts", inputs=Inputs(ms_per_token=1.0, no_gpu=True)))
    assert "held against the GPU's steps in the traced windows" in gpu
    assert "GPU's steps" not in cpu and cpu.endswith("(no GPU: no traced window)")
