"""`decodemon exporter` watches only what it is told to: processes whose own agent already listens, and the pids
named on its command line; it loads an agent into a named pid only with --inject, and into no other process
whatever sockets lie about. Real processes throughout."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgspec
import pytest

from decodemon.monitor.exporter import collector, scan, serve, watch
from decodemon.probes import wire
from tests.conftest import AGENT_LOOP, assert_one_line_error, cli

OTHER = 65534  # nobody
# a Python process nobody asked decodemon to watch, its main thread at a safe point often (an agent could be loaded)
PLAIN = "import time\nfor _ in range(2400):\n    time.sleep(0.05)"
LOOP = AGENT_LOOP


def threads_of(pid: int) -> list[str]:
    """The names of a process's threads."""
    return [Path(f"/proc/{pid}/task/{t}/comm").read_text().strip() for t in os.listdir(f"/proc/{pid}/task")]


def leave_stale_socket(pid: int) -> Path:
    """A socket named for `pid` that nothing listens on: what an agent killed by SIGKILL leaves, its pid reused."""
    d = wire.socket_dir()
    d.mkdir(mode=0o700, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / f"{pid}.sock"))
    s.close()
    return d / f"{pid}.sock"


def scan_until(ex: scan.Exporter, done, timeout_s: float = 30.0, every_s: float = 0.1) -> None:
    """Scan as the exporter's loop does, every `every_s`, until `done()` (bounded in time)."""
    t_end = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < t_end, "timed out"
        ex.scan()
        time.sleep(every_s)


@pytest.fixture
def plain(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", PLAIN]) for _ in range(2)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_a_stale_socket_beside_a_live_python_process_gets_it_no_agent(plain):
    target = plain[0]
    stale = leave_stale_socket(target.pid)
    ex = scan.Exporter(only=lambda p: p == target.pid)  # other engines on this host are not this test's
    stop = threading.Event()
    served = threading.Thread(target=serve.run_exporter, args=("127.0.0.1", 0),
                              kwargs=dict(scan_every_s=0.1, stop=stop.is_set, exporter=ex))
    served.start()
    try:
        t_end = time.monotonic() + 30
        while ex.scans < 20:  # two seconds of scans, each of which would have started a watch that injects
            assert time.monotonic() < t_end and served.is_alive()
            time.sleep(0.05)
        assert ex.watches == {} and ex.targets() == []
        assert len(threads_of(target.pid)) == 1  # no agent thread, nor any other of decodemon's
    finally:
        stop.set()
        served.join(10)
    assert stale.exists()  # left for the next agent of this user to prove stale and remove


def test_a_named_pid_gets_an_agent_only_with_inject_and_no_other_process_does(plain):
    named, bystander = plain
    leave_stale_socket(bystander.pid)
    ex = scan.Exporter(pids=[named.pid], only=lambda p: p in (named.pid, bystander.pid))
    try:
        ex.scan()
        w = ex.watches[named.pid]  # held: a later scan drops a watch that has ended
        t_end = time.monotonic() + 30
        while w.running:
            assert time.monotonic() < t_end, "timed out"
            time.sleep(0.05)
        assert "has no decodemon agent listening" in w.ended
        assert len(threads_of(named.pid)) == 1 and bystander.pid not in ex.watches
    finally:
        ex.stop()
    ex = scan.Exporter(pids=[named.pid], inject=True, only=lambda p: p in (named.pid, bystander.pid))
    try:
        scan_until(ex, lambda: "dm-agent" in threads_of(named.pid))  # the one named and injected
        ex.scan()
        assert set(ex.watches) == {named.pid} and len(threads_of(bystander.pid)) == 1
    finally:
        ex.stop()


def test_a_hello_from_another_process_ends_the_watch(plain):
    w = watch.Watch(plain[0].pid)
    hello = wire.Hello(wire_version=wire.WIRE_VERSION, pid=plain[0].pid, argv=["python"], python="3.11",
                       hostname="h", gpu=None, gpu_unavailable="", cupti_version="", model=None, settings={})
    assert w.not_the_process(hello) is None
    assert "says it is pid 1" in w.not_the_process(msgspec.structs.replace(hello, pid=1))
    w.started -= 1  # what a process started since under the same pid reads as
    assert "not the process found" in w.not_the_process(hello)


@pytest.mark.skipif(os.geteuid() != 0, reason="another uid's socket directory needs root to make")
def test_an_agent_in_a_private_directory_is_found_and_watched(tmp_path, monkeypatch):
    """Another uid owns the usual socket directory: the agent listens in a private one, and the exporter finds it
    among the host's listening sockets."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    theirs = wire.socket_dir()
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER, OTHER)
    proc = subprocess.Popen([sys.executable, "-c", LOOP], env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    ex = scan.Exporter(only=lambda p: p == proc.pid)
    try:
        scan_until(ex, lambda: [s for _, s in ex.targets() if s.tokens is not None])
        (labels, snap), = ex.targets()
        assert labels["pid"] == str(proc.pid) and snap.tokens_total > 0
        assert os.listdir(theirs) == []
    finally:
        ex.stop()
        proc.kill()
        proc.wait()


def test_an_idle_scrape_connection_closes_without_a_traceback(capfd, monkeypatch):
    monkeypatch.setattr(serve, "IDLE_CONNECTION_S", 0.3)
    server = serve.start_server(collector.SnapshotCollector(lambda: []), "127.0.0.1", 0)
    port = server.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
    idle[0].sendall(b"GET /metr")  # half a request line, then nothing
    try:
        for s in idle:
            assert s.recv(4096) == b""  # closed by the server once idle
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200  # and it still serves
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()
    assert capfd.readouterr().err == ""


def test_bad_exporter_arguments_are_one_line():
    assert_one_line_error(cli("exporter", "--inject"))
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert_one_line_error(cli("exporter", gone.pid))


def test_a_named_pid_it_cannot_watch_is_said_once_on_stderr(capsys, tmp_path):
    """`decodemon exporter 1`: pid 1 has no agent (and is not this user's): one line says why it serves nothing
    for it, not one per retry."""
    ex = scan.Exporter(directory=tmp_path, only=lambda pid: False, pids=[1])
    try:
        ex.scan()
        deadline = time.monotonic() + 20
        while any(w.running for w in ex.watches.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        ex.scan()
        ex.scan()
    finally:
        ex.stop()
    err = capsys.readouterr().err
    assert err.count("decodemon exporter: pid 1 is not watched: ") == 1, err
    assert ex.series() == []
