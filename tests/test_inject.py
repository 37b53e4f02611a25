"""Attach without restart: the reasons it cannot, and the injected bootstrap itself.

No Python 3.14 could be installed on these machines (Debian 12's packages stop at 3.11 and no registry reached
here ships a 3.14 interpreter), so `sys.remote_exec` itself is not exercised: the bootstrap it would execute is run
inside a real CPU target by the target's own hand instead (see docs/reliability.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from decodemon.monitor import inject
from decodemon.probes.wire import socket_path
from tests.conftest import assert_one_line_error, cli

TARGET = r'''
import os, signal, sys, time
path = sys.argv[1]
def run_bootstrap(*_):  # what sys.remote_exec would do at the next safe point
    exec(compile(open(path).read(), path, "exec"), {"__name__": "__decodemon_bootstrap__"})
signal.signal(signal.SIGUSR1, run_bootstrap)
from decodemon.engine_adapter import mark_token
print("ready", flush=True)
i = 0
while True:
    time.sleep(0.001)
    i += 1
    mark_token(i)
'''


def test_python_311_target_gets_the_exact_reason_and_both_ways():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        exe, reason = inject.why_not(p.pid)
        assert exe == "" and "needs Python 3.14" in reason
        r = cli("attach", p.pid, "--json")
        assert_one_line_error(r)
        assert "needs Python 3.14 (sys.remote_exec)" in r.stderr
        assert "decodemon run --" in r.stderr and "DECODEMON_AGENT=1" in r.stderr
    finally:
        p.kill()


def test_non_python_target_is_named():
    p = subprocess.Popen(["sleep", "30"])
    try:
        exe, reason = inject.why_not(p.pid)
        assert exe == "" and "is not a Python process" in reason
        assert_one_line_error(cli("attach", p.pid, "--json"))
    finally:
        p.kill()


def test_injected_bootstrap_starts_a_working_agent(tmp_path):
    boot = tmp_path / "boot.py"
    boot.write_text(inject.bootstrap_source())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = ""  # the bootstrap must find decodemon by itself
    p = subprocess.Popen([sys.executable, "-c", TARGET, str(boot)], stdout=subprocess.PIPE, text=True,
                         cwd=tmp_path, env=env)
    try:
        assert p.stdout.readline().strip() == "ready"
        assert not socket_path(p.pid).exists()
        p.send_signal(signal.SIGUSR1)
        t0 = time.monotonic()
        while not socket_path(p.pid).exists():
            assert time.monotonic() - t0 < 10
            time.sleep(0.05)
        r = cli("attach", p.pid, "--json", "--seconds", "1")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tokens"] > 100
    finally:
        p.kill()
