"""The app needs a terminal: to a pipe each app verb answers at once (a summary or a one-line hint)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REC, assert_one_line_error


def through_a_pipe(*args):
    """Run `decodemon ARGS | cat`-style: stdout and stdin are pipes, never a terminal."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", *map(str, args)], stdin=subprocess.PIPE,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=5)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("verb", ["replay", "compare", "demo", "attach"])
def test_the_app_verbs_through_a_pipe_exit_at_once_with_a_hint(verb, sleeper):
    args = {"replay": ["replay", REC["graph"]], "compare": ["compare", REC["eager"], REC["graph"]],
            "demo": ["demo", "--replay"], "attach": ["attach", sleeper.pid]}[verb]
    r, took_s = through_a_pipe(*args)
    assert_one_line_error(r)
    assert "not a terminal" in r.stderr and "--json" in r.stderr
    assert r.stdout == "" and took_s < 5


def test_attach_seconds_quits_the_app(monkeypatch):
    """`attach PID --seconds 3` opens the app for three seconds; without it the app stays until `q`."""
    from decodemon.monitor import app as app_mod
    from decodemon.monitor import ranks
    from decodemon.monitor.sources import pids
    from decodemon.monitor.cli import main

    seen = []
    monkeypatch.setattr(app_mod, "run_app", lambda specs, **kw: seen.append(kw.get("quit_after_s")) or 0)
    monkeypatch.setattr(pids, "check_pid", lambda pid, inject=True: None)
    monkeypatch.setattr(ranks, "discover_ranks", lambda pid: [pid])
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    pid = str(os.getpid())  # a process that exists (the agent's side is stood in for above)
    assert main(["attach", pid, "--seconds", "3"]) == 0
    assert main(["attach", pid, "--duration", "2.5"]) == 0
    assert main(["attach", pid]) == 0
    assert seen == [3.0, 2.5, None]


@pytest.mark.parametrize("argv, status", [(["diagnose", "--kernels-per-token", "1000"], 3),
                                          (["replay", "monitor/data/h100_graph.dmon", "--json"], 0),
                                          (["report", "monitor/data/h100_eager.dmon"], 0)])
def test_the_exit_status_survives_a_reader_that_closed_the_pipe(argv, status):
    """`decodemon diagnose ... | head -4`: the reader may be gone before decodemon writes; the status is still the
    verb's (3: nothing binds), with nothing on stderr. The pipe here is closed before decodemon starts."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", *argv], stdout=w, stderr=subprocess.PIPE,
                           text=True, timeout=120, cwd=Path(__file__).parents[1])
    finally:
        os.close(w)
    assert (p.returncode, p.stderr) == (status, "")
