"""A summary says what it covers, and covers what was asked: the whole recording, the seconds attached, or the
last S seconds (--last); the rolling 5 s beside it. Verbs that compare two runs refuse or say where the runs are
not alike, rather than guessing."""

from __future__ import annotations

import json
import time

import pytest

from decodemon.monitor import api
from decodemon.monitor.snapshot_builder import SPAN_NS
from decodemon.monitor.span import ROLLING_S
from tests.conftest import DATA, REC, Engine, assert_one_line_error, cli


def replay_json(path, *more):
    r = cli("replay", path, "--json", *more, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_rolling_span_is_the_sessions():
    assert ROLLING_S == SPAN_NS / 1e9


def test_replay_json_covers_the_whole_recording_and_says_so_first():
    whole = replay_json(REC["eager"])
    assert next(iter(whole)) == "span"
    span = whole["span"]
    # h200_eager.dmon: 21.16 s, 912 tokens, all of them counted (the last 5 s alone hold 217)
    assert span["covers"] == "whole" and span["seconds"] == pytest.approx(21.159, abs=1e-3)
    assert span["from_s"] == 0 and span["to_s"] == pytest.approx(span["seconds"])
    assert span["tokens"] == whole["tokens"] == 912 and span["clock_steps"] == whole["clock_steps"] == 911
    assert span["to_unix_s"] - span["from_unix_s"] == pytest.approx(span["seconds"], abs=2e-3)
    # the last 5 s beside it, the same figures --last 5 gives
    last = replay_json(REC["eager"], "--last", 5)
    assert last["span"]["covers"] == "last" and last["span"]["seconds"] == 5.0 and last["rolling_5s"] is None
    assert last["span"]["tokens"] == 217 and last["clock_steps"] == 216
    roll = whole["rolling_5s"]
    for k in ("ms_per_token", "ms_per_token_p90", "tokens_per_s", "clock_steps", "gpu_busy_pct", "verdict"):
        assert roll[k] == last[k], k
    assert roll["seconds"] == 5.0 and roll["ms_per_token"] == pytest.approx(20.4039, abs=1e-3)
    assert whole["ms_per_token"] == pytest.approx(20.1569, abs=1e-3)  # the median of all 911 steps


def test_the_api_covers_the_whole_recording_unless_told_the_last_seconds():
    whole, last = api.replay(REC["graph"]), api.replay(REC["graph"], last_s=5)
    assert whole.snapshot.span_whole and whole.snapshot.span_s == pytest.approx(15.165, abs=1e-3)
    assert whole.snapshot.tokens.tokens == 3559 and last.snapshot.tokens.tokens < 3559
    assert last.ms_per_token == pytest.approx(3.9108, abs=1e-3)  # the pinned rolling figure


def test_the_report_says_first_what_it_covers(tmp_path):
    r = cli("report", REC["graph"], timeout=120)
    assert r.returncode == 0, r.stderr
    head = r.stdout.splitlines()[:6]
    assert head[4].startswith("Covers the whole recording: 15.165 s, 0–15.165 s into it, 3560 tokens counted, "
                              "the rate over 3559 clock steps; the last 5 s alone read"), head
    r = cli("report", REC["graph"], "--last", 5, timeout=120)
    assert r.stdout.splitlines()[4].startswith("Covers the 5 s up to 15.165 s into the recording (10.165–15.165 s)")


@pytest.mark.parametrize("verb", ["replay", "attach", "compare", "record", "report"])
def test_the_help_says_what_a_summary_covers(verb):
    r = cli(verb, "--help")
    assert r.returncode == 0 and "--last S" in r.stdout
    assert "whole" in r.stdout.replace("\n", " ")


@pytest.mark.parametrize("args", [["replay", REC["eager"], "--last", 5],  # the app has no summary to pick for
                                  ["replay", REC["eager"], "--json", "--last", 0],
                                  ["replay", REC["eager"], "--json", "--last", "nan"],
                                  ["replay", REC["eager"], "--json", "--at", 999],
                                  ["report", REC["eager"], "--last", "-1"]])
def test_a_bad_span_is_one_line(args):
    assert_one_line_error(cli(*args))


def test_attach_json_summarises_the_seconds_asked_for():
    e = Engine()
    try:
        r = cli("attach", e.pid, "--json", "--seconds", 7, timeout=120)
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert next(iter(j)) == "span" and j["span"]["covers"] == "whole"
        assert 6.0 < j["span"]["seconds"] < 7.3, j["span"]  # the 7 s asked, not the last 5
        assert j["span"]["tokens"] == j["tokens"] and j["rolling_5s"]["seconds"] == 5.0
        assert j["rolling_5s"]["clock_steps"] < j["clock_steps"]
    finally:
        e.stop()


def test_an_attach_to_a_loop_with_no_token_covers_the_seconds_asked_not_the_agents_wait_after():
    """A loop that marks nothing: the agent waits up to a second for a boundary after the detach; what arrives then
    tells of the seconds before it, so the summary covers the 3 s asked."""
    import subprocess
    import sys

    idle = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.001)"])
    try:
        time.sleep(0.5)
        r = cli("attach", idle.pid, "--json", "--seconds", 3, timeout=60)
        assert r.returncode == 3 and "before any tokens were measured" in r.stderr, r.stderr
        span = json.loads(r.stdout)["span"]
        assert 2.9 < span["seconds"] < 3.3, span
    finally:
        idle.kill()
        idle.wait()


def test_scaling_refuses_an_n_its_recording_contradicts():
    r = cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--n", 8, timeout=120)
    assert_one_line_error(r)
    assert "--n 8 contradicts" in r.stderr and "tp_degree 2" in r.stderr
    r = cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--n", 2, "--json",
            timeout=120)
    assert r.returncode == 0 and json.loads(r.stdout)["n"] == 2


def test_scaling_refuses_an_n_where_the_second_run_traced_no_collective():
    # both TP=1 by their facts; the second's windows hold no collective, so no --n makes it a multi-rank run
    r = cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp1_graph_rank0.dmon", "--n", 2, timeout=120)
    assert_one_line_error(r)
    assert "no collective in them" in r.stderr and "is it the 2-rank run?" in r.stderr


def test_scaling_matches_one_model_under_two_names_by_its_facts():
    # transformers' Qwen3ForCausalLM at TP=1 and the demo engine's qwen3-0.6b at TP=2: 28 layers, hidden 1024
    r = cli("scaling", DATA / "h200_hf_generate_eager.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json",
            timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["n"] == 2
    # one name, another model: the narrowed step's weights are no TP=1 run of the TP=2 model's
    r = cli("scaling", DATA / "h200_narrow12_graph.dmon", DATA / "h200_tp2_eager_rank0.dmon", timeout=120)
    assert_one_line_error(r)
    assert "weights" in r.stderr
    r = cli("scaling", DATA / "h200_tp1_graph_llama8b_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon", timeout=120)
    assert_one_line_error(r)
    assert "layers 32 against 28" in r.stderr


def test_compare_says_when_the_model_differs_and_never_prints_none(tmp_path):
    r = cli("compare", REC["eager"], DATA / "h200_llama8b_graph.dmon", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert "layers 28 against 32" in d["differ"]["model"] and "device" not in d["differ"]
    assert "the model differs between A and B" in d["b_over_a_of"]["ms_per_token"]
    assert "decodemon compare: the model differs" in r.stderr  # in words too
    assert "None" not in json.dumps(d["b_over_a_of"])
    same = json.loads(cli("compare", REC["eager"], REC["graph"], "--json", timeout=120).stdout)
    # one model on one device: only the busy figures' two instruments are named
    assert set(same["differ"] or {}) <= {"gpu_busy"} and same["a"]["span"]["covers"] == "whole"
    assert (same["a"]["gpu_busy_source"] == same["b"]["gpu_busy_source"]
            or "two instruments" in same["differ"]["gpu_busy"])


def test_compare_names_a_missing_instrument_rather_than_none():
    from decodemon.monitor.cli.compare import compare_json
    from decodemon.monitor.sources.collect import collect_recording
    from decodemon.monitor.span import summary_snapshot
    import dataclasses

    a = summary_snapshot(collect_recording(REC["eager"]))
    b = summary_snapshot(collect_recording(REC["graph"]))
    blind = dataclasses.replace(a, gpu_busy_pct=None, device="cpu", sm_count=0)
    d = compare_json(blind, b)
    assert "A from no instrument" in d["b_over_a_of"]["gpu_busy_pct"] and "None" not in str(d["b_over_a_of"])
    assert d["differ"]["device"].startswith("A ran on cpu (0 SMs), B on NVIDIA H200 (132 SMs)")


def test_a_last_span_with_no_token_is_refused_and_one_past_the_recording_is_the_whole():
    """The last 1 s of a graphed loop's recording (its marks shipped before it) held no token: exit 3 with why,
    never the whole recording's figures under a "last 1 s" label; a span shorter than the half second the marks
    ship in is refused; --last 100 covers the whole recording and says so."""
    from tests.conftest import cli

    r = cli("replay", DATA / "h200_known_reduce8.6.dmon", "--json", "--last", 1)
    assert r.returncode == 3 and "no token in the last 1 s" in r.stderr and "Traceback" not in r.stderr
    r = cli("replay", DATA / "h200_eager.dmon", "--json", "--last", 0.1)
    assert r.returncode == 2 and r.stderr.strip() == ("decodemon replay: --last must be in [0.5, 86400], got 0.1 "
                                                      "(see `decodemon replay --help`)")
    r = cli("replay", DATA / "h200_eager.dmon", "--json", "--last", 100)
    assert r.returncode == 0 and json.loads(r.stdout)["span"]["covers"] == "whole"


def test_compare_says_when_one_side_times_tokens_and_the_other_steps():
    from tests.conftest import cli

    r = cli("compare", DATA / "h200_eager.dmon", DATA / "h200_hf_cb_4.dmon", "--json")
    assert r.returncode == 0, r.stderr
    assert "A's marks are tokens, B's are steps" in json.loads(r.stdout)["differ"]["clock"]
    assert "the clock differs" in r.stderr


def test_compare_says_when_a_and_b_are_one_recording(tmp_path):
    from tests.conftest import cli

    rec = tmp_path / "eager.dmon"
    rec.write_bytes((DATA / "h200_eager.dmon").read_bytes())
    (tmp_path / "sub").mkdir()
    for b in ("eager.dmon", "./sub/../eager.dmon"):
        r = cli("compare", "eager.dmon", b, "--json", cwd=tmp_path, timeout=120)
        assert r.returncode == 0, r.stderr  # said, not refused: the figures are still each side's
        d = json.loads(r.stdout)
        assert "A and B are one recording (eager.dmon): every ratio is 1" in d["differ"]["source"]
        assert "A and B are one source" in d["b_over_a_of"]["ms_per_token"]
        assert "decodemon compare: A and B are one recording" in r.stderr


def test_compare_says_when_the_tp_degree_differs_and_bytes_are_per_rank():
    from tests.conftest import DATA, cli

    r = cli("compare", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["differ"]["tp"].startswith("A ran at TP 1, B at TP 2") and "bytes/token are per rank" in d["differ"]["tp"]
    assert "model" not in d["differ"]  # one model (qwen3-0.6b) at two degrees
    assert "the TP degree differs between A and B" in d["b_over_a_of"]["bytes_per_token"]
    assert "decodemon compare: the TP degree differs: A ran at TP 1, B at TP 2" in r.stderr


def test_the_compare_screen_says_what_its_ratios_hold_besides_a_change_of_code():
    import asyncio

    asyncio.run(_screen_differ())


async def _screen_differ():
    from decodemon.monitor.app import DecodemonApp, RatioBar
    from decodemon.monitor.player import RecordingPlayer
    from tests.conftest import DATA

    for names, says in ((("tp1_eager_rank0", "tp2_eager_rank0"), "⚠ A ran at TP 1, B at TP 2"),
                        (("tp1_eager_rank0", "tp1_eager_rank0"), "⚠ A and B are one recording")):
        players = [RecordingPlayer(str(DATA / f"h200_{n}.dmon"), n) for n in names]
        app = DecodemonApp(players, start_at_s=3.0, paused=True)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            assert says in str(app.query_one(RatioBar).render())


def test_a_recording_cut_short_is_covered_up_to_its_cut_not_whole(tmp_path):
    """A recording whose writer was killed plays the frames before the cut: its summary says it covers the recording
    up to the cut (the first line of the report too), never "whole"."""
    cut = tmp_path / "cut.dmon"
    cut.write_bytes(REC["eager"].read_bytes()[:5000])
    r = cli("replay", cut, "--json")
    span = json.loads(r.stdout)["span"]
    assert r.returncode == 0 and span["covers"] == "up to the cut" and "cut short after" in span["cut_short"]
    assert span["seconds"] < 2  # of an 8 s recording
    md = tmp_path / "cut.md"
    assert cli("report", cut, "-o", md).returncode == 0
    head = md.read_text().splitlines()[4]
    assert head.startswith("Covers the recording up to its cut: ") and "(the recording is cut short after" in head
    assert cli("report", cut, "--last", 0.5, "-o", md).returncode == 0  # a last span of it says the cut too
    assert "(the recording is cut short after" in md.read_text().splitlines()[4]
    whole = json.loads(cli("replay", REC["eager"], "--json").stdout)["span"]
    assert whole["covers"] == "whole" and whole["cut_short"] is None


def test_record_json_and_a_replay_of_its_file_put_the_span_at_the_same_unix_times(tmp_path):
    """The recording's header holds the live session's time origin, so `replay --json` of the file `record --json`
    wrote gives the span the same unix times, not ones moved by the moment the file was first written."""
    e = Engine()
    try:
        out = tmp_path / "cpu.dmon"
        r = cli("record", e.pid, "-o", out, "--seconds", 4, "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        live = json.loads(r.stdout)["span"]
    finally:
        e.stop()
    again = replay_json(out)["span"]
    assert again["seconds"] == live["seconds"]
    assert again["from_unix_s"] == pytest.approx(live["from_unix_s"], abs=0.0015)
    assert again["to_unix_s"] == pytest.approx(live["to_unix_s"], abs=0.0015)
