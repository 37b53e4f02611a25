"""A root decodemon on a shared machine runs decodemon's own code only: its helper processes read no planted
`decodemon/` package (in the directory root stands in, or on PYTHONPATH). Real processes; what needs a second
uid's files runs as root and skips elsewhere (as tests/test_hostile.py does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from decodemon.probes import children, wire
from tests.conftest import Engine

OTHER = 65534  # nobody
# the verb itself is started isolated here: what is watched is what it starts, in the planted directory and with
# the planted PYTHONPATH in the environment it passes on
DM = [sys.executable, "-I", "-m", "decodemon.monitor.cli"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid's files need root to make (chown)")


def give_away(path: Path) -> None:
    """Make `path` and everything under it uid 65534's."""
    for p in [path, *path.rglob("*")]:
        os.lchown(p, OTHER, OTHER)


@pytest.fixture
def planted(tmp_path):
    """Another user's `decodemon` package (and sitecustomize) in a world-writable directory: the directory, the
    file its code writes when it runs, and this environment with the directory on PYTHONPATH."""
    shared = tmp_path / "shared"
    (shared / "decodemon").mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    marker_line = f"open({str(marker)!r}, 'a').write(__file__ + '\\n')\n"
    (shared / "decodemon" / "__init__.py").write_text(marker_line)
    (shared / "sitecustomize.py").write_text(marker_line)
    if os.geteuid() == 0:
        give_away(shared)
    shared.chmod(0o1777)
    marker.touch(mode=0o666)  # the planted code writes here whoever it runs as
    marker.chmod(0o666)
    return SimpleNamespace(dir=shared, marker=marker, env={**os.environ, "PYTHONPATH": str(shared)})


def ran(p) -> str:
    return p.marker.read_text()


def test_a_plain_start_runs_the_plant_and_decodemons_own_start_does_not(planted):
    plain = [sys.executable, "-m", "decodemon.probes.sidecar", "--help"]
    subprocess.run(plain, cwd=planted.dir, env={**os.environ, "PYTHONPATH": ""}, capture_output=True, timeout=60)
    assert "decodemon/__init__.py" in ran(planted)  # the attack, as it was: the package in root's directory ran
    planted.marker.write_text("")
    r = subprocess.run(children.python_argv("decodemon.probes.sidecar", "--help"), cwd=children.CWD,
                       env=planted.env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "--uuid" in r.stdout, r.stderr
    assert ran(planted) == ""


def test_every_helper_command_line_is_isolated_and_the_engine_reads_only_the_agents_path(planted):
    assert children.python_argv("m", "a")[1:] == ["-I", "-m", "m", "a"]
    cmd, env = children.python_argv("x", flags=children.AGENT_LOADED), children.without_python_vars(planted.env)
    assert "-I" not in cmd and "-s" in cmd and ("-P" in cmd or sys.version_info < (3, 11))
    assert not [k for k in env if k.startswith("PYTHON")] and env["PATH"] == os.environ["PATH"]
    from decodemon.monitor.demo import engine_command

    cmd, env = engine_command(["--tiny"], planted.env)
    assert cmd[1:5] == ["-I", "-m", "decodemon.monitor.cli", "run"]  # `decodemon run` itself: isolated
    assert cmd[6:] == [sys.executable, *children.AGENT_LOADED, "-m", "decodemon.engine_adapter.demo", "--tiny"]
    assert "PYTHONPATH" not in env  # `decodemon run` gives it the bootstrap's, and no other


@pytest.mark.parametrize("verb", ["attach", "record", "report"])
def test_a_verb_that_attaches_starts_its_ptrace_helper_from_decodemons_own_code(planted, tmp_path, verb):
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"], cwd="/",
                              env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    try:
        time.sleep(0.5)
        out = ["-o", str(tmp_path / "out")] if verb in ("record", "report") else ["--json"]
        r = subprocess.run([*DM, verb, str(target.pid), "--seconds", "1", *out], cwd=planted.dir, env=planted.env,
                           capture_output=True, text=True, timeout=120)
        assert "helper" not in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert wire.socket_path(target.pid).exists()  # the helper ran, and loaded the agent
    finally:
        target.kill()
        target.wait()
    assert ran(planted) == ""


def test_allreduce_starts_its_benchmark_and_ranks_from_decodemons_own_code(planted):
    pytest.importorskip("torch")
    r = subprocess.run([*DM, "allreduce", "--payload-bytes", "2048", "--tp", "2", "--iters", "2", "--device", "cpu",
                        "--repeats", "1", "--json"], cwd=planted.dir, env=planted.env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["repeats"] == 1 and ran(planted) == ""


def test_the_demo_engine_its_wrapper_and_its_ranks_run_decodemons_own_code(planted, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.chdir(planted.dir)
    monkeypatch.setenv("PYTHONPATH", str(planted.dir))
    e = Engine("--tp", "2")  # `decodemon run` -> the demo engine (agent loaded) -> its rank 1
    try:
        assert e.alive() and e.socket.exists()
    finally:
        e.stop()
    assert ran(planted) == ""


def test_the_sidecar_and_copy_bandwidth_start_from_own_code_with_no_target_text_on_their_command_lines(
        planted, monkeypatch):
    from decodemon.monitor.bandwidth import measure_copy_gbs
    from decodemon.monitor.sidecar import Sidecar

    monkeypatch.chdir(planted.dir)
    monkeypatch.setenv("PYTHONPATH", str(planted.dir))
    hostile = "GPU-0\x1b]2;owned\x07\x1b[2J"  # a target's hello: escapes for whoever reads `ps`
    for uuid, on_argv in ((hostile, False), ("GPU-8c6f0a6e-1b2c-4d5e-8f90-0123456789ab", True)):
        gpu = wire.GpuInfo(index=0, name="x", sm_count=1, mem_bandwidth_gbs=1.0, uuid=uuid, driver_version="1.2")
        side = Sidecar(gpu, os.getpid(), wire.Attach(), pm=False)
        try:
            assert ("--uuid" in side.proc.args) == on_argv and hostile not in side.proc.args
            assert side.proc.args[1] == "-I"
        finally:
            side.close()
        measure_copy_gbs(gpu)  # no GPU here: None, from a child that ran decodemon's code (or nothing, for hostile)
    assert children.gpu_uuid(hostile) == "" and children.gpu_uuid("MIG-GPU-8c6f0a6e-1b2c/1/0")
    assert children.driver_version("580.159.04") == "580.159.04" and children.driver_version("1\n2") == "?"
    assert ran(planted) == ""
