"""The committed H200 recordings, replayed on a CPU: the live loop's figures and the verdicts."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.ceilings import SHORT_KERNEL_US
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.session import Session
from decodemon.probes import wire
from tests.conftest import REC, cli


def replay(name, *more):
    r = cli("replay", REC[name], "--json", *more)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def eager():
    return replay("eager")


@pytest.fixture(scope="module")
def graph():
    return replay("graph")


def test_recordings_are_real_h200_captures():
    for name, path in REC.items():
        frames = [f for _, f in wire.read_recording(path)]
        hello = next(f for f in frames if isinstance(f, wire.Hello))
        assert hello.gpu.name == "NVIDIA H200" and hello.gpu.sm_count == 132, name
        assert hello.gpu.driver_version.startswith("580."), name
        assert sum(isinstance(f, wire.KernelWindow) for f in frames) >= 4, name
        assert path.stat().st_size < 1_000_000, name


def test_eager_live_loop_figures(eager):
    assert eager["device"] == "NVIDIA H200" and eager["sm_count"] == 132
    assert eager["kernels_per_token"] >= 900
    assert eager["graph_launches_per_token"] == 0
    assert eager["kernel_launch_calls_per_token"] >= 900
    assert eager["gpu_busy_pct"] < 50
    assert 15 < eager["ms_per_token"] < 30
    assert eager["kernel_sum_ms_per_token"] < 0.3 * eager["ms_per_token"]  # the kernels' sum is a fraction of the step
    k = eager["kernels"][0]
    assert {"name", "calls_per_token", "us_mean", "grid_blocks", "block_threads", "grid_vs_sms"} <= set(k)
    assert k["grid_vs_sms"].endswith("/132")


def test_graph_live_loop_figures(graph):
    assert graph["kernels_per_token"] >= 900
    assert graph["graph_launches_per_token"] == 1
    assert graph["kernel_launch_calls_per_token"] == 0
    assert graph["gpu_busy_pct"] > 80 and graph["gpu_busy_source"].startswith("PM")
    assert 15 < graph["sm_active_pct"] < 40
    assert graph["dram_pct"] is not None and graph["dram_pct"] < 20
    assert 3 < graph["ms_per_token"] < 5
    assert graph["probe"]["pm"].startswith("armed")


def test_pm_busy_agrees_with_traced_window(graph):
    assert abs(graph["pm_gpu_busy_pct"] - graph["traced_gpu_busy_pct"]) <= 5


def test_eager_verdict_is_launch(eager):
    assert eager["ceiling"] == "launch" and eager["verdict"] == "launch"
    assert eager["candidates"]["launch"]["state"] == "binding"
    assert eager["candidates"]["bandwidth"]["state"] == "ruled_out"
    assert eager["candidates"]["comm"]["state"] == "ruled_out"
    assert 5 <= eager["us_per_kernel"] <= 20  # an eager launch costs the host 5-20 µs
    assert "graph" in eager["falsify"].lower()


def test_graph_verdict_is_occupancy_not_launch(graph):
    assert graph["ceiling"] == "occupancy" and graph["verdict"] == "occupancy"
    assert graph["candidates"]["launch"]["state"] == "ruled_out"
    assert graph["candidates"]["occupancy"]["value"] > 50
    assert graph["sm_active_pct"] < 0.5 * graph["gpu_busy_pct"]
    assert "Widen" in graph["falsify"]
    # the kernel it names is one more blocks could shorten: not a call of a few µs, held by its fixed latency
    named = [k for k in graph["kernels"] if graph["falsify"].startswith(f"Widen {k['label']} from {k['grid_blocks']} ")]
    assert named and named[0]["us_mean"] >= SHORT_KERNEL_US, graph["falsify"]
    assert any(k["us_mean"] < SHORT_KERNEL_US and k["grid_coverage_pct"] < 25 and k["us_per_token"] > named[0][
        "us_per_token"] for k in graph["kernels"])  # a shorter small grid held more of the token, and was passed over


def test_graph_report_names_the_small_grid_kernels(tmp_path):
    out = tmp_path / "DIAGNOSIS.md"
    r = cli("report", REC["graph"], "-o", out)
    assert r.returncode == 0, r.stderr
    md = out.read_text()
    assert "Binding ceiling: **OCCUPANCY**" in md
    assert "native::elementwise_kernel" in md and "/132" in md
    assert "would prove this wrong" in md
    # the report covers the whole recording: PM against the traced kernels pooled over all its windows' samples
    assert ("the same 4 PM samples: GPU busy 100.0% from PM's counter, 95.9% from the traced kernels' union over "
            "those samples (--json pm_vs_window)") in md
    assert "traced-token busy" not in md  # the help's name for traced_token_busy_pct, another figure
    last = cli("report", REC["graph"], "--last", 5)  # the last 5 s: the one window in them, as the screen shows it
    assert last.returncode == 0, last.stderr
    assert ("the same 1 PM sample: GPU busy 100.0% from PM's counter, 95.7% from the traced kernels' union over "
            "those samples (--json pm_vs_window)") in last.stdout


def test_bandwidth_by_construction_8b_graph():
    # the whole recording reads 7.722 ms/token, 2.005x the floor, just past BANDWIDTH's 2x: the pinned verdict is
    # the last 5 s's (7.696 ms/token, 1.999x), as the screen shows it
    whole = replay("llama8b_graph")
    assert 1.9 < whole["candidates"]["bandwidth"]["value"] < 2.1
    assert whole["rolling_5s"]["ceiling"] == "bandwidth"
    d = replay("llama8b_graph", "--last", 5)
    bw = d["candidates"]["bandwidth"]
    # 16.1 GB of weights per token: the graphed 8B step came out at 2.0x the bandwidth floor
    assert 1.9 < bw["value"] < 2.1
    assert d["ceiling"] == "bandwidth" and bw["state"] == "binding"
    assert d["candidates"]["launch"]["state"] == "ruled_out"
    assert d["kernel_sum_ms_per_token"] > 0.95 * d["ms_per_token"]


def test_occupancy_by_construction_12_block_kernel():
    d = replay("narrow12_graph")
    assert d["ceiling"] == "occupancy" and d["verdict"] == "occupancy"
    top = d["kernels"][0]
    assert top["name"] == "_stream" and top["grid_blocks"] == 12 and top["grid_vs_sms"] == "12/132"
    assert "_stream" in d["falsify"] and "12 blocks" in d["falsify"]


def test_rolling_history_of_a_replayed_recording_is_deterministic():
    s1, s2 = Session(), Session()
    for rx, f in wire.read_recording(REC["graph"]):
        s1.add(rx, f)
        s2.add(rx, f)
    assert s1.history() == s2.history()
    assert s1.history()[0].startswith("UNKNOWN → OCCUPANCY at ")
    assert summary_json(s1.snapshot())["history"] == s1.history()


def test_kernel_share_of_the_step_is_shown_beside_pm_busy(graph, eager):
    # graph (PM on): the kernels' share of the untraced step sits beside the counter's busy figure
    share = 100 * graph["kernel_sum_ms_per_token"] / graph["ms_per_token"]
    assert graph["kernel_share_of_step_pct"] == pytest.approx(min(100.0, share), abs=0.1)
    # eager recording without PM: busy is that same kernel share, so the two figures coincide
    assert eager["gpu_busy_source"] == "the kernel share (traced kernel time ÷ ms/token)"
    assert eager["kernel_share_of_step_pct"] == pytest.approx(eager["gpu_busy_pct"], abs=0.1)


def test_the_graphs_memcpy_node_is_a_kernel_and_the_profiler_count_keeps_it():
    # decodemon counted 1,864 kernels per graphed token, the benchmark's torch.profiler count 1,863: the
    # 1,864th is the driver's memcpy32_post (the graph's memcpy node run as a kernel), which the benchmark's
    # old name filter ("memcpy" anywhere in the name) dropped
    from decodemon.engine_adapter.demo import is_copy_or_set

    w = next(f for _, f in wire.read_recording(REC["graph"]) if isinstance(f, wire.KernelWindow))
    b, st, nm = w.token_bounds_ns.array(), w.kernels["start"].array(), w.kernels["name"].array()
    in_token = [w.names[i] for i in nm[(st >= b[0]) & (st < b[1])]]
    assert len(in_token) == 1864 and in_token.count("memcpy32_post") == 1
    assert not is_copy_or_set("memcpy32_post")
    assert is_copy_or_set("Memcpy DtoH (Device -> Pinned)") and is_copy_or_set("Memset (Device)")


def test_what_watching_costs_the_decode_thread_is_read_from_the_windows(eager, graph):
    """The observer's bill per window: the probe's own decode-thread time (probe_host_ns: CUPTI's start-up,
    flush, finalize) plus the traced tokens' stretch over an untraced token, and its share of the loop's time."""
    import statistics

    for name, j in (("eager", eager), ("graph", graph)):
        frames = [(rx, f) for rx, f in wire.read_recording(REC[name])]
        wins = [(rx, f) for rx, f in frames if isinstance(f, wire.KernelWindow)]
        o = j["observer_cost"]
        assert o["probe_ms_per_window"] == pytest.approx(statistics.median(f.probe_host_ns for _, f in wins) / 1e6,
                                                         abs=0.01)
        gaps = [b[0] - a[0] for a, b in zip(wins, wins[1:])]
        assert o["window_every_s"] == pytest.approx(statistics.median(gaps) / 1e9, abs=0.01)
        per_window = o["probe_ms_per_window"] + o["tracing_ms_per_window"]
        assert o["share_of_loop_pct"] == pytest.approx(100 * per_window / (o["window_every_s"] * 1e3), rel=0.01)
        # traced tokens run slower than untraced ones (CUPTI's per-launch cost), so the stretch is real time
        assert 5 < o["tracing_ms_per_window"] < 60 and 15 < o["probe_ms_per_window"] < 60, (name, o)
        assert 0.3 < o["share_of_loop_pct"] < 3, (name, o)
        # these recordings predate CUPTI's start-up on the agent thread: the whole start-up is in probe_host_ns
        assert o["cupti_start_off_thread_ms"] is None


def test_the_bill_names_cuptis_start_up_when_the_agent_thread_made_it():
    from decodemon.monitor.render.text import observer_parts

    o = {"probe_ms_per_window": 8.2, "tracing_ms_per_window": 20.1, "window_every_s": 4.0, "share_of_loop_pct": 0.7}
    assert "off-thread" not in "".join(observer_parts(o))
    assert "(CUPTI start 14 ms off-thread)" in observer_parts({**o, "cupti_start_off_thread_ms": 13.9})[0]


def test_pm_and_the_traced_kernels_agree_sample_by_sample_over_the_traced_tokens():
    # PM's samples and CUPTI's kernel records carry one clock: inside a traced window, each 2 ms sample's busy
    # counter follows the kernel union over exactly its interval (the eager recording, every sample evaluated)
    import numpy as np

    from decodemon.monitor.feed import pm_columns
    from decodemon.monitor.analysis.busy import busy_within

    frames = [f for _, f in wire.read_recording(REC["eager_pm"])]
    cols = np.concatenate([pm_columns(0, f) for f in frames if isinstance(f, wire.PmSamples)], axis=1)
    t0, t1, busy = cols[5], cols[6], cols[1]
    for w in (f for f in frames if isinstance(f, wire.KernelWindow)):
        b = w.token_bounds_ns.array()
        m = (t0 >= b[0]) & (t1 <= b[w.tokens])
        assert m.sum() >= 10
        traced = busy_within(w.kernels["start"].array(), w.kernels["end"].array(), t0[m], t1[m])
        assert np.corrcoef(busy[m], traced)[0, 1] > 0.9
        # the kernels read 5 ms late no longer follow the samples as closely
        late = busy_within(w.kernels["start"].array(), w.kernels["end"].array(), t0[m] + 5e6, t1[m] + 5e6)
        assert np.corrcoef(busy[m], late)[0, 1] < np.corrcoef(busy[m], traced)[0, 1] - 0.1


def test_pm_vs_window_leaves_out_a_graphed_windows_idle_head(graph):
    from decodemon.monitor.analysis.busy import pm_window_check

    c = graph["pm_vs_window"]
    assert c["samples"] >= 1 and abs(c["pm_gpu_busy_pct"] - c["window_gpu_busy_pct"]) <= 5
    # with the head (the traced cudaGraphLaunch: GPU idle while CUPTI instruments the graph) the same check
    # would count samples both instruments call idle
    frames = [f for _, f in wire.read_recording(REC["graph"])]
    w = next(f for f in frames if isinstance(f, wire.KernelWindow))
    pm = [f for f in frames if isinstance(f, wire.PmSamples)]
    import numpy as np

    t0 = np.concatenate([p.start_ns.array() for p in pm])
    t1 = np.concatenate([p.end_ns.array() for p in pm])
    from decodemon.monitor.feed import pm_columns

    busy = np.concatenate([pm_columns(0, p)[1] for p in pm])
    b = w.token_bounds_ns.array()
    whole = (t0 >= b[0]) & (t1 <= b[w.tokens])
    one = pm_window_check(w, t0, t1, busy)
    assert one is not None and one.samples < whole.sum()
    assert busy[whole].min() < 1 and one.pm_busy_pct > 50


# -- windows that trace kernels only (Attach.api_every) ---------------------------------------------------------
# h200_{eager,graph}_api2.dmon: `decodemon record --window-period 1 --probe api_every=2 --probe window_max_s=1
# --probe window_min_tokens=0` on the H200 (driver 580.159.04): their windows alternate, launch calls traced in one,
# kernels only in the next, in one process, starting with a traced one.

def _windows(name):
    from decodemon.monitor.analysis.window import window_metrics

    return [window_metrics(f, 132) for _, f in wire.read_recording(REC[name]) if isinstance(f, wire.KernelWindow)]


@pytest.mark.parametrize("name", ["eager_api2", "graph_api2"])
def test_kernels_only_windows_count_the_launches_the_full_windows_count(name):
    ws = _windows(name)
    full, kern = [w for w in ws if w.apis_traced], [w for w in ws if not w.apis_traced]
    assert len(full) >= 3 and len(kern) >= 3  # they alternate in the recording
    for w in ws:
        assert w.kernels_per_token == full[0].kernels_per_token  # 1,863 eager, 1,864 graphed
        # a graph's kernels carry their cudaGraphLaunch's correlation id: one graph launch per token either way
        assert w.graph_launches_per_token == full[0].graph_launches_per_token
    for w in kern:
        assert len(w.timeline.cpu) == 0 and len(w.timeline.gpu) > 0  # no CPU lane, the GPU lane as ever
        assert "unsplit" in w.gap_ms_per_token
    if name == "graph_api2":
        assert full[0].graph_launches_per_token == 1.0 and full[0].kernel_launch_calls_per_token == 0
        for w in kern:  # the traced graph launch's head is still the observer's, not the host's
            assert w.tracing_head_ms > 1 and w.gap_ms_per_token["host_late"] == 0
            assert abs(w.gpu_busy_pct - full[0].gpu_busy_pct) < 2
    else:
        assert full[0].graph_launches_per_token == 0
        for w in kern:  # each kernel is one launch call: runtime (cudaLaunchKernel) or driver (cuLaunchKernel)
            assert w.kernel_launch_calls_per_token == w.kernels_per_token
            # the idle the host caused is not split out without launch calls; it is most of the token
            g = w.gap_ms_per_token
            assert g["unsplit"] > 10 * (g["other"] + g["short"]) and g["unsplit"] > 0.5 * w.traced_ms_per_token
        for w in full:  # the host's, from the same correlation ids; the runtime layer's own fewer (cuBLAS
            # launches through the driver)
            assert w.kernel_launch_calls_per_token == w.kernels_per_token and "unsplit" not in w.gap_ms_per_token
            assert 0 < w.runtime_launch_calls_per_token < w.kernels_per_token


def test_a_kernels_only_window_leaves_the_launch_calls_to_the_last_window_that_traced_them():
    s = Session()
    kinds = []
    for rx, f in wire.read_recording(REC["eager_api2"]):
        s.add(rx, f)
        if isinstance(f, wire.KernelWindow):
            snap = s.snapshot()
            kinds.append(f.apis_traced)
            if f.apis_traced:
                assert snap.api_window is snap.window and snap.api_window_age_s == 0
            else:
                assert snap.api_window is not None and snap.api_window is not snap.window
                assert snap.api_window.apis_traced and snap.api_window_age_s > 0
                js = summary_json(snap)
                assert js["launch_calls_traced_s_ago"] == round(snap.api_window_age_s, 1)
                assert js["gap_ms_per_token"]["unsplit"] == 0 and js["gap_ms_per_token"]["host_late"] > 0
                assert js["runtime_launch_calls_per_token"] == round(snap.api_window.runtime_launch_calls_per_token, 1)
                assert js["kernel_launch_calls_per_token"] == round(snap.window.kernel_launch_calls_per_token, 1)
    assert kinds[:4] == [True, False, True, False]


def test_before_any_window_traced_the_runtime_calls_json_has_none_of_theirs_and_the_gaps_say_unsplit():
    s = Session()
    for rx, f in wire.read_recording(REC["graph_api2"]):
        s.add(rx, f)
        if isinstance(f, wire.KernelWindow) and not f.apis_traced:
            s.metrics = [(r, m) for r, m in s.metrics if not m.apis_traced]  # as if no traced one had come yet
            js = summary_json(s.snapshot())
            assert js["runtime_launch_calls_per_token"] is None and js["launch_calls_traced_s_ago"] is None
            assert js["kernel_launch_calls_per_token"] == 0 and js["host_launch_calls_per_token"] == 1.0
            assert js["gap_ms_per_token"]["unsplit"] is not None and js["graph_launches_per_token"] == 1.0
            assert js["gap_ms_per_token"]["host_late"] is None  # no launch calls: not measured, not 0
            return
    raise AssertionError("no kernels-only window in the recording")


def test_the_bill_names_the_decode_threads_waits_when_the_probe_reads_them():
    """The probe's `decode_waits_per_s` reaches observer_cost (and --json) and the bill's words."""
    from decodemon.monitor.render.text import observer_parts

    o = {"probe_ms_per_window": 8.2, "tracing_ms_per_window": 20.1, "window_every_s": 4.0, "share_of_loop_pct": 0.7,
         "decode_waits_per_s": 44.6}
    assert observer_parts(o)[-1] == "; the decode thread blocked 45×/s (waits for the GIL, its own too)"
    assert not any("blocked" in p for p in observer_parts({**o, "decode_waits_per_s": None}))
    sess = Session(label="x")
    for rx, f in wire.read_recording(REC["eager"]):
        sess.add(rx, f)
    snap = sess.snapshot()
    assert snap.observer["decode_waits_per_s"] is None  # a recording from before the probe read them
    sess.feed.state["decode_waits_per_s"] = "12.5"
    assert sess.snapshot().observer["decode_waits_per_s"] == 12.5
    assert snap.observer["agent_cpu_ms_per_s"] is None  # likewise the agent thread's CPU
    sess.feed.state["agent_cpu_ms_per_s"] = "41.3"
    o2 = sess.snapshot().observer
    assert o2["agent_cpu_ms_per_s"] == 41.3
    assert observer_parts(o2)[-1] == ("; the agent thread used 41.3 ms of CPU in the last second it reported (an older probe: it "
                                    "reports its last second, not the whole attach), 4.1% of a core beside the loop (not billed to the decode "
                                    "thread: it holds the loop back only while it holds the GIL)")
    sess.feed.state["cupti_start_cpu_ms"] = "812.0"  # CUPTI's start-up, made on the agent thread, is named apart
    sess.feed.state["agent_cpu_over_s"] = "12.0"  # a probe that reads it over the attach says over how long
    assert observer_parts(sess.snapshot().observer)[-2:] == [
        "; the agent thread used 41.3 ms of CPU a second over the attach's 12 s, 4.1% of a core beside the loop (not "
        "billed to the decode thread: it holds the loop back only while it holds the GIL)",
        " (and 812 ms in CUPTI's start-up, without the GIL)"]
    sess.feed.state["cupti_finalize_cpu_ms"] = "6.4"  # and the finalizes the agent thread made (an eager loop's)
    assert observer_parts(sess.snapshot().observer)[-1] == (
        " (and 812 ms in CUPTI's start-up and 6 ms in CUPTI's finalizes, without the GIL)")
