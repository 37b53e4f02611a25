"""Injection on every CPython from 3.10 to 3.13 found on the machine, each a bare interpreter with nothing installed.

On every version a source that writes a marker file is injected; then the whole agent is loaded into a loop on
each version with nothing installed for it at all (the agent imports the standard library alone, and decodemon
itself is mapped in by the bootstrap from the monitor's install): tokens are counted, the loop is detached and
attached again, and its own progress goes on throughout.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decodemon.monitor import inject
from decodemon.probes.wire import socket_path
from tests.conftest import cli
from tests.test_inject import COUNTER, Loop

# Marks tokens once the agent is up: an engine does not import decodemon while its agent is loading (an import
# made then would wait on the module locks the loading thread holds).
LAZY_MARKS = r'''
import sys, time
mark_token = None
i = 0
while True:
    i += 1
    if mark_token is None and getattr(sys.modules.get("decodemon.probes.agent"), "_agent", None) is not None:
        try:
            from decodemon.engine_adapter import mark_token
        except ImportError:
            pass
    if mark_token is not None:
        mark_token()
    print(i, time.monotonic(), flush=True)
    time.sleep(0.002)
'''

MARKER = '''\
import sys, threading
open({path!r}, "w").write("%d.%d %s" % (sys.version_info[0], sys.version_info[1],
                                        threading.current_thread() is threading.main_thread()))
'''


def _bare_env(**extra) -> dict:
    """PATH only, plus where sockets live when the monitor's environment says so."""
    keep = {k: os.environ[k] for k in ("PATH", "XDG_RUNTIME_DIR") if k in os.environ}
    return {**keep, **extra}


def _python(minor: int) -> str | None:
    found = sorted(glob.glob(f"/root/.pyenv/versions/3.{minor}.*/bin/python3.{minor}")) + \
        sorted(glob.glob(f"/usr/bin/python3.{minor}"))
    return found[0] if found else None


def _wait_for(path: Path, timeout_s: float = 5.0) -> str:
    t0 = time.monotonic()
    while not (path.exists() and path.stat().st_size):
        assert time.monotonic() - t0 < timeout_s, f"{path} was not written"
        time.sleep(0.01)
    return path.read_text()


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_source_runs_on_the_main_thread_of_a_bare_interpreter(minor, tmp_path):
    py = _python(minor)
    if py is None:
        pytest.skip(f"no CPython 3.{minor} on this machine")
    loop = Loop([py, "-c", COUNTER], cwd=tmp_path, env=_bare_env())
    try:
        assert inject.why_not(loop.pid)[1] == ""
        marker = tmp_path / "ran"
        report = inject.queue_source(loop.pid, MARKER.format(path=str(marker)))
        assert report["ok"], report
        print(f"3.{minor}: main thread stopped for {report['stop_us']:.0f} us")
        assert report["stop_us"] < 20_000
        assert _wait_for(marker) == f"3.{minor} True"  # at a safe point of the main thread
        threaded = tmp_path / "threaded"
        assert inject.queue_source(loop.pid, inject.pending_call_source(MARKER.format(path=str(threaded))))["ok"]
        assert _wait_for(threaded) == f"3.{minor} False"  # the bootstrap's own work runs in a thread of its own
        loop.wait_for_lines(200)
        assert loop.max_gap_ms() < 500
    finally:
        loop.kill()


@pytest.mark.parametrize("minor", [10, 11, 12, 13])
def test_the_whole_agent_loads_into_a_bare_loop(minor, tmp_path):
    py = _python(minor)
    if py is None:
        pytest.skip(f"no CPython 3.{minor} on this machine")
    loop = Loop([py, "-c", LAZY_MARKS], cwd=tmp_path, env=_bare_env())
    try:
        r = cli("attach", loop.pid, "--json", "--seconds", 2)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["tokens"] > 100
        assert socket_path(loop.pid).exists()
        r = cli("attach", loop.pid, "--json", "--seconds", 1)
        assert r.returncode == 0 and json.loads(r.stdout)["tokens"] > 50, r.stderr
        loop.wait_for_lines(50)
        assert loop.max_gap_ms() < 500  # the loop's own progress never stopped for long
    finally:
        loop.kill()


def test_run_starts_the_agent_in_an_interpreter_that_has_no_decodemon(tmp_path):
    """`decodemon run -- python3.11 ...` with a bare interpreter (nothing installed for it, decodemon nowhere in
    it): the bootstrap maps decodemon from the monitor's install, as an attach does, and the loop is attached; a
    program that ends at once starts with no complaint from the agent."""
    py = _python(11)
    if py is None:
        pytest.skip("no CPython 3.11 on this machine")
    wrapper = Loop([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", py, "-c", LAZY_MARKS], cwd=tmp_path,
                   env=_bare_env(), stderr=subprocess.DEVNULL)
    pid = int(Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children").read_text().split()[0])
    try:
        r = cli("attach", pid, "--json", "--seconds", 2)
        assert r.returncode == 0 and json.loads(r.stdout)["tokens"] > 100, r.stderr
    finally:
        os.kill(pid, 9)
        wrapper.kill()
    bare = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", py, "-c", "pass"],
                          capture_output=True, text=True, timeout=60, env=_bare_env())
    assert bare.returncode == 0 and "agent not loaded" not in bare.stderr and "pip install" not in bare.stderr
