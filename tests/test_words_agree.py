"""Exit codes and files that say what happened: a ledger that is not there is a wrong path (2), not a loop with
nothing measured (3); DIAGNOSIS.md ends in one newline however it is written."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import REC, cli


def test_grade_without_a_ledger_is_bad_input_and_with_nothing_open_is_nothing_to_grade(tmp_path):
    r = cli("grade", REC["graph"], "--ledger", tmp_path / "missing.jsonl", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "no ledger at" in r.stderr and "decodemon predict" in r.stderr
    assert not (tmp_path / "missing.jsonl").exists()  # nothing written in its place
    r = cli("predict", REC["eager"], "--change", "graph", "--expect", "-50%", "--ledger", tmp_path / "l.jsonl")
    assert r.returncode == 0, r.stderr
    assert cli("grade", REC["graph"], "--ledger", tmp_path / "l.jsonl").returncode == 0
    r = cli("grade", REC["graph"], "--ledger", tmp_path / "l.jsonl")  # graded once: nothing open is left
    assert r.returncode == 3 and "no open prediction" in r.stderr


def _ends_in_one_newline(text: str) -> bool:
    return text.endswith("\n") and not text.endswith("\n\n")


def test_diagnosis_md_ends_in_one_newline_to_a_file_to_stdout_and_with_its_ledger(tmp_path):
    assert cli("report", REC["graph"], "-o", tmp_path / "D.md").returncode == 0
    assert _ends_in_one_newline((tmp_path / "D.md").read_text())
    r = cli("report", REC["graph"])
    assert r.returncode == 0 and _ends_in_one_newline(r.stdout)
    ledger = tmp_path / "l.jsonl"
    assert cli("predict", REC["eager"], "--change", "graph", "--expect", "-50%", "--ledger", ledger).returncode == 0
    label = json.loads(ledger.read_text().splitlines()[0])["source"]
    r = cli("report", REC["graph"], "-o", tmp_path / "L.md", "--ledger", ledger, "--label", label)
    text = (tmp_path / "L.md").read_text()
    assert r.returncode == 0 and "graded the open prediction" in r.stderr
    assert "## Predictions and grades" in text and _ends_in_one_newline(text)


def test_the_collectives_block_gives_the_figures_comm_priced_and_comm_names_their_source():
    from tests.conftest import DATA

    for stem in ("h200_tp2_eager_samewindow_rank0", "h200_tp2_eager_samewindow_rank1", "h200_tp2_graph_rank1"):
        r = cli("replay", DATA / f"{stem}.dmon", "--json")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        c, detail = j["collectives"], j["candidates"]["comm"]["detail"]
        # COMM's equation, in the block's own figures
        assert detail.startswith(f"{c['calls_per_token']:g} calls × ")
        assert c["us_per_call"] == pytest.approx(c["kernel_us_per_call"] + c["launch_gap_us_per_call"], abs=0.02)
        said = float(re.match(r"[\d.]+ calls × ([\d.]+) µs", detail).group(1))
        assert said == pytest.approx(c["us_per_call"], abs=0.006)
        # the wait the block gives is the one COMM leaves out (and the kernel share takes out): one figure
        assert f"not counted: {c['wait_ms_per_token']:.3g} ms/token" in detail
        assert f"less {c['wait_ms_per_token']:.3g} ms/token" in j["kernel_share_of_step_note"]
        # and both say where they come from
        assert c["over"] and f"({c['over']})" in detail and "median of 2 traced windows" in c["over"]


def test_a_verdict_on_a_threshold_says_a_token_1pct_faster_reads_another():
    # the whole recording reads OCCUPANCY with BANDWIDTH at 2.005x its floor; its last 5 s read BANDWIDTH at 1.999x
    r = cli("replay", REC["llama8b_graph"], "--json")
    j = json.loads(r.stdout)
    assert j["verdict"] == "occupancy" and j["rolling_5s"]["verdict"] == "bandwidth"
    assert j["candidates"]["bandwidth"]["value"] == pytest.approx(2.005, abs=0.001)
    faster = j["ms_per_token"] * 0.99
    assert j["edge"].startswith(f"on the edge: a token 1% faster ({faster:.4g} ms) reads BANDWIDTH (it binds at ")
    ratio = float(re.search(r"binds at ([\d.]+)× floor", j["edge"]).group(1))
    assert ratio == pytest.approx(0.99 * j["candidates"]["bandwidth"]["value"], abs=0.001) and ratio < 2
    md = cli("report", REC["llama8b_graph"]).stdout
    assert f"OCCUPANCY is {j['edge']}." in md.replace("\\", "")
    # a verdict well inside its thresholds says nothing of an edge
    for name in ("eager", "graph"):
        assert json.loads(cli("replay", REC[name], "--json").stdout)["edge"] is None


def test_a_pending_headline_never_reads_binds_now_with_zero_windows_won():
    from decodemon.monitor.diagnosis import Inputs, diagnose
    from decodemon.monitor.rolling import Rolling, advance, headline

    d = diagnose(Inputs(ms_per_token=20.0, kernels_per_token=1600, kernel_sum_ms_per_token=3.0, ranks=1))
    assert d.ceiling == "launch"
    kept = advance(Rolling(), "bandwidth", "10:00:00 UTC", {})
    words = headline(d, kept)[1]
    assert "0 so far" not in words and "binds now" not in words
    assert words.startswith("binds on the span's figures; the history keeps BANDWIDTH: its latest window did not read "
                            "LAUNCH, and it changes once 2 windows in a row do")
    once = advance(kept, "launch", "10:00:01 UTC", {})
    assert "until LAUNCH wins 2 windows in a row (1 so far)" in headline(d, once)[1]


def test_a_batched_engines_step_figures_have_the_steps_names_and_a_token_loop_has_none():
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_hf_cb_4.dmon", "--json").stdout)
    assert j["clock_unit"] == "step" and j["tokens_per_step"] == 4
    assert j["ms_per_step"] == j["ms_per_token"] and j["steps_per_s"] == j["tokens_per_s"]
    assert j["kernels_per_step"] == j["kernels_per_token"]
    # every request's tokens a second: the steps' rate times their tokens, to the rounding of the two
    assert j["throughput_tokens_per_s"] == pytest.approx(j["steps_per_s"] * j["tokens_per_step"], rel=0.02)
    assert j["bytes_per_token"] == pytest.approx(j["bytes_per_step"] / j["tokens_per_step"])
    assert "ms_per_step, steps_per_s and kernels_per_step name them as the step's" in j["ms_per_token_note"]
    one = json.loads(cli("replay", REC["eager"], "--json").stdout)
    assert one["clock_unit"] == "token"
    assert one["ms_per_step"] is None and one["steps_per_s"] is None and one["kernels_per_step"] is None


def test_a_rebuilt_sweep_says_where_it_reads_otherwise_than_its_kept_file_and_a_curve_that_is_not_monotonic():
    from tests.conftest import DATA

    r = cli("sweep", "--replay", DATA / "h200_sweep_hf_generate", "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    kept = json.loads((DATA / "h200_sweep_hf_generate" / "sweep.json").read_text())
    by_depth = {p["depth"]: p for p in j["points"]}
    for p in kept["points"]:
        if p["tokens"] != by_depth[p["depth"]]["tokens"]:  # each difference is named, with both figures
            assert f"tokens at candidate {p['depth']:,} ({p['tokens']} → {by_depth[p['depth']]['tokens']})" \
                in j["rebuilt_note"]
    assert "over the 5 s before each recording's last frame" in j["rebuilt_note"]
    # 107.2 ms at 2,048 sits above both ends (64.96, 97.63): the conclusion says it reads the ends alone
    assert "but not monotonically: 107.2 at depth 2,048 is above both ends" in j["divergence"]
    assert "each depth band covers every mark the attach kept" in j["ms_per_token_note"]
    text = cli("sweep", "--replay", DATA / "h200_sweep_hf_generate").stdout
    assert "Rebuilt: the rebuilt points differ from the kept sweep.json's" in text
    assert "the recordings are the same, the readers are not" in text  # the data is not what moved


def test_a_monotonic_curve_reads_its_ends_with_no_caution():
    from decodemon.monitor.divergence import divergence

    pts = [{"command": "candidate", "depth": d, "ms_per_token": ms, "verdict": "launch", "us_per_kernel": us}
           for d, ms, us in ((64, 60.0, 30.0), (512, 70.0, 35.0), (2048, 85.0, 45.0), (8192, 100.0, 55.0))]
    words = divergence(pts)
    assert "monotonically" not in words and words.startswith("Median ms/token goes from 60 at depth 64 to 100")
    pts[2]["ms_per_token"] = 110.0  # past the deeper end by more than 5%
    assert "but not monotonically: 110 at depth 2,048 is above both ends" in divergence(pts)


def test_report_writes_its_diagnosis_and_grades_only_a_prediction_of_the_same_device(tmp_path):
    from decodemon.monitor import ledger
    from tests.conftest import BUNDLED

    sealed_on = BUNDLED / "h100_eager.dmon"
    r = cli("predict", sealed_on, "--change", "capture a graph", "--expect", "-80%", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the very recording the prediction sealed: the report is written, the prediction stays open
    r = cli("report", sealed_on, "-o", "D.md", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "D.md").read_text().startswith("# DIAGNOSIS")
    assert "the ledger is not graded" in r.stderr and "the prediction stays open" in r.stderr
    r = cli("report", sealed_on, "--json", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["verdict"]
    # the same loop on another device: a grade would measure the device too, so none is made
    r = cli("report", REC["eager"], "-o", "D2.md", cwd=tmp_path)
    assert r.returncode == 0 and (tmp_path / "D2.md").exists()
    assert "sealed on NVIDIA H100 80GB HBM3 and this was measured on NVIDIA H200" in r.stderr
    entries, _ = ledger.read(tmp_path / ledger.DEFAULT_PATH)
    assert [e["kind"] for e in entries] == ["prediction"]  # nothing graded
    # the graphed run on the device it was sealed on grades it
    r = cli("report", BUNDLED / "h100_graph.dmon", "-o", "D3.md", cwd=tmp_path)
    assert r.returncode == 0 and "graded the open prediction" in r.stderr
    assert [e["kind"] for e in ledger.read(tmp_path / ledger.DEFAULT_PATH)[0]] == ["prediction", "grade"]


def test_two_predictions_of_the_same_figures_in_one_second_are_two_entries(tmp_path):
    from decodemon.monitor import ledger

    args = ("predict", REC["eager"], "--change", "graph", "--expect", "-80%", "--ledger", tmp_path / "l.jsonl")
    assert cli(*args).returncode == 0 and cli(*args).returncode == 0
    entries, problems = ledger.read(tmp_path / "l.jsonl")
    assert not problems and len({ledger.pred_id(e) for e in entries}) == 2
    assert cli("grade", REC["graph"], "--ledger", tmp_path / "l.jsonl").returncode == 0
    assert len(ledger.open_predictions(ledger.read(tmp_path / "l.jsonl")[0])) == 1  # one graded, one still open


def test_a_figure_a_hair_past_a_threshold_never_reads_as_the_threshold_and_diagnose_says_its_edge():
    from decodemon.monitor.numbers import said

    assert said(1.9996) == "1.9996" and said(2.0) == "2" and said(2.004) == "2.004" and said(2.31) == "2.31"
    assert said(49.96) == "49.96" and said(7.777) == "7.78"  # only an edge is kept from
    args = ("--bytes-per-token", 16126599168, "--bandwidth-gbs", 4188)
    at = cli("diagnose", "--ms-per-token", 7.70, *args).stdout  # 1.9997x: binds
    past = cli("diagnose", "--ms-per-token", 7.71, *args).stdout  # 2.002x: does not
    assert "bandwidth  binding   1.9997 × floor" in at and "is 1.9997× the floor" in at
    assert "bandwidth  unknown   2.002 × floor" in past and "is 2.002× the floor" in past
    assert "BANDWIDTH is on the edge: a token 1% slower (7.777 ms) reads UNKNOWN, nothing binding" in at
    assert "on the edge" not in cli("diagnose", "--ms-per-token", 9.0, *args).stdout  # 2.34x: no edge near


def test_the_top_level_help_names_every_exit_status():
    text = " ".join(cli("--help").stdout.split())
    for words in ("Exit status: 0 ok", "2 bad input", "3 nothing was measured", "1 what no check foresaw",
                  "130 interrupted"):
        assert words in text


def test_a_last_past_the_sources_start_says_so_and_keeps_the_whole_summarys_shape():
    from tests.conftest import BUNDLED

    whole = json.loads(cli("replay", BUNDLED / "h100_eager.dmon", "--json").stdout)
    r = cli("replay", BUNDLED / "h100_eager.dmon", "--json", "--last", 100)
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["span"]["covers"] == "whole"
    assert j["span"]["last_asked"] == f"--last 100 s holds the whole source: the figures are its whole " \
                                      f"{whole['span']['seconds']:g} s"
    assert j["rolling_5s"] == whole["rolling_5s"] and j["ms_per_token"] == whole["ms_per_token"]
    assert whole["span"]["last_asked"] is None


@pytest.mark.parametrize("args", [["report", REC["eager"], "--window-period", 2, "--no-pm"],
                                  ["compare", REC["eager"], REC["graph"], "--json", "--no-trace"],
                                  ["predict", REC["eager"], "--change", "x", "--expect", "-5%", "--probe", "pm=0"]])
def test_a_probe_option_on_a_recording_is_refused_not_ignored(args, tmp_path):
    from tests.conftest import assert_one_line_error

    r = cli(*args, cwd=tmp_path)
    assert_one_line_error(r)
    assert "the probe of a live pid" in r.stderr and "made with the probe's settings of the time" in r.stderr
    assert r.stdout == "" and list(tmp_path.iterdir()) == []


def test_the_remedy_never_asks_whether_grids_bind_where_the_grids_are_measured_and_ruled_out():
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_compiled_llama8b_marks_4.dmon", "--json").stdout)
    assert j["verdict"] == "unknown" and j["candidates"]["occupancy"]["state"] == "ruled_out"
    share = j["candidates"]["occupancy"]["value"]
    assert "whether bytes or grids bind" not in j["remedy"] and "with small grids it is OCCUPANCY" not in j["falsify"]
    assert f"the grids are measured: {share:.0f}% of kernel time in small grids, under the 25%" in j["remedy"]
    assert "measure bytes per token (PM's DRAM counters, or the model's facts) to say whether bytes bind" in j["remedy"]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_a_clock_of_bursts_leaves_the_observers_stall_out_and_weighs_each_step_once(k):
    """The compiled 8B loop that enqueues ~200 steps ahead: its clock is whole bursts of marks. A one-step sliver
    of a burst the observer overlapped is its stall (~99 ms in record 4, which read +4.8% with it), and a one-step
    burst weighs one step of the p90, not one of three."""
    from tests.conftest import DATA

    own = json.loads((DATA / "h200_known_bytes.json").read_text())["compiled_llama8b_enqueue_synced"][
        "own_ms_per_token"][f"h200_compiled_llama8b_enqueue_synced_{k}.dmon"]
    j = json.loads(cli("replay", DATA / f"h200_compiled_llama8b_enqueue_synced_{k}.dmon", "--json").stdout)
    assert j["token_clock"] == "mark_bursts"
    assert j["ms_per_token"] == pytest.approx(own, rel=0.015)  # the loop's own clock, within 1.5%
    assert j["ms_per_token_p99"] <= 1.05 * j["ms_per_token"]  # no observer's stall in the tail (record 4: was 97 ms)
    assert j["clock_steps"] >= 380  # whole bursts of ~200 left in: the clock rests on two or more


def test_weighted_interval_percentiles_count_each_step_once():
    import numpy as np

    from decodemon.monitor.analysis.tokens import interval_stats

    from decodemon.monitor.analysis.tokens import token_stats

    ts = interval_stats(np.array([98.87, 199 * 5.65, 200 * 5.59]), np.array([1.0, 199.0, 200.0]))
    assert ts.tokens == 400 and ts.ms_per_token == pytest.approx((98.87 + 199 * 5.65 + 200 * 5.59) / 400)
    assert ts.ms_per_token_p90 == pytest.approx(5.65) and ts.ms_per_token_p99 == pytest.approx(5.65)
    # a tail of slow steps that is the tail: 20 of 200 steps at 9 ms reads in the p99
    ts = interval_stats(np.array([180 * 5.0, 20 * 9.0]), np.array([180.0, 20.0]))
    assert ts.ms_per_token_p90 == pytest.approx(5.0, abs=0.5) and ts.ms_per_token_p99 == pytest.approx(9.0)
    # one step an interval: the same rule as a marked clock's (token_stats) over the same marks
    gaps = np.arange(1.0, 11.0)
    marks = np.concatenate([[0], np.cumsum(gaps * 1e6)]).astype(np.int64)
    one, each = interval_stats(gaps, np.ones(10)), token_stats(marks)
    assert one.ms_per_token_p90 == pytest.approx(each.ms_per_token_p90)
    assert one.ms_per_token_p99 == pytest.approx(each.ms_per_token_p99)


def test_a_sweep_says_where_the_dram_counters_read_otherwise_than_the_models_bytes_it_tabulates():
    from tests.conftest import DATA

    j = json.loads(cli("sweep", "--replay", DATA / "h200_sweep_demo_eager", "--json").stdout)
    p64 = next(p for p in j["points"] if p["depth"] == 64)
    model = p64["bytes_per_token_model"]
    assert p64["bytes_source"] and p64["bytes_per_token_measured"] > 1.2 * model
    text = cli("sweep", "--replay", DATA / "h200_sweep_demo_eager").stdout
    pct = 100 * (p64["bytes_per_token_measured"] / model - 1)
    assert (f"candidate at 64: {p64['bytes_per_token_measured'] / 1e6:.4g} MB/token measured, {pct:+.0f}% against "
            f"the model's {model / 1e6:.4g}") in text
    # the table names whose bytes each column holds, the counters' beside the model's
    assert "| model MB/token | DRAM MB/token |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| 64 |"))
    assert f"| {model / 1e6:.4g} | {p64['bytes_per_token_measured'] / 1e6:.4g} |" in row
    # one name, one figure: the point's bytes_per_token and × floor are the ones replay --json --last 5 gives its
    # recording (the verdict's), the model's floor under its own name
    r = json.loads(cli("replay", DATA / "h200_sweep_demo_eager" / p64["recording"], "--json", "--last", 5).stdout)
    assert p64["bytes_per_token"] == pytest.approx(r["bytes_per_token"], rel=1e-6)
    assert p64["bandwidth_x_floor"] == pytest.approx(r["candidates"]["bandwidth"]["value"], rel=1e-6)
    assert p64["bandwidth_x_model_floor"] == pytest.approx(
        p64["ms_per_token"] / (model / p64["bandwidth_gbs"] / 1e6), rel=1e-6)
    # where the counters read less than the weights alone, which every token reads, their figure is called short
    j = json.loads(cli("sweep", "--replay", DATA / "h200_sweep_hf_generate", "--json").stdout)
    p64 = next(p for p in j["points"] if p["depth"] == 64)
    assert p64["bytes_per_token_measured"] < p64["weight_bytes"] < p64["bytes_per_token_model"]
    text = cli("sweep", "--replay", DATA / "h200_sweep_hf_generate").stdout
    assert (f"less than the weights alone ({p64['weight_bytes'] / 1e6:.4g} MB), which every token reads: the "
            "counters' figure falls short") in text
    assert text.count("less than the weights alone") == 1  # the other depths read more


def test_a_prediction_sealed_before_the_device_was_sealed_is_still_refused_its_own_figures():
    from decodemon.monitor import ledger
    from decodemon.monitor.api import replay

    summary = replay(REC["eager"]).as_json()
    pred = ledger.prediction(summary, "l", "graph", "-50%")
    older = {**pred, "state": {k: v for k, v in pred["state"].items() if k != "device"}}  # sealed before the key
    for p in (pred, older):
        with pytest.raises(ledger.NotGraded, match="these are the figures the prediction sealed"):
            ledger.grade(p, summary)
    assert ledger.grade(older, replay(REC["graph"]).as_json())["grade"]  # another run grades


def test_a_probe_option_on_a_sweeps_replay_or_comparing_two_recordings_in_the_app_is_refused(tmp_path):
    from tests.conftest import DATA, assert_one_line_error

    r = cli("sweep", "--replay", DATA / "h200_sweep_demo_eager", "--no-pm", "--window-period", 1)
    assert_one_line_error(r)
    assert "a replay reads the recordings it kept" in r.stderr
    r = cli("compare", REC["eager"], REC["graph"], "--no-trace")  # the app: refused before it wants a terminal
    assert_one_line_error(r)
    assert "the probe of a live pid" in r.stderr


def test_no_span_of_the_recording_a_prediction_was_sealed_from_grades_it(tmp_path):
    from decodemon.monitor import ledger
    from tests.conftest import BUNDLED

    sealed_on = BUNDLED / "h100_eager.dmon"
    assert cli("predict", sealed_on, "--change", "graph", "--expect", "-80%", cwd=tmp_path).returncode == 0
    for args in (["--last", 5], ["--last", 3]):  # other figures, the same recording: no change was made
        r = cli("report", sealed_on, *args, "-o", "D.md", cwd=tmp_path)
        assert r.returncode == 0 and "this is the recording the prediction was sealed from" in r.stderr
    r = cli("grade", sealed_on, cwd=tmp_path)
    assert r.returncode == 3 and "this is the recording the prediction was sealed from" in r.stderr
    assert [e["kind"] for e in ledger.read(tmp_path / ledger.DEFAULT_PATH)[0]] == ["prediction"]


def test_scaling_says_when_the_devices_differ_or_a_verdict_is_on_its_edge_and_exits_as_its_help_says():
    from tests.conftest import BUNDLED, DATA

    r = cli("scaling", BUNDLED / "h100_eager.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json")
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["serial_fraction"] is None and not j["amdahl_applies"]  # measured: s solved 3.3
    assert "0 when both runs are timed" in " ".join(cli("scaling", "--help").stdout.split())
    assert any("the speedup mixes the device with the rank count" in c for c in j["cautions"])
    r = cli("scaling", REC["llama8b_graph"], DATA / "h200_tp2_graph_llama8b_rank0.dmon")
    assert r.returncode == 0 and "serial fraction s = 0.72" in r.stdout
    assert "verdict is on the edge" in r.stdout and "(STALE) turns on it" in r.stdout
    r = cli("scaling", DATA / "h200_cuda_loop_8gib.dmon", DATA / "h200_tp2_eager_rank0.dmon")
    assert r.returncode == 3 and "no token timing" in r.stderr


def test_compare_knows_a_copy_of_one_recording_and_a_clock_that_counts_the_observers_steps(tmp_path):
    import shutil

    from tests.conftest import BUNDLED, DATA

    copy = tmp_path / "e2.dmon"
    shutil.copy(BUNDLED / "h100_eager.dmon", copy)
    j = json.loads(cli("compare", BUNDLED / "h100_eager.dmon", copy, "--json").stdout)
    assert "every ratio is 1 by construction" in j["differ"]["source"]
    j = json.loads(cli("compare", REC["eager"], DATA / "h200_unmarked_demo_1.dmon", "--json").stdout)
    assert "B's clock counts every step, those the observer's own steps slowed too (step_starts)" in j["differ"]["clock"]


def test_a_last_span_whose_clock_is_an_earlier_windows_steps_says_so():
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_compiled_llama8b_nomarks.dmon", "--json", "--last", 1).stdout)
    assert j["token_clock"] == "graph replays" and j["kernels_from"]["windows_in_span"] == 0
    before = j["kernels_from"]["s_before_span"]
    assert j["span"]["clock_reaches_back"] == (
        f"the rate's {j['span']['clock_steps']} clock steps are the GPU's steps in the latest traced window, which "
        f"came {before:.3g} s before the span: no window fell in it")
    assert "save where clock_reaches_back says they lie before it" in j["span"]["counts"]


def test_a_second_open_prediction_of_a_loop_is_said_and_a_group_names_whose_figures_lead(tmp_path):
    from tests.conftest import DATA

    args = ("predict", REC["eager"], "--change", "graph", "--expect", "-80%", "--ledger", tmp_path / "l.jsonl")
    first = cli(*args)
    assert first.returncode == 0 and "older open prediction" not in first.stderr
    second = cli(*args)
    assert second.returncode == 0 and "has 1 older open prediction (" in second.stderr
    assert "the next grade takes this newest one; the older stay open" in second.stderr
    r = cli("replay", DATA / "h200_tp2_eager_rank1.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json")
    j = json.loads(r.stdout)
    assert j["group"]["top_level"].startswith(f"the top level is {DATA / 'h200_tp2_eager_rank1.dmon'}'s alone")


def test_the_agents_cpu_is_said_where_no_window_was_billed_and_never_read_into_the_decode_threads_share(tmp_path):
    """A recording whose span billed no traced window still says what the agent thread took (its CPU, the decode
    thread's waits), in --json's observer_cost and the report; where a window was billed, its share is the decode
    thread's, and the agent's CPU is said beside it, not in it."""
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_compiled_llama8b_enqueue_synced_1.dmon", "--json").stdout)
    o = j["observer_cost"]
    assert j["probe"]["agent_cpu_ms_per_s"] == "988.2" and o["agent_cpu_ms_per_s"] == 988.2
    assert o["probe_ms_per_window"] is None and o["share_of_loop_pct"] is None and o["decode_waits_per_s"] == 34.0
    r = cli("report", DATA / "h200_compiled_llama8b_enqueue_synced_1.dmon", "-o", tmp_path / "D.md")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "D.md").read_text()
    assert "## What watching cost" in text and "988.2 ms of CPU" in text and "98.8% of a core" in text
    j = json.loads(cli("replay", DATA / "h200_unmarked_manual_1.dmon", "--json").stdout)
    o = j["observer_cost"]
    assert o["share_of_loop_pct"] == pytest.approx(1.856) and o["agent_cpu_ms_per_s"] == 101.5
    assert "not agent_cpu_ms_per_s" in o["share_of_loop_covers"]
    r = cli("report", DATA / "h200_unmarked_manual_1.dmon")
    assert "1.9% of the decode thread's time" in r.stdout and "10.2% of a core beside the loop (not billed" in r.stdout


def test_the_kernel_time_the_verdict_took_is_a_figure_of_its_own_beside_the_latest_windows():
    """Where a span holds several windows, kernel_busy_ms_per_token is the latest's and LAUNCH takes their median:
    --json gives that median as a number, with the windows it is the median of."""
    from pathlib import Path

    h100_graph = Path(__file__).parents[1] / "monitor" / "data" / "h100_graph.dmon"
    j = json.loads(cli("replay", h100_graph, "--json").stdout)
    k = j["kernels_from"]
    assert j["windows"] == 2 and j["kernel_busy_ms_per_token"] == 3.7965
    assert k["verdict_kernel_ms_per_token"] == 3.802 and k["verdict_kernel_ms_from"] == "the median of the span's 2 traced windows"
    assert "3.802 ms" in j["us_per_kernel_note"] and "3.802 ms/token" in j["kernel_share_of_step_note"]
    one = json.loads(cli("replay", h100_graph, "--json", "--last", "2").stdout)["kernels_from"]
    assert one["verdict_kernel_ms_from"] in ("the span's one traced window", "the latest traced window, before the span")


def test_a_recording_corrupt_mid_file_is_refused_with_the_frame_that_does_not_decode(tmp_path):
    """Whole frames whose bytes are not what was written (a disk's bit-rot, a bad copy): one line naming the frame
    and when it came, never only the decoder's own words; nothing is half-written."""
    import gzip

    from decodemon.probes.wire import _REC, MAGIC

    raw = gzip.decompress(REC["eager"].read_bytes())
    assert raw.startswith(MAGIC)
    at, frames = len(MAGIC), []
    while at < len(raw):
        n, rx = _REC.unpack_from(raw, at)
        frames.append((rx, raw[at + _REC.size:at + _REC.size + n]))
        at += _REC.size + n
    k = len(frames) // 2
    frames[k] = (frames[k][0], b"\x81\xa3tag\xc1" + frames[k][1][5:])  # a map whose value is msgpack's unused byte
    bad = tmp_path / "bad.dmon"
    bad.write_bytes(gzip.compress(MAGIC + b"".join(_REC.pack(len(p), rx) + p for rx, p in frames)))
    r = cli("replay", bad, "--json")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1, r.stderr
    since = frames[k][0] / 1e9  # its receive time: ns since the recording began
    assert f"is corrupt at frame {k + 1}, received {since:.3f} s into the recording (" in r.stderr, r.stderr
    assert f"the {k} frames before it read whole" in r.stderr
    assert "Traceback" not in r.stderr and os.listdir(tmp_path) == ["bad.dmon"]


def test_bandwidths_prediction_halves_the_floor_not_the_token():
    """Halving the bytes halves the time they set (the floor); the token's time above the floor stays. The win and
    the falsifier say so with the floor the same output prints, so a right BANDWIDTH verdict is not proved wrong."""
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_compiled_llama8b_replays.dmon", "--json").stdout)
    assert j["ceiling"] == "bandwidth"
    ms, floor = j["ms_per_token"], j["bandwidth_floor_ms"]
    after = ms - floor / 2
    assert f"→ ~{after:.3g} ms/token (the {floor:.3g} ms floor halves" in j["predicted_win"]
    assert f"fall by about half its {floor:.3g} ms bandwidth floor, {ms:.3g} → ~{after:.3g}" in j["falsify"]
    assert f"~{ms / 2:.3g}" not in j["predicted_win"] + j["falsify"]


def test_sm_active_past_gpu_busy_is_said_as_two_counters_apart():
    """SM active cannot pass GPU busy over the same cycles: where the two PM counters read so, the OCCUPANCY
    candidate says they were sampled apart rather than leave a share over 100% unexplained."""
    from tests.conftest import DATA

    c = json.loads(cli("replay", DATA / "h100_llama_cpp_server8b.dmon", "--json").stdout)["candidates"]["occupancy"]
    assert c["value"] > 100 and c["state"] == "ruled_out"
    assert f"SM active past GPU busy by {c['value'] - 100:.1f}% of it: two counters sampled apart" in c["detail"]
    c = json.loads(cli("replay", REC["graph"], "--json").stdout)["candidates"]["occupancy"]
    assert "sampled apart" not in c["detail"]


def test_a_grade_across_a_batch_or_a_kv_cache_change_says_so_and_times_steps_as_steps(tmp_path):
    """llama-server at 4 requests a step, graded by its run at 1 with a q8_0 KV cache: the grade says ms/step (the
    marks are steps), and that the batch and the KV cache moved as well as the change."""
    from tests.conftest import DATA

    ledger = tmp_path / "l.jsonl"
    r = cli("predict", DATA / "h100_llama_cpp_server1b_np4.dmon", "--ledger", ledger, "--label", "y",
            "--change", "graphs", "--expect", "+10%")
    assert r.returncode == 0 and "2.412 ms/step)" in r.stderr, r.stderr
    r = cli("grade", DATA / "h100_llama_cpp_server1b_kvq8.dmon", "--ledger", ledger, "--label", "y")
    assert r.returncode == 0, r.stderr
    said = r.stdout + r.stderr
    assert "ms/step 2.412 → 3.21 (+33.1%" in said and "ms/token" not in said
    assert "sealed at 4 tokens a step, measured at 1: a step's time is shared by its tokens" in said
    assert "the KV cache was f16, now q8_0" in said
    entries = [json.loads(ln) for ln in ledger.read_text().splitlines()]
    assert len(entries[-1]["cautions"]) == 2


def test_compare_names_two_instruments_for_bytes_and_floors_priced_at_two_bandwidths():
    """A ratio of measured bytes over the model's says it holds two instruments, as the GPU busy ratio does; two
    floors priced at two bandwidths (a spec peak, a measured copy) are named in `differ`."""
    from tests.conftest import BUNDLED, DATA

    r = cli("compare", BUNDLED / "h100_eager.dmon", REC["eager"], "--json")
    j = json.loads(r.stdout)
    assert j["a"]["bytes_per_token_measured"] and not j["b"]["bytes_per_token_measured"]
    assert ("A's are the DRAM counters' (measured), B's the model's weights + KV: two instruments"
            in j["b_over_a_of"]["bytes_per_token"])
    r = cli("compare", DATA / "h100_llama_cpp_server1b_kvq8.dmon", DATA / "h100_llama_cpp_server1b_np4.dmon", "--json")
    j = json.loads(r.stdout)
    bw = j["differ"]["bandwidth"]
    assert f"A's floor is priced at {j['a']['bandwidth_gbs']:.4g} GB/s ({j['a']['bandwidth_source']})" in bw
    assert "the floor's bandwidth differs: A's floor is priced at" in r.stderr
    assert "bandwidth" not in j["b_over_a_of"]["ms_per_token"]  # no ratio divides by it


def test_the_floor_names_whose_bandwidth_it_divides_by():
    """One card's recordings price floors at a spec peak or a measured copy: the BANDWIDTH detail names which, and
    the report says the model's bytes are at the latest depth reported."""
    from tests.conftest import DATA

    for path, word, said in ((DATA / "h100_llama_cpp_server1b_kvq8.dmon", "NVML peak", "spec: NVML peak, not measured"),
                             (DATA / "h100_llama_cpp_server1b_np4.dmon", "measured copy (decodemon",
                              "decodemon's measured copy")):
        j = json.loads(cli("replay", path, "--json").stdout)
        assert j["bandwidth_source"].startswith(word)
        assert f"÷ {j['bandwidth_gbs']:.4g} GB/s, {said}; a " in j["candidates"]["bandwidth"]["detail"], path.name
    md = cli("report", DATA / "h100_llama_cpp_server1b_kvq8.dmon").stdout
    assert "KV at depth 60112, the latest reported)" in md


def test_where_pm_over_the_traced_tokens_agrees_with_the_kernels_the_spans_average_is_what_stands_apart():
    """PM's GPU busy over the span against the traced kernels' share: where PM itself, over the traced tokens,
    reads what the kernels do, the words blame neither instrument but the span's average."""
    from decodemon.monitor.analysis.agreement import busy_disagreement
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_tp2_eager_rank0.dmon", "--json").stdout)
    near = j["pm_vs_window"]["pm_gpu_busy_pct"]
    assert f"over the traced tokens PM itself read {near:.1f}%, as the kernels do" in j["busy_sources_disagree"]
    assert "stretched by CUPTI" not in j["busy_sources_disagree"]
    assert "stretched by CUPTI" in busy_disagreement(63.0, 8.0)  # without that check, the reasons as before


def test_the_reports_rate_says_the_steps_the_observer_slowed_were_left_out(tmp_path):
    """The eager recording's rate rests on 329 clock steps of its 334: the 5 the observer's steps slowed are left
    out of the steps and their time, and the report says so beside the count (329 over the span's 7.98 s would
    read 41.2/s, not the 42.2 shown)."""
    from tests.conftest import BUNDLED

    rec = BUNDLED / "h100_eager.dmon"
    j = json.loads(cli("replay", rec, "--json").stdout)
    n = j["observer_cost"]["slowed_tokens"]
    assert n and j["span"]["tokens"] - 1 == j["clock_steps"] + n
    md = tmp_path / "r.md"
    assert cli("report", rec, "-o", md).returncode == 0
    assert f"over {j['clock_steps']} clock steps, {n} the observer's steps slowed, left out" in md.read_text()


def test_gaps_read_in_another_window_than_the_kernels_say_so():
    """The unmarked demo's gaps and traced token are of the latest window that traced its launch calls (5.8 s
    before the end), its kernels of the latest window: the note says which sum holds; where one window gives
    both (the bundled eager recording) the gaps and the kernels add up to the traced token."""
    from tests.conftest import BUNDLED, DATA

    j = json.loads(cli("replay", DATA / "h200_unmarked_demo_1.dmon", "--json").stdout)
    assert j["launch_calls_traced_s_ago"] and "not the kernels' window" in j["gap_note"]
    e = json.loads(cli("replay", BUNDLED / "h100_eager.dmon", "--json").stdout)
    assert "not the kernels' window" not in e["gap_note"]
    assert sum(e["gap_ms_per_token"].values()) + e["kernel_busy_ms_per_token"] == pytest.approx(e["traced_token_ms"],
                                                                                                abs=2e-3)
