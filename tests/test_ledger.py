"""The write-it-down ledger: predictions sealed with the measured state, graded after the change, a file that
is only appended to and never loses a line."""

from __future__ import annotations

import json
import threading

import pytest

from tests.conftest import REC
from decodemon.monitor import ledger
from decodemon.monitor.cli import grade as grade_cli, predict as predict_cli
from decodemon.monitor import cli as cli_pkg
from decodemon.monitor.render import summary_json
from decodemon.monitor.sources.collect import collect


def main(argv) -> int:
    """`decodemon ARGV` in this process."""
    return cli_pkg.main([str(a) for a in argv])


@pytest.fixture(scope="module")
def eager():
    return summary_json(collect(REC["eager"]).snapshot())


@pytest.fixture(scope="module")
def graph():
    return summary_json(collect(REC["graph"]).snapshot())


def test_capture_a_graph_round_trip_names_the_new_ceiling_and_the_measured_change(tmp_path, capsys):
    path = tmp_path / "decodemon.ledger.jsonl"
    assert main(["predict", REC["eager"], "--change", "capture a graph", "--expect", "-60%", "--ceiling", "launch",
                 "--ledger", path]) == 0
    assert main(["grade", REC["graph"], "--ledger", path]) == 0
    out = capsys.readouterr().out
    # 20.16 → 3.922 ms/token over the whole recordings is -80.5%: more than -60% ± 10, so the number was wrong, and
    # the grade says so (predict and grade seal what replay and report summarise: the whole span)
    assert "wrong" in out and "-80.5%" in out and "LAUNCH → OCCUPANCY" in out
    entries, problems = ledger.read(path)
    assert problems == [] and [e["kind"] for e in entries] == ["prediction", "grade"]
    g = entries[1]
    assert g["new_ceiling"] == "occupancy" and g["prediction"] == ledger.pred_id(entries[0])
    assert g["measured_pct"] == pytest.approx(-80.5, abs=0.1)
    assert main(["grade", REC["graph"], "--ledger", path]) == 3  # graded once: nothing open is left


def test_prediction_seals_the_state_measured_then(eager):
    p = ledger.prediction(eager, "loop.py", "capture a graph", "-60%", "launch", now=0)
    st = p["state"]
    assert (st["verdict"], st["ms_per_token"], st["kernels_per_token"]) == ("launch", 20.4039, 1863.0)
    assert st["bytes_per_token"] == eager["bytes_per_token"]
    assert st["candidates"]["launch"] == pytest.approx(80.9792)  # the idle's share of the step, sealed as what it is
    assert st["candidate_quantities"]["launch"] == "idle_pct_of_step"
    assert p["hash"] == ledger.content_hash(p) and p["at"] == "1970-01-01T00:00:00Z"
    assert ledger.prediction(eager, "loop.py", "x", "10.2ms", now=0)["expect_pct"] == pytest.approx(-50.01, abs=0.01)


def test_grades_right_reason_other_reason_and_wrong(eager, graph):
    right = ledger.grade(ledger.prediction(eager, "l", "graph", "-80%", "launch"), graph)
    assert right["grade"] == ledger.RIGHT  # the number held and LAUNCH stopped binding
    other = ledger.grade(ledger.prediction(eager, "l", "graph", "-80%", "launch", then="bandwidth"), graph)
    assert other["grade"] == ledger.OTHER and "predicted BANDWIDTH" in other["text"]
    # the predicted ceiling still binds, with its own figure unmoved: the number held for another reason
    same = {**eager, "ms_per_token": eager["ms_per_token"] * 0.8}
    assert ledger.grade(ledger.prediction(eager, "l", "fewer syncs", "-20%", "launch"), same)["grade"] == ledger.OTHER
    wrong = ledger.grade(ledger.prediction(eager, "l", "graph", "-30%", "launch"), graph)
    assert wrong["grade"] == ledger.WRONG and wrong["new_ceiling"] == "occupancy"


def test_corrupt_and_foreign_lines_are_named_once_each_and_never_lost(tmp_path, eager, graph, capsys):
    path = tmp_path / "l.jsonl"
    good = ledger.prediction(eager, "engine_adapter/demo.py", "capture a graph", "-80%", "launch")
    tampered = {**ledger.prediction(eager, "other.py", "x", "-5%"), "expect_pct": -99}
    path.write_text(json.dumps(good) + "\nnot json at all\n" + json.dumps({"kind": "prediction", "hello": 1})
                    + "\n" + json.dumps(tampered) + "\n{\"torn\": ")
    before = path.read_bytes()
    entries, problems = ledger.read(path)
    assert [e["hash"] for e in entries] == [good["hash"]]
    assert [p.split(": ", 1)[0] for p in problems] == [f"{path}:{n}" for n in (2, 3, 4, 5)]
    assert main(["grade", REC["graph"], "--ledger", path]) == 0
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 4 and all("kept as it is" in ln for ln in err)
    after = path.read_bytes()
    assert after.startswith(before)  # appended to, never rewritten
    entries, problems = ledger.read(path)
    assert len(problems) == 4 and entries[-1]["kind"] == "grade" and entries[-1]["grade"] == ledger.RIGHT


def test_appends_from_many_writers_stay_whole_lines(tmp_path, eager):
    path = tmp_path / "l.jsonl"
    entry = ledger.prediction(eager, "loop.py", "x" * 2000, "-10%")

    def writer():
        for _ in range(25):
            ledger.append(path, entry)

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    entries, problems = ledger.read(path)
    assert problems == [] and len(entries) == 200


def test_the_next_attach_or_report_of_the_same_loop_grades_it(tmp_path, eager, graph):
    path = tmp_path / "l.jsonl"
    ledger.append(path, ledger.prediction(eager, "engine_adapter/demo.py", "capture a graph", "-80%", "launch"))
    assert ledger.grade_open(path, graph, "some/other.py") == (None, [])
    g, problems = ledger.grade_open(path, graph, "engine_adapter/demo.py")
    assert g["grade"] == ledger.RIGHT and problems == []
    assert ledger.grade_open(path, graph, "engine_adapter/demo.py") == (None, [])


def test_a_diagnosis_older_than_a_significant_change_is_stale_serial_fraction_included(eager, graph):
    st = ledger.state_of(eager)
    assert ledger.significant_change(st, {**st, "ms_per_token": st["ms_per_token"] * 1.05}) is None
    assert "ms/token moved +20%" in ledger.significant_change(st, {**st, "ms_per_token": st["ms_per_token"] * 1.2})
    assert "LAUNCH → OCCUPANCY" in ledger.significant_change(st, ledger.state_of(graph))
    old = ledger.prediction({**eager, "serial_fraction": 0.33}, "loop.py", "shard attention", "-20%")
    new = ledger.prediction(graph, "loop.py", "widen the grids", "-10%")
    stale = ledger.stale_reasons([old, new])
    assert list(stale) == [0] and "serial fraction 0.33 must be re-derived" in stale[0]


def test_the_ledger_as_a_markdown_section(eager, graph):
    p = ledger.prediction(eager, "engine_adapter/demo.py", "capture a graph", "-60%", "launch", now=0)
    md = ledger.ledger_markdown([p, ledger.grade(p, graph, now=60)])
    assert md.startswith("## Predictions and grades")
    row = next(ln for ln in md.splitlines() if "capture a graph" in ln)
    assert "LAUNCH (20.4 ms)" in row and "-60% ± 10" in row and "-80.8%" in row
    assert "| wrong (the predicted direction, 20.8 points further than predicted) | OCCUPANCY |" in row
    assert "stale" not in md  # the prediction is graded: its grade holds it against what came after
    assert "No prediction is written down yet" in ledger.ledger_markdown([])
    # a ceiling the user named over the one measured is said as theirs, beside the measured one
    named = ledger.prediction(eager, "engine_adapter/demo.py", "quantize", "-10%", "bandwidth", now=0)
    row = next(ln for ln in ledger.ledger_markdown([named]).splitlines() if "quantize" in ln)
    assert "BANDWIDTH named by you (measured: LAUNCH) (20.4 ms)" in row, row


def test_a_ceiling_unknown_before_and_after_grades_the_reason_unmeasured_not_other(eager):
    unknown = {**eager, "verdict": "unknown", "ceiling": "unknown"}
    faster = {**unknown, "ms_per_token": eager["ms_per_token"] * 0.8}
    g = ledger.grade(ledger.prediction(unknown, "l", "fewer syncs", "-20%"), faster)
    assert g["grade"] == ledger.UNMEASURED and "UNKNOWN → UNKNOWN" in g["text"]
    # a named ceiling that stops binding with nothing binding after, its own figure unmoved: no reason measured
    nothing_binds = {**eager, "ms_per_token": eager["ms_per_token"] * 0.8, "verdict": "unknown"}
    assert ledger.grade(ledger.prediction(eager, "l", "x", "-20%", "launch"), nothing_binds)["grade"] == \
        ledger.UNMEASURED


@pytest.mark.parametrize("expect, words", [
    ("-50%", "the predicted direction, 30.8 points further than predicted"),
    ("-95%", "the predicted direction, 14.2 points less far than predicted"),
    ("+20%", "the other direction from the prediction, 100.8 points off"),
    ("0%", "predicted no change; it moved -80.8%"),
])
def test_a_missed_number_says_how_it_missed(eager, graph, expect, words):
    g = ledger.grade(ledger.prediction(eager, "l", "capture a graph", expect, "launch"), graph)
    assert g["grade"] == ledger.WRONG and g["how_wrong"] == words and f"wrong ({words})" in g["text"]


def test_a_prediction_sealed_later_from_an_older_recording_makes_none_stale(eager, graph):
    """Stale means a change measured after the diagnosis: a prediction sealed afterwards from a recording whose span
    ended before it is no such change, and says no verdict moved."""
    newer = ledger.prediction({**graph, "span_end_unix_s": 2_000.0}, "loop.py", "widen the grids", "-10%", now=10)
    older = ledger.prediction({**eager, "span_end_unix_s": 1_000.0}, "loop.py", "capture a graph", "-80%", now=20)
    assert ledger.stale_reasons([newer, older]) == {}
    # the same two measured the other way round: the verdict did move after the first
    first = ledger.prediction({**eager, "span_end_unix_s": 1_000.0}, "loop.py", "capture a graph", "-80%", now=10)
    then = ledger.prediction({**graph, "span_end_unix_s": 2_000.0}, "loop.py", "widen the grids", "-10%", now=20)
    stale = ledger.stale_reasons([first, then])
    assert list(stale) == [0] and "the verdict moved LAUNCH → OCCUPANCY" in stale[0]
    assert "measured_unix_s" in newer["state"] and newer["state"]["measured_unix_s"] == 2_000.0


def test_a_graded_prediction_is_not_stale_but_an_open_one_is(eager, graph):
    graded = ledger.prediction(eager, "loop.py", "capture a graph", "-80%", "launch", now=0)
    g = ledger.grade(graded, graph, now=60)
    open_one = ledger.prediction(eager, "loop.py", "fewer syncs", "-10%", "launch", now=1)
    later = ledger.prediction(graph, "loop.py", "widen the grids", "-10%", now=120)
    stale = ledger.stale_reasons([graded, open_one, g, later])
    assert list(stale) == [1] and "LAUNCH → OCCUPANCY" in stale[1]


def test_report_finds_a_prediction_sealed_with_a_label_and_names_it_when_not_given(tmp_path, capsys):
    path, out = tmp_path / "l.jsonl", tmp_path / "DIAGNOSIS.md"
    assert main(["predict", REC["eager"], "--label", "my loop", "--change", "capture a graph", "--expect", "-80%",
                 "--ledger", path]) == 0
    assert main(["report", REC["graph"], "--ledger", path, "-o", out]) == 0
    assert "open ones are for my loop (--label NAME picks one)" in capsys.readouterr().err
    assert "the ledger holds predictions for my loop (`--label NAME` picks one)" in out.read_text()  # not "none yet"
    assert [e["kind"] for e in ledger.read(path)[0]] == ["prediction"]
    assert main(["report", REC["graph"], "--ledger", path, "--label", "my loop", "-o", out]) == 0
    assert "graded the open prediction" in capsys.readouterr().err
    entries = ledger.read(path)[0]
    assert [e["kind"] for e in entries] == ["prediction", "grade"] and entries[1]["source"] == "my loop"
    assert "capture a graph" in out.read_text()


@pytest.mark.parametrize("args, words", [
    (["--change", "x", "--expect", "sixty"], "--expect takes"),
    (["--change", "x", "--expect", "-100%"], "--expect takes"),
    (["--change", "x", "--expect", "-150%"], "--expect -150%: a time cannot fall by 100% or more"),
    (["--change", "x", "--expect", "-100"], "a time cannot fall by 100% or more"),
    (["--change", "x", "--expect", "0ms"], "--expect 0ms: a token cannot take 0 ms"),
    (["--change", "x", "--expect", "3.9"], "--expect 3.9: say 3.9ms for the ms/token expected after the change, or"),
    (["--change", "x", "--expect", "nan"], "--expect takes"),
    (["--change", " ", "--expect", "-5%"], "--change says what you will change"),
    (["--change", "x", "--expect", "-5%", "--ceiling", "vibes"], "--ceiling is one of"),
])
def test_bad_predictions_fail_in_one_line(tmp_path, capsys, args, words):
    assert main(["predict", REC["eager"], "--ledger", tmp_path / "l.jsonl", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0] and not (tmp_path / "l.jsonl").exists()


def test_a_ledger_that_is_a_directory_or_empty_fails_in_one_line(tmp_path, capsys):
    assert main(["predict", REC["eager"], "--change", "x", "--expect", "-5%", "--ledger", tmp_path]) == 2
    assert main(["grade", REC["graph"], "--ledger", tmp_path / "none.jsonl"]) == 2
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["grade", REC["graph"], "--ledger", tmp_path / "empty.jsonl"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and "is a directory" in err[0] and "no ledger at" in err[1] and "no open prediction" in err[2]


def test_the_next_report_of_the_same_loop_grades_it_and_diagnosis_md_includes_the_ledger(tmp_path):
    """predict on the eager recording, then `report` the graphed one (the same demo loop after the change):
    the report grades the open prediction and DIAGNOSIS.md carries the ledger."""
    path = tmp_path / "decodemon.ledger.jsonl"
    assert main(["predict", REC["eager"], "--change", "capture a graph", "--expect", "-60%",
                 "--ledger", path]) == 0
    out = tmp_path / "DIAGNOSIS.md"
    assert main(["report", REC["graph"], "--ledger", path, "-o", out]) == 0
    md = out.read_text()
    assert "## Predictions and grades" in md and "capture a graph" in md and "OCCUPANCY" in md
    entries, problems = ledger.read(path)
    assert not problems and [e["kind"] for e in entries] == ["prediction", "grade"]
    assert entries[1]["grade"] == ledger.WRONG  # -80.8% measured against -60% +- 10


def test_the_next_attach_of_the_same_loop_grades_its_open_prediction(tmp_path):
    """A ledger beside the project (./decodemon.ledger.jsonl): `predict PID`, then a plain `attach PID --json`
    of the same loop appends the grade."""
    from tests.conftest import Engine, cli

    e = Engine()
    try:
        r = cli("predict", e.pid, "--change", "nothing", "--expect", "0%", "--seconds", 2, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        r = cli("attach", e.pid, "--json", "--seconds", 2, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "graded the open prediction" in r.stderr
    finally:
        e.stop()
    entries, problems = ledger.read(tmp_path / ledger.DEFAULT_PATH)
    assert not problems and [x["kind"] for x in entries] == ["prediction", "grade"]


def test_grade_json_prints_one_json_document_on_stdout(tmp_path, capsys):
    path = tmp_path / "decodemon.ledger.jsonl"
    assert main(["predict", REC["eager"], "--change", "capture a graph", "--expect", "-60%", "--ledger", path]) == 0
    capsys.readouterr()
    assert main(["grade", REC["graph"], "--ledger", path, "--json"]) == 0
    got = capsys.readouterr()
    assert json.loads(got.out)["kind"] == "grade" and "LAUNCH → OCCUPANCY" in got.err


def test_the_h200_capture_a_graph_ledger_reads_whole_and_its_grade_names_the_new_ceiling():
    """The ledger of the round trip on an H200: predicted LAUNCH with "capture a graph -> -60%" on the eager
    demo engine, graded on the graphed one. Every line's hash holds; the grade names OCCUPANCY and the change."""
    from pathlib import Path

    entries, problems = ledger.read(Path(__file__).parent / "data" / "h200_ledger_capture_a_graph.jsonl")
    assert problems == [] and [e["kind"] for e in entries] == ["prediction", "grade"]
    pred, grade = entries
    assert (pred["ceiling"], pred["state"]["verdict"], pred["expect_pct"]) == ("launch", "launch", -60.0)
    assert grade["prediction"] == ledger.pred_id(pred) and grade["new_ceiling"] == "occupancy"
    assert grade["grade"] == ledger.WRONG and grade["measured_pct"] == pytest.approx(-88.9, abs=0.1)
    assert "LAUNCH → OCCUPANCY" in grade["text"]


def test_a_file_that_is_not_a_ledger_is_refused_in_one_line_and_left_as_it_is(tmp_path):
    from tests.conftest import REC, assert_one_line_error, cli

    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n\nsome text\nmore text\n")
    before = notes.read_bytes()
    for args in (["grade", REC["graph"]], ["report", REC["graph"]],
                 ["predict", REC["eager"], "--change", "x", "--expect=-50%"]):
        r = cli(*args, "--ledger", notes)
        assert_one_line_error(r)
        assert "is not a decodemon ledger" in r.stderr
    assert notes.read_bytes() == before


def test_an_unwritable_ledger_is_one_line_before_the_attach(tmp_path):
    """predict and grade check the ledger before they measure: a pid with --seconds 30 answers at once, and a
    ledger that did not exist is not left behind."""
    import time

    from tests.conftest import Engine, cli

    e = Engine()
    try:
        # predict: a ledger it cannot create; grade: one that is there but is no file a ledger can be
        for verb, path, words in ((["predict", e.pid, "--change", "x", "--expect=-10%"],
                                   "/proc/decodemon-ledger.jsonl", "cannot write the ledger"),
                                  (["grade", e.pid], "/dev/null", "is not a regular file")):
            t0 = time.monotonic()
            r = cli(*verb, "--seconds", 30, "--ledger", path)
            assert time.monotonic() - t0 < 10 and r.returncode == 2
            assert words in r.stderr, r.stderr
            assert len(r.stderr.strip().splitlines()) == 1
        r = cli("predict", e.pid, "--change", "x", "--expect=-10%", "--seconds", 30,
                "--ledger", tmp_path / "no-such-dir" / "l.jsonl")
        assert r.returncode != 0 and "cannot write the ledger" in r.stderr
        assert not (tmp_path / "no-such-dir").exists()
    finally:
        e.stop()


def test_grade_names_the_label_it_looked_for_and_the_labels_open(tmp_path, capsys):
    path = tmp_path / "l.jsonl"
    path.write_text("")  # a ledger with no prediction in it yet
    assert main(["grade", REC["graph"], "--label", "nosuch", "--ledger", path]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"decodemon grade: no open prediction for nosuch in {path}, nor for any other loop "
                   "(`decodemon predict` writes one)"]
    assert main(["predict", REC["eager"], "--label", "my loop", "--change", "x", "--expect", "-80%",
                 "--ledger", path]) == 0
    capsys.readouterr()
    assert main(["grade", REC["graph"], "--label", "nosuch", "--ledger", path]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"decodemon grade: no open prediction for nosuch in {path}; open ones are for my loop "
                   "(--label NAME picks one)"]
    assert main(["grade", REC["graph"], "--ledger", path]) == 3  # the recording's own label: not open either
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"in {path}; open ones are for my loop" in err[0]
    assert [e["kind"] for e in ledger.read(path)[0]] == ["prediction"]  # nothing graded


def test_a_grade_from_one_token_a_step_to_a_batch_says_so_and_an_older_state_takes_the_others_unit(eager):
    """A loop of one sequence graded by its batched run: the batch caution is said (a token's mark is one token a
    step); a state sealed before the clock's unit was keeps the other side's unit, not a unit change."""
    before = {**ledger.state_of(eager), "clock_unit": "token", "tokens_per_step": None}
    after = {**before, "clock_unit": "step", "tokens_per_step": 8.0, "ms_per_token": before["ms_per_token"] * 0.9}
    assert any("sealed at 1 token a step, measured at 8" in c for c in ledger._cautions(before, after))
    older = {k: v for k, v in before.items() if k not in ("clock_unit", "tokens_per_step")}
    assert ledger.unit_words(older, after) == ("ms/step", "ms/step")
    assert ledger.unit_words(before, after) == ("ms/token", "ms/step")
