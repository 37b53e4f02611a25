"""A root decodemon on a shared machine: what another local user can plant, and inputs that never end. Each test
is one attack or input class of docs/reliability.md, made with real processes and files; the ones that need a
second uid run as root and skip (saying why) elsewhere."""

from __future__ import annotations

import math
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decodemon.monitor.sources import agent_socket
from decodemon.monitor.cli._common import print_json
from decodemon.monitor.safe_write import write_whole
from decodemon.probes import server, wire
from tests.conftest import AGENT_LOOP

ROOT = Path(__file__).resolve().parents[1]
DM = [sys.executable, "-m", "decodemon.monitor.cli"]
REC = ROOT / "tests" / "data" / "h200_compiled_llama8b_replays.dmon"
OTHER = 65534  # nobody


def cli(*args, timeout=60, env=None):
    return subprocess.run([*DM, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def one_line(r) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid's files need root to make (chown)")


def test_a_linked_socket_directory_is_refused_and_its_target_never_chmodded(tmp_path):
    victim = tmp_path / "roots_dir"
    victim.mkdir(mode=0o755)
    (victim / "123.sock").write_text("not ours to remove")
    link = tmp_path / "decodemon-0"
    link.symlink_to(victim)
    with pytest.raises(PermissionError, match="is a link"):
        server.ensure_dir(link)
    assert server.clean_stale_sockets(link) == []
    assert stat.S_IMODE(victim.stat().st_mode) == 0o755 and (victim / "123.sock").exists()


@needs_root
def test_a_socket_directory_of_another_uid_is_refused_and_left_as_it_is(tmp_path):
    d = tmp_path / "decodemon-0"
    d.mkdir(mode=0o755)
    os.chown(d, OTHER, OTHER)
    with pytest.raises(PermissionError, match=f"belongs to uid {OTHER}"):
        server.ensure_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o755


@needs_root
def test_the_bootstrap_note_is_never_written_through_a_planted_link(tmp_path, monkeypatch):
    """The attack: uid 65534 owns the socket directory and links `<pid>.failed` to a root file."""
    from decodemon.monitor import inject

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    d = wire.socket_dir()
    d.mkdir(mode=0o755)
    os.chown(d, OTHER, OTHER)
    secret = tmp_path / "root_only"
    secret.write_text("root's own line\n")
    secret.chmod(0o600)
    pid = os.getpid()
    (d / f"{pid}.failed").symlink_to(secret)
    src = inject.bootstrap_source(pid)
    ns: dict = {}
    exec(src[:src.index("class _GilBetweenImports")], ns)  # the bootstrap's own _note, as the target runs it
    ns["_note"]("the agent could not open its socket")
    assert secret.read_text() == "root's own line\n"
    assert agent_socket.read_note(d / f"{pid}.failed", os.getuid()) is None  # the monitor reads no link either


def test_the_monitor_refuses_a_peer_that_is_not_the_target():
    a, b = socket.socketpair()
    try:
        agent_socket.check_peer(a, os.getpid(), os.getuid())  # the other end is this process: fine
        with pytest.raises(agent_socket.Refused, match="not by pid"):
            agent_socket.check_peer(a, os.getppid(), os.getuid())
    finally:
        a.close()
        b.close()


def test_a_socket_planted_at_the_targets_path_is_not_taken_for_its_agent(tmp_path):
    """Another process listens where the target's agent would: the monitor looks only at sockets the target
    itself holds, so the planted one is never connected to."""
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    planted = socket.socket(socket.AF_UNIX)
    try:
        server.ensure_dir(wire.socket_dir())
        path = wire.socket_path(target.pid)
        path.unlink(missing_ok=True)
        planted.bind(str(path))
        planted.listen(1)
        assert agent_socket.find(target.pid) is None
    finally:
        planted.close()
        wire.socket_path(target.pid).unlink(missing_ok=True)
        target.kill()
        target.wait()


LOOP = AGENT_LOOP


def _frames_after(path: Path, pid: int, attach: wire.Attach, until=wire.Bye) -> list:
    sock = agent_socket.connect(pid, path)
    try:
        sock.sendall(wire.pack(attach))
        reader, out = wire.StreamReader(), []
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end:
            data = sock.recv(1 << 16)
            if not data:
                break
            out += [wire.decode_frame(p) for p in reader.feed(data)]
            if any(isinstance(f, until) for f in out):
                break
        return out
    finally:
        sock.close()


@pytest.mark.parametrize("tick", [0.0, -1.0, float("nan")])
def test_a_hostile_attach_frame_is_refused_and_arms_nothing(tmp_path, tick):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg), "PYTHONPATH": str(ROOT.parent) + os.pathsep +
           os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-c", LOOP], env=env)
    try:
        t0 = time.monotonic()
        while (path := agent_socket.find(proc.pid)) is None and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert path is not None and str(path).startswith(str(xdg))  # found without this side's XDG_RUNTIME_DIR
        frames = _frames_after(path, proc.pid, wire.Attach(agent_tick_s=tick))
        assert isinstance(frames[-1], wire.Bye) and frames[-1].reason.startswith("refused: agent_tick_s"), frames
        assert not any(isinstance(f, (wire.Hello, wire.TokenMarks)) for f in frames)
        for _ in range(20):  # the agent serves on (once the refused attach's thread has said its Bye)
            good = _frames_after(path, proc.pid, wire.Attach(trace=False, pm=False), until=(wire.Hello, wire.Bye))
            if any(isinstance(f, wire.Hello) for f in good):
                break
            time.sleep(0.1)
        assert any(isinstance(f, wire.Hello) for f in good), good
    finally:
        proc.kill()
        proc.wait()


def test_every_attach_field_out_of_its_bounds_is_named():
    assert wire.attach_problem(wire.Attach()) is None
    for bad in (dict(agent_tick_s=0.0), dict(window_tokens=0), dict(pm_interval_us=10), dict(time_window_s=math.inf),
                dict(nvml_hz=-1.0), dict(window_period_s=-1.0), dict(token_range="x" * 300)):
        why = wire.attach_problem(wire.Attach(**bad))
        assert why and next(iter(bad)) in why, (bad, why)


@pytest.mark.parametrize("verb", ["grade", "report", "predict"])
def test_an_endless_ledger_is_refused_at_once(verb, tmp_path):
    args = {"grade": ["grade", REC], "report": ["report", REC, "-o", tmp_path / "D.md"],
            "predict": ["predict", REC, "--change", "x", "--expect", "-10%"]}[verb]
    for dev in ("/dev/zero", "/dev/full"):
        t0 = time.monotonic()
        r = cli(*args, "--ledger", dev, timeout=60)
        one_line(r)
        assert "not a regular file" in r.stderr and time.monotonic() - t0 < 30


def test_run_never_leaves_an_unwatched_child(tmp_path):
    marker = f"decodemon-orphan-{os.getpid()}"
    r = cli("run", "--pid-file", "/dev/full", "--", sys.executable, "-c", f"import time; time.sleep(30)  # {marker}")
    one_line(r)
    time.sleep(0.5)
    alive = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    assert alive == [], alive
    fifo = tmp_path / "pid.fifo"
    os.mkfifo(fifo)
    r = cli("run", "--pid-file", fifo, "--", sys.executable, "-c", f"import time; time.sleep(30)  # {marker}",
            timeout=20)
    one_line(r)
    assert subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split() == []


def test_small_inputs_get_their_one_line(tmp_path):
    fifo = tmp_path / "rec.fifo"
    os.mkfifo(fifo)
    for verb in (["replay", fifo, "--json"], ["report", fifo], ["compare", fifo, fifo, "--json"]):
        r = cli(*verb, timeout=30)  # a FIFO with no writer never blocks a reader of recordings
        one_line(r)
        assert "not a regular file" in r.stderr
    one_line(cli("attach", "١٢٣", "--json"))
    one_line(cli("report", "²"))
    one_line(cli("exporter", "--scan", "1e-9"))
    one_line(cli("exporter", "--listen", "[::1:19464"))


def test_json_output_has_no_infinity(capsys):
    print_json({"x": math.inf, "y": [math.nan, 1.5]})
    out = capsys.readouterr().out
    assert "Infinity" not in out and "NaN" not in out and '"x": null' in out


def test_a_killed_writers_hidden_part_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "run.dmon"
    stale = tmp_path / ".run.dmon.4194305.abc.part"  # a writer pid no process can have
    stale.write_bytes(b"half a recording")
    mine = tmp_path / f".run.dmon.{os.getpid()}.keep.part"  # a live writer's: kept
    mine.write_bytes(b"being written")
    write_whole(target, b"whole")
    assert not stale.exists() and mine.exists() and target.read_bytes() == b"whole"


def test_connections_that_never_speak_do_not_lock_a_monitor_out(tmp_path):
    """200 connections held open on an agent's socket: the agent answers each on a bounded pool, never holding up
    its accept loop, and a monitor's own attach still gets an answer (served or `busy`) in bounded time."""
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "-c", LOOP], env={**os.environ, "XDG_RUNTIME_DIR": str(xdg)})
    held = []
    try:
        t0 = time.monotonic()
        while (path := agent_socket.find(proc.pid)) is None and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        for _ in range(200):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            try:
                s.connect(str(path))
            except OSError:
                s.close()
                continue
            held.append(s)
        t0 = time.monotonic()
        r = cli("attach", proc.pid, "--json", "--seconds", "1", timeout=60)
        assert time.monotonic() - t0 < 20 and "Traceback" not in r.stderr, r.stderr
        assert r.returncode in (0, 2, 3)
    finally:
        for s in held:
            s.close()
        proc.kill()
        proc.wait()
