"""Every figure says where it comes from and what its arithmetic used: the window the kernel figures are read from
(outside the span where the span traced none), the figures a share divides, the launches LAUNCH counted, and the KV
depth the model's bytes were priced at."""

from __future__ import annotations

import json
import re

import pytest

from decodemon.monitor.render.json import summary_json
from decodemon.monitor.sources.collect import collect_recording
from decodemon.monitor.span import summary_snapshot
from tests.conftest import DATA, cli


def _json(*args):
    r = cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_span_that_traced_no_window_says_its_kernel_figures_come_from_one_before_it():
    j = _json("replay", DATA / "h200_graph.dmon", "--last", "1")
    k = j["kernels_from"]
    assert k["in_span"] is False and k["windows_in_span"] == 0
    # the window arrived before the span began, and the summary says when, on the span's own clock
    assert k["window_received_s"] < j["span"]["from_s"]
    assert k["s_before_span"] == pytest.approx(j["span"]["from_s"] - k["window_received_s"], abs=0.002)
    # the figures themselves are that window's, as they were
    sess = collect_recording(str(DATA / "h200_graph.dmon"))
    rx, latest = sess.metrics[-1]
    assert k["window_received_s"] == round(rx / 1e9, 3)
    assert j["kernel_sum_ms_per_token"] == round(latest.kernel_sum_ms_per_token, 4)
    assert j["kernels_per_token"] == round(latest.kernels_per_token, 1)
    # the report says it in a line of its own
    r = cli("report", DATA / "h200_graph.dmon", "--last", "1")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if "kernel figures:" in ln)
    assert f"received at {k['window_received_s']:g} s, before this span" in line
    assert f"({j['span']['from_s']:.3f}–{j['span']['to_s']:.3f} s)" in line


def test_a_span_that_traced_windows_says_its_kernel_figures_are_its_own():
    j = _json("replay", DATA / "h200_graph.dmon")
    assert j["kernels_from"]["in_span"] is True and j["kernels_from"]["windows_in_span"] == j["windows"]
    assert j["kernels_from"]["s_before_span"] is None
    r = cli("report", DATA / "h200_graph.dmon")
    assert "kernel figures:" not in r.stdout


def _numbers(note: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) ms", note)]


@pytest.mark.parametrize("path", [DATA / "h200_tp2_eager_samewindow_rank0.dmon",
                                  DATA / "h200_tp2_eager_samewindow_rank1.dmon", DATA / "h200_eager.dmon"])
def test_the_kernel_share_note_states_the_figures_its_arithmetic_used(path):
    snap = summary_snapshot(collect_recording(str(path)))
    j = summary_json(snap)
    note, i = j["kernel_share_of_step_note"], snap.inputs
    assert note is not None
    # the kernels' ms it used (the median of the span's windows), the wait it took out, the step it divides by
    assert f"the traced kernels {i.kernel_ms:.4g} ms/token" in note  # their union: those at once count once
    assert f"over the {i.ms_per_token:.4g} ms median step = {j['kernel_share_of_step_pct']:.1f}%" in note
    assert f"median of the span's {snap.windows_in_span} traced windows" in note
    wait = i.collective_wait_ms_per_token
    kernels, step = i.kernel_ms, i.ms_per_token
    if wait:
        assert f"less {wait:.3g} ms/token of collectives waiting" in note
        # COMM's detail names the same wait the share took out
        assert f"not counted: {wait:.3g} ms/token" in j["candidates"]["comm"]["detail"]
        kernels -= wait
    # the stated figures make the share, to the rounding they are said at
    stated = _numbers(note)
    k_said, step_said = stated[0], stated[-1]
    wait_said = stated[1] if wait else 0.0
    assert 100 * (k_said - wait_said) / step_said == pytest.approx(j["kernel_share_of_step_pct"], abs=0.1)
    assert 100 * kernels / step == pytest.approx(j["kernel_share_of_step_pct"], abs=0.05)
    # where the JSON's kernel_busy_ms_per_token (the latest window's) is another figure, the note says so
    if snap.windows_in_span > 1:
        assert "kernel_busy_ms_per_token is the latest window's" in note


def test_launch_on_a_replayed_graph_says_the_launch_calls_and_graph_launches_it_counted():
    j = _json("replay", DATA / "h200_hf_generate_static.dmon")
    detail = j["candidates"]["launch"]["detail"]
    calls, graphs, kernels = (j["kernel_launch_calls_per_token"], j["graph_launches_per_token"],
                              j["kernels_per_token"])
    assert calls > 0 and graphs == 1  # a static cache's step: a graph and a few launch calls beside it
    assert f"{calls:.0f} kernel launch calls and 1 graph launch a token for {kernels:.0f} kernels" in detail
    assert "in one graph launch" not in detail


def test_the_model_bytes_say_the_kv_depth_they_were_priced_at():
    path = DATA / "h200_eager.dmon"
    sess = collect_recording(str(path))
    depths = sess.feed.depths(0)
    assert depths.min() < depths.max()  # the depth changed over the recording
    j = _json("replay", path)
    depth = j["bytes_per_token_model_depth"]
    model = sess.feed.hello.model
    assert j["bytes_per_token_model"] == model.weight_bytes + model.kv_bytes_per_position * depth
    assert depth == int(depths[-1])  # the last token's
    assert j["bytes_per_token"] == j["bytes_per_token_model"]  # no DRAM counters: the model priced the floor
    detail = j["candidates"]["bandwidth"]["detail"]
    assert f"priced at KV depth {depth}, the last token's" in detail
    assert f"depths {int(depths.min())}–{int(depths.max())}" in detail
