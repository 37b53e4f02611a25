"""Shared fixtures: the committed H200 recordings, the CLI in a subprocess, tiny CPU engines."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
BUNDLED = Path(__file__).parents[1] / "monitor" / "data"  # the package's own copy: `decodemon demo` replays these
REC = {name: DATA / f"h200_{name}.dmon"
       for name in ("eager", "graph", "eager_pm", "llama8b_graph", "narrow12_graph", "eager_api2", "graph_api2")}


# a decode loop that starts the agent itself and marks a token every ~2 ms of Python (the sockets' and lease's tests)
AGENT_LOOP = """
import time
from decodemon.probes import agent
agent.start()
while True:
    agent.mark_token(0)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.002:
        pass
"""


@pytest.fixture(scope="module")
def injection_library(own_dir_module) -> Path:
    """decodemon's CUPTI injection library, built once per module in a cache only root or this user can write;
    skipped where CUDA's headers are missing."""
    from decodemon.monitor.inject import cupti_lib

    try:
        cupti_lib.cuda_include()
    except cupti_lib.BuildError as exc:
        pytest.skip(str(exc))
    return cupti_lib.build(own_dir_module / "inject")


def as_monitor_reads(frame):
    """A frame the agent built (probes/frames.py) as the monitor decodes it from the wire (probes/wire.py)."""
    from decodemon.probes import frames, wire

    return wire.decode_frame(frames.encode(frame))


def cli(*args, timeout=60, **kw):
    """Run `decodemon ARGS` in a subprocess; return CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, **kw)


def assert_one_line_error(r, rc=2):
    """Bad input: one clear line on stderr, the expected exit code, no traceback."""
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr


@pytest.fixture
def sleeper():
    """A live process that is neither Python nor has an agent."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def run_script(script, *args) -> tuple[subprocess.Popen, int]:
    """`decodemon run -- python SCRIPT ARGS`: the process and the script's pid, once it has said "decoding" on
    stderr and its agent listens."""
    from decodemon.probes.wire import socket_path

    proc = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", sys.executable, str(script),
                             *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pid = None
    for line in proc.stderr:
        if "started pid" in line:
            pid = int(line.split("started pid")[1].split(";")[0])
        if "decoding" in line:
            break
    assert pid is not None, "the script did not start"
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # a full pipe would stop the script
    for _ in range(400):
        if socket_path(pid).exists():
            break
        time.sleep(0.05)
    return proc, pid


class Engine:
    """A tiny CPU demo engine started through `decodemon run`, with the agent loaded."""

    def __init__(self, *extra, tokens=0):
        from decodemon.monitor.demo import spawn_engine
        from decodemon.probes.wire import socket_path

        self.proc, self.pid = spawn_engine(["--tiny", "--device", "cpu", "--tokens", str(tokens), *extra],
                                           stdout=subprocess.PIPE, timeout_s=60)
        self.socket = socket_path(self.pid)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
            return True
        except ProcessLookupError:
            return False

    def wait(self, timeout=120):
        """Let a finite engine finish; return (stdout, stderr)."""
        return self.proc.communicate(timeout=timeout)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                out, err = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
            return out, err
        return self.proc.communicate()


@pytest.fixture
def engine():
    e = Engine()
    yield e
    e.stop()


def make_own_dir() -> Path | None:
    """A new directory that only this user or root could have written, from "/" down (None if there is no such
    place here): where a test keeps a cache decodemon reads back. pytest's tmp_path is under /tmp, where others can
    plant names, so decodemon refuses a cache there."""
    import tempfile

    from decodemon.probes import own_files

    for base in (Path.home(), Path(__file__).resolve().parents[1]):
        try:
            fd, real = own_files.open_dir(base)
        except OSError:
            continue
        os.close(fd)
        return Path(tempfile.mkdtemp(prefix=".decodemon-test-", dir=real))
    return None


def _own_dir():
    import shutil

    made = make_own_dir()
    if made is None:
        pytest.skip("no directory here that only this user or root can write (a cache's test needs one)")
    yield made
    shutil.rmtree(made, ignore_errors=True)


own_dir = pytest.fixture(_own_dir, name="own_dir")
own_dir_module = pytest.fixture(_own_dir, name="own_dir_module", scope="module")


@pytest.fixture
def agent_marks(monkeypatch):
    """The agent's mark_token and set_model_facts caught, as an engine adapter calls them: (depths, facts)."""
    from decodemon.probes import agent

    seen, facts = [], []
    monkeypatch.setattr(agent, "mark_token", lambda depth=0: seen.append(depth))
    monkeypatch.setattr(agent, "set_model_facts", facts.append)
    return seen, facts
