"""Bad input: one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from tests.conftest import REC, assert_one_line_error, cli


def test_pid_that_does_not_exist():
    r = cli("attach", 4_000_000, "--json")
    assert_one_line_error(r)
    assert "no process with pid 4000000" in r.stderr


def test_pid_without_agent_says_how_to_start_one():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        r = cli("attach", p.pid, "--json")
        assert_one_line_error(r, rc=3)  # its main thread sleeps in C: nothing measured, nothing given wrong
        assert "no decodemon agent" in r.stderr and "decodemon run --" in r.stderr
        assert "import decodemon.probes.autostart" in r.stderr
        assert p.poll() is None  # no harm done
    finally:
        p.kill()


@pytest.mark.parametrize("verb", ["replay", "report"])
def test_corrupt_truncated_and_foreign_recordings(tmp_path, verb):
    raw = gzip.decompress(REC["graph"].read_bytes())
    cases = {
        "header_only_cut.dmon": gzip.compress(raw[:300]),
        "corrupt.dmon": REC["graph"].read_bytes()[:200] + b"\x00" * 200,
        "foreign.dmon": b"PK\x03\x04 definitely a zip file",
        "empty.dmon": b"",
        "flipped.dmon": gzip.compress(bytes(b ^ 0xFF if i % 9973 == 5000 % 9973 and i >= 5000 else b
                                            for i, b in enumerate(raw))),  # bytes flipped inside frames
    }
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        args = [verb, p] + (["--json"] if verb == "replay" else [])
        r = cli(*args)
        if name == "flipped.dmon" and r.returncode == 1:  # frames that decode but hold nonsense
            assert_one_line_error(r, rc=1)
            assert "a damaged input?" in r.stderr
            continue
        assert_one_line_error(r)
        assert str(p) in r.stderr


@pytest.mark.parametrize("cut", ["inside the gzip stream", "inside the file"])
def test_a_recording_cut_short_plays_its_whole_frames_and_says_so(tmp_path, cut):
    data = REC["graph"].read_bytes()
    p = tmp_path / "cut.dmon"
    p.write_bytes(gzip.compress(gzip.decompress(data)[: 2 * len(data)]) if cut == "inside the gzip stream"
                  else data[: len(data) // 3])
    whole = json.loads(cli("replay", REC["graph"], "--json").stdout)
    r = cli("replay", p, "--json")
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert "cut short after" in got["ended"]
    assert r.stderr.count("\n") == 1 and "is cut short after" in r.stderr and "of what it holds" in r.stderr
    assert 100 < got["tokens"] < whole["tokens"]
    assert got["ceiling"] == whole["ceiling"]
    r = cli("report", p, "-o", tmp_path / "D.md")
    assert r.returncode == 0, r.stderr
    assert "The source ended: the recording is cut short" in (tmp_path / "D.md").read_text()


def test_missing_recording_and_directory(tmp_path):
    assert_one_line_error(cli("replay", tmp_path / "nope.dmon", "--json"))
    assert_one_line_error(cli("replay", tmp_path, "--json"))


@pytest.mark.parametrize("args", [
    ["attach", "0", "--json"], ["attach", "-5", "--json"], ["attach", "99999999999", "--json"],
    ["attach", "123", "--json", "--seconds", "0"], ["attach", "123", "--json", "--seconds", "-1"],
    ["attach", "123", "--json", "--seconds", "1e12"], ["attach", "123", "--json", "--probe", "window_tokens=0"],
    ["attach", "123", "--json", "--probe", "window_budget=0"], ["record", "1", "-o", "x", "--probe", "window_budget=many"],
    ["attach", "123", "--json", "--probe", "api_every=-1"], ["attach", "123", "--json", "--probe", "api_every=2.5"],
    ["record", "123"], ["replay"], ["demo", "--speed", "0"], ["bogus-verb"], ["run"], ["--bogus-option"],
    ["attach", "123", "--refresh", "0"], ["replay", "x.dmon", "--refresh", "nan"], ["demo", "--refresh", "61"],
    ["attach", "123", "--json", "--probe", "agent_tick_s=0"], ["attach", "123", "--json", "--probe", "agent_tick_s=inf"],
    ["report", "123", "--probe", "pm_pump_s=-1"], ["compare", "1", "2", "--probe", "pm_pump_s=fast"],
    ["attach", "123", "--json", "--window-period", "0"], ["attach", "--pid", "0", "--json"],
    ["record", "123", "-o", "x.dmon", "--duration", "-1"],
])
def test_bad_arguments(args):
    assert_one_line_error(cli(*args))


def test_run_of_missing_program():
    r = cli("run", "--", "/nonexistent/program")
    assert_one_line_error(r)


@pytest.mark.parametrize("args", [["predict", "monitor/data/h100_eager.dmon", "--change", "x", "--expect", "-60%",
                                   "--tolerance", "nan"],
                                  ["sweep", "--start-timeout", "-1", "python x.py {depth}"],
                                  ["attach", "1", "--probe", "time_window_s=0"]])
def test_numbers_out_of_range_are_one_line(args):
    assert_one_line_error(cli(*args))


def test_an_output_that_is_the_input_is_refused_and_the_input_kept(tmp_path):
    rec = tmp_path / "r.dmon"
    rec.write_bytes(REC["eager"].read_bytes())
    for verb in ("export", "report"):
        r = cli(verb, rec, "-o", rec)
        assert_one_line_error(r)
        assert "it is the input" in r.stderr
        assert rec.read_bytes() == REC["eager"].read_bytes()


def test_an_output_symlink_is_written_through_and_stays_a_link(tmp_path):
    real, link = tmp_path / "real.md", tmp_path / "link.md"
    real.write_text("old")
    link.symlink_to(real)
    r = cli("report", REC["eager"], "-o", link)
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and real.read_text().startswith("#")


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="making a device node needs root")
def test_an_output_device_is_refused_and_left_as_it_is(tmp_path):
    import os
    import stat

    dev = tmp_path / "null"
    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # a copy of /dev/null
    for args in (["report", REC["eager"], "-o", dev], ["export", REC["eager"], "-o", dev],
                 ["record", "1", "-o", dev, "--seconds", "1"]):
        r = cli(*args)
        assert_one_line_error(r)
        assert "not a regular file" in r.stderr and stat.S_ISCHR(dev.stat().st_mode)


def test_replay_of_two_runs_that_are_not_ranks_of_one_group_is_refused():
    r = cli("replay", "--json", REC["eager"], REC["graph"])
    assert_one_line_error(r)
    assert "not ranks of one tensor-parallel group" in r.stderr and "decodemon compare" in r.stderr
    assert_one_line_error(cli("replay", "--json", REC["eager"], REC["eager"]))


def test_an_empty_output_path_and_a_sweep_folder_without_its_file_are_one_line_each(tmp_path):
    from tests.conftest import DATA

    r = cli("report", REC["eager"], "-o", "")
    assert_one_line_error(r)
    assert "empty path" in r.stderr
    for args in (["sweep", "--replay", DATA / "h200_sweep_demo_eager", "-o", ""], ["run", "--pid-file", "", "--", "true"]):
        r = cli(*args)
        assert_one_line_error(r)
        assert "empty" in r.stderr
    r = cli("sweep", "--replay", tmp_path / "none")
    assert_one_line_error(r)
    assert "no such directory" in r.stderr
    r = cli("sweep", "--replay", tmp_path)
    assert_one_line_error(r)
    assert "holds no sweep.json" in r.stderr


def test_dev_stdout_is_written_as_the_shell_opened_it(tmp_path):
    """`-o /dev/stdout` into a file opened with `>>` appends (never renames over the file), and into a pipe."""
    log = tmp_path / "log.txt"
    log.write_text("old line\n")
    with open(log, "a") as f:
        r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "report", str(REC["eager"]), "-o",
                            "/dev/stdout"], stdout=f, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = log.read_text()
    assert text.startswith("old line\n# DIAGNOSIS") and log.is_file()
    r = cli("export", REC["eager"], "-o", "/dev/stdout")
    assert r.returncode == 0 and r.stdout.startswith('{"schemaVersion"')


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="making a device node needs root")
def test_a_block_device_or_a_symlink_loop_is_refused(tmp_path):
    import os
    import stat

    blk = tmp_path / "blk"
    os.mknod(blk, 0o600 | stat.S_IFBLK, os.makedev(7, 200))  # a loop device node (nothing behind it)
    r = cli("report", REC["eager"], "-o", blk)
    assert_one_line_error(r)
    assert stat.S_ISBLK(blk.stat().st_mode)
    a, b = tmp_path / "a", tmp_path / "b"
    a.symlink_to(b)
    b.symlink_to(a)
    assert_one_line_error(cli("report", REC["eager"], "-o", a))
    assert a.is_symlink() and b.is_symlink()


def test_report_never_writes_over_the_default_ledger_it_grades(tmp_path):
    from decodemon.monitor import ledger

    led = tmp_path / ledger.DEFAULT_PATH
    led.write_text("")
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "report", str(REC["graph"]), "-o",
                        ledger.DEFAULT_PATH], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert_one_line_error(r)
    assert "it is the input" in r.stderr and led.read_text() == ""


def test_replay_of_ranks_from_two_different_runs_is_refused():
    from tests.conftest import DATA

    r = cli("replay", "--json", DATA / "h200_tp2_eager_rank0.dmon", DATA / "h200_tp2_graph_llama8b_rank1.dmon")
    assert_one_line_error(r)
    assert "not ranks of one tensor-parallel group" in r.stderr
    assert cli("replay", "--json", DATA / "h200_tp2_eager_rank0.dmon", DATA / "h200_tp2_eager_rank1.dmon").returncode == 0


def test_a_loop_with_no_marks_and_no_gpu_is_told_what_would_give_it_a_clock(tmp_path):
    from tests.conftest import run_script

    script = tmp_path / "quiet.py"
    script.write_text("import sys, time\nprint('decoding', file=sys.stderr, flush=True)\ntime.sleep(60)\n")
    proc, pid = run_script(script)
    try:
        r = cli("attach", pid, "--json", "--seconds", "1")
        assert r.returncode == 3
        assert "mark_token() or --token-range NAME gives it" in r.stderr  # young: it may also still be loading
        assert "Traceback" not in r.stderr and proc.poll() is None  # told, and the target unharmed
    finally:
        proc.kill()
        proc.wait(30)


def test_attach_of_a_missing_pid_says_so_before_asking_for_a_terminal():
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "attach", "4000000"], capture_output=True,
                       text=True, stdin=subprocess.DEVNULL, timeout=60)  # no terminal either
    assert_one_line_error(r)
    assert "no process with pid 4000000" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["--replay", "--tokens", "5"], "--tokens sets what the live engines decode, and --replay plays the bundled"),
    (["--replay", "--tokens", "0", "--json"], "--tokens sets what the live engines decode"),
    (["--replay", "--json", "--seconds", "3"], "--seconds with --json is how long the live engines are watched"),
    (["--json", "--speed", "2"], "--speed plays the recordings in the app, and --json draws no app"),
    (["--replay", "--json", "--refresh", "1"], "--refresh is the app's screen refresh, and --json draws no app"),
])
def test_demo_refuses_an_option_it_would_ignore_in_one_line(args, words, tmp_path):
    r = cli("demo", *args, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert_one_line_error(r)
    assert words in r.stderr and r.stdout == ""


def test_demo_with_no_gpu_refuses_tokens_and_with_a_gpu_refuses_speed(monkeypatch, capsys):
    from decodemon.monitor import cli as cli_pkg, demo

    monkeypatch.setattr(demo, "gpu_available", lambda: False)
    assert cli_pkg.main(["demo", "--tokens", "5", "--json"]) == 2
    assert "with no GPU here the bundled recordings play: drop --tokens" in capsys.readouterr().err
    monkeypatch.setattr(demo, "gpu_available", lambda: True)
    monkeypatch.setattr(demo, "demo_engines", lambda *_: pytest.fail("the engines started"))
    assert cli_pkg.main(["demo", "--speed", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--speed is the recordings' playback speed" in err[0] and "--replay" in err[0]


def test_scaling_refuses_one_recording_given_twice(tmp_path):
    rec = tmp_path / "cpu.dmon"
    rec.write_bytes(REC["eager"].read_bytes())
    (tmp_path / "link.dmon").symlink_to(rec)
    (tmp_path / "sub").mkdir()
    for one, many in (("cpu.dmon", "cpu.dmon"), ("cpu.dmon", "./sub/../cpu.dmon"), ("cpu.dmon", "link.dmon"),
                      ("cpu.dmon", rec)):
        r = cli("scaling", one, many, "--n", 2, cwd=tmp_path)
        assert_one_line_error(r)
        assert "are the same recording" in r.stderr and r.stdout == ""
    r = cli("scaling", "nope.dmon", "nope.dmon", "--n", 2, cwd=tmp_path)
    assert_one_line_error(r)
    assert "no such recording" in r.stderr


def test_scaling_refuses_two_models():
    from tests.conftest import DATA

    r = cli("scaling", DATA / "h200_tp1_graph_rank0.dmon", DATA / "h200_tp2_graph_llama8b_rank0.dmon")
    assert_one_line_error(r)
    assert "is qwen3-0.6b (28 layers" in r.stderr and "(32 layers, hidden 4096" in r.stderr and r.stdout == ""
    r = cli("scaling", DATA / "h200_tp1_graph_rank0.dmon", DATA / "h200_tp2_graph_rank0.dmon")
    assert r.returncode == 0 and "serial fraction" in r.stdout, r.stderr


@pytest.mark.parametrize("args, last", [
    (["report", REC["eager"]], True),
    (["report", REC["eager"], "--json"], True),
    (["compare", REC["eager"], REC["graph"], "--json"], True),
    (["export", REC["eager"], "-o", "trace.json"], False),
    (["predict", REC["eager"], "--change", "x", "--expect", "-10%", "--ledger", "l.jsonl"], False),
    (["grade", REC["eager"], "--ledger", "l.jsonl"], False),
])
def test_seconds_on_a_recording_is_refused_not_ignored(args, last, tmp_path):
    # a recording is read whole: `--seconds 3` would be silently dropped, and the figures cover all 21 s
    r = cli(*args, "--seconds", 3, cwd=tmp_path)
    assert_one_line_error(r)
    assert "--seconds is how long a live pid is watched" in r.stderr and r.stdout == ""
    assert ("--last S" in r.stderr) == last  # named where the verb has it
    assert list(tmp_path.iterdir()) == []  # no trace, no ledger written


def test_seconds_is_kept_where_one_source_is_a_pid():
    import argparse

    from decodemon.monitor.cli._common import UsageError, live_seconds

    a = argparse.Namespace(seconds=3.0, last=None)
    assert live_seconds(a, "compare", ["123", str(REC["eager"])], 10.0) == 3.0
    assert live_seconds(argparse.Namespace(seconds=None), "report", [str(REC["eager"])], None) is None
    with pytest.raises(UsageError, match="are recordings, each read whole; --last S"):
        live_seconds(a, "compare", [str(REC["eager"]), str(REC["graph"])], 10.0)


def test_seconds_on_a_sweep_replay_is_refused_not_ignored():
    from tests.conftest import DATA

    r = cli("sweep", "--replay", DATA / "h200_sweep_demo_eager", "--seconds", 3)
    assert_one_line_error(r)
    assert "--seconds is how long each run of a sweep is attached" in r.stderr and r.stdout == ""
