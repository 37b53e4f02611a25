"""DIAGNOSIS.md says what the screen says, in its words: the launch bill, GPU busy and its source, the traced
kernels longer than the step, PM armed with no sample; each from the function the screen and --json use."""

from __future__ import annotations

import asyncio

import pytest

from decodemon.monitor.analysis.agreement import kernels_past_step
from decodemon.monitor.probe_status import pm_silence
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.render.markdown import diagnosis_markdown
from decodemon.monitor.sources.collect import collect
from tests.conftest import REC, cli


@pytest.fixture(scope="module")
def graph():
    return collect(str(REC["graph"])).snapshot()


@pytest.fixture(scope="module")
def eager():
    return collect(str(REC["eager"])).snapshot()


def test_the_report_flags_kernels_past_the_step_as_the_screen_does(graph, eager):
    past = kernels_past_step(graph)
    assert past.startswith("kernels 3.98 ms are 102% of the 3.911 ms median step")
    md = diagnosis_markdown(graph)
    assert f"- ⚠ {past}" in md
    assert summary_json(graph)["kernels_past_step"] == past  # --json says the same
    assert kernels_past_step(eager) == "" and "⚠ kernels" not in diagnosis_markdown(eager)
    r = cli("report", REC["graph"], "--last", 5, timeout=300)  # the screen's span: the report covers the whole
    assert r.returncode == 0, r.stderr                           # recording unless told --last
    assert f"⚠ {past}" in r.stdout


def test_the_report_names_the_launch_figures_as_the_launches_panel_does(eager, graph):
    md = diagnosis_markdown(eager)
    assert ("- 1863 kernels/token: 1863 kernel launch calls (1638 through the runtime, 225 through the driver) · "
            "0 graph launches · 4 copies; kernel time") in md
    assert "kernel launches/token" not in md and "(0.00 graph launches)" not in md
    w = eager.window
    assert (f"{w.kernels_per_token:.0f} kernels/token: {w.kernel_launch_calls_per_token:.0f} kernel launch calls (") in md
    assert "1864 kernels/token: 0 kernel launch calls · 1 graph launch · 3 copies" in diagnosis_markdown(graph)


def test_every_us_per_kernel_in_the_report_says_what_it_divides_by(eager):
    md = diagnosis_markdown(eager)
    n = eager.inputs.kernels_per_token
    assert n == 1863 and eager.window.kernels_per_token == n  # the kernels, not the 1638 runtime launch calls
    assert f"- {eager.diagnosis.us_per_kernel:.2f} µs idle per kernel, over 1863 kernels/token" in md
    row = next(line for line in md.splitlines() if line.startswith("| LAUNCH |"))
    # the number is the idle share its threshold reads; the seeds' µs a kernel beside it, with what it divides by
    launch = eager.diagnosis.candidates["launch"]
    assert f"| {launch.value:.4g} % of step GPU idle (8.87 µs idle per kernel, 1863 kernels/token) |" in row
    assert launch.value == pytest.approx(100 * (1 - eager.inputs.kernel_sum_ms_per_token / eager.inputs.ms_per_token))


def test_the_eager_report_says_gpu_busy_with_its_source_and_that_pm_was_silent(eager, graph):
    md = diagnosis_markdown(eager)
    assert eager.busy_source == "the kernel share (traced kernel time ÷ ms/token)"
    assert "- GPU busy 19% from the kernel share (traced kernel time ÷ ms/token)" in md
    silent = pm_silence(eager)
    assert silent and silent == summary_json(eager)["pm_silent"]  # the words --json and the telemetry panel give
    assert f"- {silent}" in md and "SM active and DRAM are not measured" in md
    # PM delivered in the graph recording: its busy says so, and no silence is claimed
    gmd = diagnosis_markdown(graph)
    assert pm_silence(graph) is None and "no sample in" not in gmd
    assert f"- GPU busy {graph.gpu_busy_pct:.0f}% from PM counters (device-wide)" in gmd
    assert "- SM active 22%, DRAM 6.6% of peak (PM sampling, device-wide)" in gmd


async def _screen(path):
    """The snapshot at the end of a recording and the launches, timeline and telemetry panels' text."""
    from decodemon.monitor.app import DecodemonApp
    from decodemon.monitor.player import RecordingPlayer
    from decodemon.monitor.widgets.launches import LaunchesPanel
    from decodemon.monitor.widgets.telemetry import TelemetryPanel
    from decodemon.monitor.widgets.timeline import TimelinePanel

    player = RecordingPlayer(str(path), path.stem)
    app = DecodemonApp([player], start_at_s=player.end_ns / 1e9, paused=True, out_dir=".")
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        return app.players[0].snapshot(), {cls.__name__: app.query(cls).first()._put_last.plain.replace("\n", " ")
                                           for cls in (LaunchesPanel, TimelinePanel, TelemetryPanel)}


@pytest.mark.parametrize("name", ["eager", "graph"])
def test_the_report_and_the_screen_say_the_same_figures_in_the_same_words(name):
    s, screen = asyncio.run(_screen(REC[name]))
    md = diagnosis_markdown(s)
    w = s.window
    assert f"{w.kernels_per_token:.0f} kernels/token" in screen["LaunchesPanel"]
    calls = screen["LaunchesPanel"].split(" kernel launch calls")[0].split()[-1]
    graphs = "graph launch" if round(w.graph_launches_per_token) == 1 else "graph launches"
    split = screen["LaunchesPanel"].split(" kernel launch calls")[1].split(" · ")[0]  # the runtime's and driver's
    bill = f"{calls} kernel launch calls{split} · {w.graph_launches_per_token:.0f} {graphs}"
    assert bill in screen["LaunchesPanel"] and bill in md
    busy = f"GPU busy {s.gpu_busy_pct:.0f}% from {s.busy_source}"
    assert busy in screen["TimelinePanel"] and f"- {busy}" in md
    past = kernels_past_step(s)
    assert (f"⚠ {past}" in screen["TimelinePanel"] and f"- ⚠ {past}" in md) if past else "⚠ kernels" not in md
    silent = pm_silence(s)
    assert (silent in screen["TelemetryPanel"] and f"- {silent}" in md) if silent else "no sample in" not in md


def test_a_batched_engines_report_names_steps_and_its_throughput():
    from tests.conftest import DATA

    s = collect(str(DATA / "h200_hf_cb_16.dmon")).snapshot()
    md = diagnosis_markdown(s)
    assert (f"{s.tokens_per_step:g} tokens/step; {s.throughput_tokens_per_s:.1f} tokens/s in all (the tokens "
            "counted, not steps/s × tokens/step)") in md
    assert f"{s.tokens.ms_per_token:.3f} ms/step median" in md
    assert f"steps/s over {s.tokens.tokens} clock steps;" in md and "over the last" not in md
    assert "ms/token" not in md and "kernels/token" not in md  # a step is what the diagnosis priced


def test_the_report_says_its_rate_is_over_clock_steps_and_how_many_tokens_it_counted():
    # 912 token marks make 911 steps from one mark to the next: the rate is over the steps, not "the last 911 tokens"
    r = cli("report", REC["eager"], timeout=300)
    assert r.returncode == 0, r.stderr
    assert ("44.3 tokens/s over 911 clock steps (a clock step, one the screen's tokens timed: from one token mark to the next), 912 tokens counted\n"
            in r.stdout)
    assert "over the last" not in r.stdout
    r = cli("report", REC["eager"], "--last", 3, timeout=300)  # a part of the recording: its tokens of all of them
    assert r.returncode == 0, r.stderr
    assert "tokens/s over 124 clock steps (a clock step, one the screen's tokens timed: from one token mark to the next), 125 tokens counted of 912 " \
           "in all\n" in r.stdout


def test_a_counted_clocks_steps_are_not_called_mark_to_mark_and_a_batched_step_is_not_a_token():
    from tests.conftest import DATA

    md = diagnosis_markdown(collect(str(DATA / "h100_compiled_llama8b_marks_1.dmon")).snapshot())
    assert "ms/token mean" in md and "(a clock step, one the screen's tokens timed: one mark of a burst, timed over whole bursts)" in md
    assert "from one token mark to the next" not in md
    np4 = diagnosis_markdown(collect(str(DATA / "h100_llama_cpp_server1b_np4.dmon")).snapshot())
    assert "ms token" not in np4 and "ms step" in np4
