"""The verbs' surface: the options a user sets, py-spy's spellings, `--probe` for the rest, short help,
`--json` wherever a result is printed, and errors that point at the verb's own help."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from decodemon.probes import wire
from tests.conftest import REC, assert_one_line_error, cli

VERBS = ["run", "attach", "record", "replay", "report", "diagnose", "compare", "scaling", "allreduce", "demo"]
TP = os.path.join(os.path.dirname(__file__), "data")


def settings(*argv):
    from decodemon.monitor.cli import _attach_settings, build_parser

    return _attach_settings(build_parser().parse_args(list(argv)))


def help_of(*verb):
    env = dict(os.environ, COLUMNS="100")
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", *verb, "--help"], capture_output=True,
                       text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("verb", [None, *VERBS])
def test_every_help_fits_in_forty_lines_and_tells_no_history(verb):
    text = help_of(*([verb] if verb else []))
    assert len(text.splitlines()) <= 40, text
    for told in (r"\bsession\b", r"\bruns? \d", r"until the \w+th", r"§", r"scripts/", r"seeds?\b"):
        assert not re.search(told, text, re.I), (told, text)


@pytest.mark.parametrize("verb", ["attach", "record", "report", "compare"])
def test_the_expert_knobs_are_not_on_the_verbs(verb):
    text = help_of(verb)
    assert "--probe" in text and "--no-trace" in text and "--no-pm" in text
    for knob in ("--window-budget", "--prepare-lead", "--api-every", "--agent-tick", "--pm-pump", "--release-gil",
                 "--pm-interval-us", "--window-min-tokens", "--first-window"):
        assert knob not in text, knob


def test_probe_sets_any_attach_field():
    s = settings("attach", "1", "--probe", "hold_gil=false", "--probe", "agent_tick_s=0.05",
                 "--probe", "window_budget=7", "--probe", "first_window_s=2.5", "--probe", "api_every=0")
    assert (s.hold_gil, s.agent_tick_s, s.window_budget, s.first_window_s, s.api_every) == (False, 0.05, 7, 2.5, 0)
    assert wire.decode_control(wire.encode(s)) == s
    assert settings("attach", "1") == wire.Attach()
    assert settings("record", "1", "-o", "x.dmon", "--no-trace", "--no-pm", "--window-period", "2") == \
        wire.Attach(trace=False, pm=False, window_period_s=2.0)
    assert settings("attach", "1", "--probe", "first_window_s=none").first_window_s is None


def test_probe_help_lists_each_user_key_with_its_default_and_help_all_the_benchmarks_knobs_too():
    from decodemon.monitor.cli._common import DEVELOPER_KEYS, probe_fields

    user, every = cli("attach", "--probe", "help"), cli("attach", "--probe", "help-all")
    assert user.returncode == every.returncode == 0, (user.stderr, every.stderr)
    assert set(probe_fields()) == set(wire.Attach.__struct_fields__) - {"cupti_library"}  # the monitor's own choice
    for f in probe_fields():
        pattern = rf"^\s*{f}\s.*{re.escape(str(getattr(wire.Attach(), f)))}.*$"
        line = re.search(pattern, every.stdout, re.M)
        assert line, f
        assert len(line.group(0).split(maxsplit=3)[-1]) > 20, f"{f} has no words: {line.group(0)!r}"
        assert bool(re.search(pattern, user.stdout, re.M)) == (f not in DEVELOPER_KEYS), f
    assert {"api_every", "hold_gil", "yields"} <= set(DEVELOPER_KEYS)
    assert "e+" not in every.stdout  # ranges in plain digits


def test_a_range_in_an_error_has_no_exponent():
    r = cli("attach", "0", "--json")
    assert_one_line_error(r)
    assert "[1, 4194304]" in r.stderr


@pytest.mark.parametrize("bad, says", [
    ("no_such_key=1", "no_such_key"), ("agent_tick_s=0", "agent_tick_s"), ("window_budget=many", "window_budget"),
    ("hold_gil=maybe", "hold_gil"), ("api_every=2.5", "api_every"), ("window_tokens", "KEY=VALUE"),
    ("pm_pump_s=inf", "pm_pump_s"),
])
def test_a_bad_probe_key_or_value_is_one_line(bad, says):
    r = cli("attach", "123", "--json", "--probe", bad)
    assert_one_line_error(r)
    assert says in r.stderr and "decodemon attach --help" in r.stderr


@pytest.mark.parametrize("verb, given", [
    ("attach", ["123"]), ("record", ["123", "-o", "x.dmon"]), ("report", [REC["graph"]]), ("replay", [REC["graph"]]),
    ("diagnose", []), ("scaling", [REC["eager"], REC["graph"]]), ("compare", [REC["eager"], REC["graph"]]),
    ("demo", []),
])
def test_unrecognized_arguments_point_at_the_verbs_help(verb, given):
    r = cli(verb, *given, "--definitely-not-an-option")
    assert_one_line_error(r)
    assert f"`decodemon {verb} --help`" in r.stderr and "--definitely-not-an-option" in r.stderr


@pytest.mark.parametrize("verb", ["attach", "record", "report", "replay", "compare", "scaling"])
def test_a_missing_argument_points_at_the_verbs_help(verb):
    r = cli(verb)
    assert_one_line_error(r)
    assert f"`decodemon {verb} --help`" in r.stderr


def test_pyspy_spellings():
    from decodemon.monitor.cli import build_parser, resolve_pid

    p = build_parser()
    for argv in (["attach", "77"], ["attach", "--pid", "77"], ["record", "--pid", "77", "--output", "x.dmon"]):
        assert resolve_pid(p.parse_args(argv)) == 77
    a = p.parse_args(["record", "--pid", "77", "-o", "x.dmon", "--duration", "3"])
    assert (a.output, a.seconds) == ("x.dmon", 3.0)
    assert_one_line_error(cli("attach", "--json"))  # no pid at all
    r = cli("attach", "5", "--pid", "6", "--json")  # two different pids
    assert_one_line_error(r)
    assert "5" in r.stderr and "6" in r.stderr


def test_record_prints_json_when_asked(tmp_path):
    r = cli("record", "--pid", 4_000_000, "-o", tmp_path / "x.dmon", "--json")
    assert_one_line_error(r)  # the flag exists; the pid does not
    assert "no process with pid 4000000" in r.stderr


def test_compare_json_has_both_summaries_and_the_ratios():
    r = cli("compare", REC["eager"], REC["graph"], "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    a, b = d["a"], d["b"]
    assert a["source"] == str(REC["eager"]) and b["source"] == str(REC["graph"])
    assert a["verdict"] and b["verdict"]
    ratio = d["b_over_a"]
    assert ratio["ms_per_token"] == pytest.approx(b["ms_per_token"] / a["ms_per_token"], rel=1e-3)
    assert ratio["kernels_per_token"] == pytest.approx(b["kernels_per_token"] / a["kernels_per_token"], rel=1e-3)
    # the graph keeps the kernels (ratio ~1) and makes the host's 1,638 launch calls a token one graph launch
    assert ratio["kernels_per_token"] == pytest.approx(1.0, abs=0.01)
    assert ratio["host_launch_calls_per_token"] == pytest.approx(1 / a["kernel_launch_calls_per_token"], abs=1e-4)
    # ms/token divides medians and tokens/s means: each ratio says which, and they are different figures here
    assert set(d["b_over_a_of"]) == set(ratio)
    assert "median" in d["b_over_a_of"]["ms_per_token"] and "mean" in d["b_over_a_of"]["tokens_per_s"]
    assert ratio["tokens_per_s"] == pytest.approx(b["tokens_per_s"] / a["tokens_per_s"], rel=1e-3)
    # GPU busy from traced kernel time (eager, PM silent) over PM's (graphed): the ratio names both instruments
    busy_of = d["b_over_a_of"]["gpu_busy_pct"]
    assert "A from the kernel share (traced kernel time" in busy_of and "B from PM" in busy_of


def test_scaling_in_reverse_order_says_which_goes_first():
    one, many = os.path.join(TP, "h200_tp1_graph_rank0.dmon"), os.path.join(TP, "h200_tp2_graph_rank0.dmon")
    r = cli("scaling", many, one)
    assert_one_line_error(r)
    assert "fewer ranks" in r.stderr and f"decodemon scaling {one} {many}" in r.stderr
    assert "give --n" not in r.stderr
    assert cli("scaling", one, many, "--json").returncode == 0


def test_every_verb_that_takes_a_pid_takes_it_as_py_spy_spells_it(tmp_path):
    """`--pid PID` in place of a source on report, export, compare, predict and grade, as on attach and record;
    a pid given both ways, or too few sources, is one line."""
    import subprocess
    import sys

    def dm(*args):
        return subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", *map(str, args)], capture_output=True,
                              text=True, timeout=60)

    gone = 4194304  # no process has Linux's largest pid here
    for args in (["report", "--pid", gone], ["export", "--pid", gone, "-o", tmp_path / "t.json"],
                 ["predict", "--pid", gone, "--change", "x", "--expect", "-10%"],
                 ["compare", "--pid", gone, "--pid", gone, "--json"]):
        r = dm(*args)
        assert r.returncode == 2 and f"no process with pid {gone}" in r.stderr, (args, r.stderr)
    r = dm("grade", "--pid", gone, "--ledger", tmp_path / "none.jsonl")  # parsed: the ledger is asked first
    assert r.returncode == 2 and "no ledger at" in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    (tmp_path / "empty.jsonl").write_text("")
    r = dm("grade", "--pid", gone, "--ledger", tmp_path / "empty.jsonl")  # a ledger with nothing open: 3
    assert r.returncode == 3 and "no open prediction" in r.stderr, r.stderr
    r = dm("compare", "--pid", gone)
    assert r.returncode == 2 and "give A and B" in r.stderr and len(r.stderr.splitlines()) == 1


def test_record_names_its_file_when_not_told(tmp_path):
    import os
    import subprocess
    import sys
    import time

    loop = ("import time\nfrom decodemon.probes import agent\nagent.start()\nwhile True:\n"
            "    agent.mark_token(0); time.sleep(0.002)\n")
    proc = subprocess.Popen([sys.executable, "-c", loop])
    try:
        time.sleep(1.0)
        r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "record", str(proc.pid), "--seconds", "1.5"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        made = [n for n in os.listdir(tmp_path) if n.startswith(f"decodemon-{proc.pid}-") and n.endswith(".dmon")]
        assert len(made) == 1 and made[0] in r.stderr and "tokens (mark_token)" in r.stderr, (made, r.stderr)
    finally:
        proc.kill()
        proc.wait()
