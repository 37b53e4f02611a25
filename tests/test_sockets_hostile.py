"""An agent's socket on a shared machine, against a neighbour: one of another uid who swaps the socket directory
between a check and a use (RENAME_EXCHANGE in a world-writable, not sticky runtime directory), one who owns the
directory first, and one of the same uid who holds connections open or trickles them. Both agents are tested: the
Python agent (probes/wire_socket.py, probes/server.py) and the CUPTI injection library
(probes/cupti_inject/decodemon_cupti.c), in real processes."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from decodemon.monitor.sources import agent_socket
from decodemon.monitor.sources.live import live_frames
from decodemon.monitor.inject import cupti_lib
from decodemon.probes import wire
from decodemon.probes.wire_socket import clean_stale_sockets
from tests.conftest import AGENT_LOOP

OTHER = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid's files need root to make (chown, setuid)")

LOOP = AGENT_LOOP

# the neighbour: swaps <dir>/decodemon with a directory of its own and with a link to a root directory, as fast as
# it can, until <dir>/stop appears (or 120 s pass); prints its swaps
SWAPPER = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int d = open(argv[1], O_RDONLY | O_DIRECTORY);
    long swaps = 0;
    time_t end = time(NULL) + 120;
    printf("ready\n");
    fflush(stdout);
    while (time(NULL) < end && faccessat(d, "stop", F_OK, 0) != 0)
        for (int i = 0; i < 4; i++) {
            swaps += renameat2(d, "decodemon", d, "evil", RENAME_EXCHANGE) == 0;
            swaps += renameat2(d, "decodemon", d, "evil_link", RENAME_EXCHANGE) == 0;
            if (i == 3) usleep(100); /* the directory's lock left free a while: the race, not a siege */
        }
    printf("%ld\n", swaps);
    return 0;
}
"""

PY_SETUP = """
import json, os, sys
from pathlib import Path
from decodemon.probes.wire_socket import socket_home
d, n = Path(sys.argv[1]), int(sys.argv[2])
sys.stdin.readline()
ok = private = failed = 0
for _ in range(n):
    try:
        home = socket_home(d)
    except OSError:
        failed += 1
        continue
    ok += 1
    private += home.directory != d
    home.close()
print(json.dumps({"tries": n, "ok": ok, "private": private, "failed": failed}))
"""

C_SETUP = """
import ctypes, json, os, sys
lib = ctypes.CDLL(sys.argv[3])
n = int(sys.argv[2])
sys.stdin.readline()
ok = failed = 0
for _ in range(n):
    fd = lib.decodemon_cupti_listen()
    if fd < 0:
        failed += 1
        continue
    ok += 1
    os.close(fd)
print(json.dumps({"tries": n, "ok": ok, "failed": failed}))
"""



@pytest.fixture
def shared_tmp():
    """A folder under /tmp that another uid can reach (pytest's own is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="dm-neighbour-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def root_files(base: Path) -> dict[str, tuple]:
    """Every root-owned file and directory under `base` with its mode, size and contents' time."""
    out = {}
    for p in [base, *base.rglob("*")]:
        st = os.lstat(p)
        if st.st_uid == 0:
            out[str(p)] = (stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def race(shared_tmp: Path, setup: list[str], env: dict) -> tuple[dict, int, dict, dict]:
    """Run `setup` (root, in a child) while a neighbour of uid OTHER swaps its socket directory; return its counts,
    the swaps made, and the root files before and after."""
    cc = cupti_lib.compiler()
    src = shared_tmp / "swapper.c"
    src.write_text(SWAPPER)
    swapper = shared_tmp / "swapper"
    subprocess.run([cc, "-O2", "-o", str(swapper), str(src)], check=True, capture_output=True, timeout=60)
    swapper.chmod(0o755)
    victim_dir = shared_tmp / "root_dir"  # root's own: the link the neighbour swaps in points here
    victim_dir.mkdir(mode=0o755)
    victim = shared_tmp / "root_file"
    victim.write_text("root's own line\n")
    victim.chmod(0o644)
    xdg = shared_tmp / "xdg"
    xdg.mkdir()
    xdg.chmod(0o777)  # world-writable, not sticky: anyone may rename what is in it
    (xdg / "decodemon").mkdir(mode=0o700)
    child = subprocess.Popen([sys.executable, "-c", *setup], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             env={**env, "XDG_RUNTIME_DIR": str(xdg)})
    neighbour, swaps = None, 0
    try:
        name = f"{child.pid}.sock"  # where the child's socket goes: planted in the neighbour's directory and root's
        (victim_dir / name).write_text("root's, not a socket\n")
        evil = xdg / "evil"
        evil.mkdir(mode=0o755)
        (evil / name).symlink_to(victim)
        os.lchown(evil / name, OTHER, OTHER)
        os.chown(evil, OTHER, OTHER)
        (xdg / "evil_link").symlink_to(victim_dir)
        os.lchown(xdg / "evil_link", OTHER, OTHER)
        before = root_files(shared_tmp)
        neighbour = subprocess.Popen([str(swapper), str(xdg)], stdout=subprocess.PIPE, text=True, user=OTHER,
                                     group=OTHER)
        assert neighbour.stdout.readline().strip() == "ready"
        out, _ = child.communicate("go\n", timeout=240)
    finally:
        (xdg / "stop").touch()
        if neighbour is not None:
            swaps = int(neighbour.communicate(timeout=30)[0].strip() or 0)
        if child.poll() is None:
            child.kill()
            child.wait()
    (xdg / "stop").unlink()
    after = {k: v for k, v in root_files(shared_tmp).items() if not Path(k).is_relative_to(xdg)}
    return json.loads(out), swaps, {k: v for k, v in before.items() if not Path(k).is_relative_to(xdg)}, after


@needs_root
def test_the_python_agents_socket_setup_never_changes_a_root_file_under_a_directory_swap(shared_tmp):
    counts, swaps, before, after = race(shared_tmp, [PY_SETUP, str(shared_tmp / "xdg" / "decodemon"), "10000"],
                                        dict(os.environ))
    assert counts["tries"] == 10_000 and swaps > 0
    assert counts["ok"] + counts["failed"] == 10_000
    assert counts["private"] > 0  # the swap did land between its steps: it went to a directory of its own
    assert before == after, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}
    assert (shared_tmp / "root_file").read_text() == "root's own line\n"


@needs_root
def test_the_injection_librarys_socket_setup_never_changes_a_root_file_under_a_directory_swap(shared_tmp,
                                                                                              injection_library):
    env = {k: v for k, v in os.environ.items() if k != "DECODEMON_CUPTI_START_AT_LOAD"}
    counts, swaps, before, after = race(shared_tmp, [C_SETUP, "", "2000", str(injection_library)], env)
    assert counts["tries"] == 2000 and counts["ok"] > 0 and swaps > 0
    assert before == after, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}
    assert (shared_tmp / "root_file").read_text() == "root's own line\n"


def wait_for_agent(proc: subprocess.Popen, timeout_s: float = 30) -> Path:
    t0 = time.monotonic()
    while (path := agent_socket.find(proc.pid)) is None:
        assert time.monotonic() - t0 < timeout_s and proc.poll() is None, "the agent did not listen"
        time.sleep(0.05)
    return path


UNTIL_EOF = "import sys; sys.stdin.read()"  # a process that ends normally (its exit handlers run) once told


@needs_root
def test_a_socket_directory_another_uid_owns_gets_a_private_one_the_monitor_finds(tmp_path, injection_library):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o755)
    theirs = xdg / "decodemon"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER, OTHER)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    python = subprocess.Popen([sys.executable, "-c", "from decodemon.probes import agent; agent.start(); " + UNTIL_EOF],
                              stdin=subprocess.PIPE, env=env)
    native = subprocess.Popen([sys.executable, "-c", UNTIL_EOF], stdin=subprocess.PIPE,
                              env={**env, "LD_PRELOAD": str(injection_library), "DECODEMON_CUPTI_START_AT_LOAD": "1"})
    try:
        for proc in (python, native):
            path = wait_for_agent(proc)
            st = os.stat(path.parent)
            assert path.parent != theirs and path.parent.parent == xdg and st.st_uid == 0
            assert stat.S_IMODE(st.st_mode) == 0o700
            frames = [f for _, _, f in live_frames(proc.pid, seconds=0.3)]
            assert isinstance(frames[0], wire.Hello) and frames[0].pid == proc.pid
            assert isinstance(frames[-1], wire.Bye) and frames[-1].reason == "detached"
            proc.stdin.close()
            assert proc.wait(timeout=30) == 0
        assert os.listdir(xdg) == ["decodemon"]  # each private directory removed at its process's exit
        assert os.listdir(theirs) == [] and os.stat(theirs).st_uid == OTHER  # theirs is left as it was
        assert stat.S_IMODE(os.stat(theirs).st_mode) == 0o755
    finally:
        for proc in (python, native):
            proc.kill()
            proc.wait()


def test_only_a_socket_nothing_listens_on_is_stale(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    d = wire.socket_dir()
    d.mkdir(mode=0o700)
    left = socket.socket(socket.AF_UNIX)  # left by an agent killed with SIGKILL, its pid since reused
    left.bind(str(d / f"{sleeper.pid}.sock"))
    left.close()
    old = time.time() - 60
    os.utime(d / f"{sleeper.pid}.sock", (old, old))
    live = socket.socket(socket.AF_UNIX)  # listening, under a name no process of this namespace has
    live.bind(str(d / "4194305.sock"))
    live.listen(1)
    try:
        assert clean_stale_sockets() == [sleeper.pid]
        assert sorted(os.listdir(d)) == ["4194305.sock"]
    finally:
        live.close()


def test_a_live_processs_socket_bound_a_moment_ago_is_not_stale_before_it_listens(tmp_path, monkeypatch, sleeper):
    """Between an agent's bind and its listen a connect is refused: another agent starting beside it (ranks started
    at once) must not unlink it."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    d = wire.socket_dir()
    d.mkdir(mode=0o700)
    fresh = socket.socket(socket.AF_UNIX)  # bound, not yet listening
    fresh.bind(str(d / f"{sleeper.pid}.sock"))
    try:
        assert clean_stale_sockets() == [] and os.listdir(d) == [f"{sleeper.pid}.sock"]
    finally:
        fresh.close()


class Neighbour:
    """A process's agent socket, held by a neighbour of the same uid: `idle` connections that never speak, and
    `slow` ones that trickle a byte at a time and reconnect once dropped; what each was told when dropped."""

    def __init__(self, path: Path, idle: int, slow: int) -> None:
        self.path, self.told = str(path), []
        self._stop = threading.Event()
        self.idle = [c for c in (self._connect() for _ in range(idle)) if c is not None]
        self._slow = [threading.Thread(target=self._trickle, daemon=True) for _ in range(slow)]
        for t in self._slow:
            t.start()

    def _connect(self) -> socket.socket | None:
        """A connection, tried again while the agent's queue is full (for 2 s at most)."""
        t_end = time.monotonic() + 2
        while time.monotonic() < t_end:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            try:
                s.connect(self.path)
                return s
            except BlockingIOError:
                s.close()
                time.sleep(0.005)
            except OSError:
                s.close()
                return None
        return None

    def _read_bye(self, s: socket.socket) -> None:
        try:
            s.settimeout(0.5)
            frames = wire.StreamReader().feed(s.recv(4096))
            self.told += [wire.decode_frame(p).reason for p in frames]
        except OSError:
            pass
        s.close()

    def _trickle(self) -> None:
        t_end = time.monotonic() + 60
        while not self._stop.is_set() and time.monotonic() < t_end:
            s = self._connect()
            if s is None:
                continue
            payload = wire.pack(wire.Attach())
            for i in range(len(payload)):  # a whole Attach, a byte every 0.25 s: never done in time
                try:
                    s.sendall(payload[i:i + 1])
                except OSError:
                    break
                if self._stop.wait(0.25):
                    break
            self._read_bye(s)

    def close(self) -> list[str]:
        """Stop, read what the idle ones were told, and return every reason heard."""
        self._stop.set()
        for t in self._slow:
            t.join(5)
        for s in self.idle:
            self._read_bye(s)
        return self.told


def attach_under_siege(pid: int, path: Path) -> None:
    """8 trickling and 200 idle connections on the agent's socket: a monitor's attach is served within 5 s, its
    detach answered, and everything the agent told the neighbour names its true cause."""
    jam = Neighbour(path, idle=200, slow=8)
    try:
        assert len(jam.idle) == 200
        time.sleep(0.5)  # the trickles under way
        t0 = time.monotonic()
        frames, t_hello = [], None
        for _, _, f in live_frames(pid, seconds=1.0):
            frames.append(f)
            if t_hello is None and isinstance(f, wire.Hello):
                t_hello = time.monotonic() - t0
        assert t_hello is not None and t_hello < 5.0, frames[:3]
        assert isinstance(frames[-1], wire.Bye) and frames[-1].reason == "detached"
        assert time.monotonic() - t0 < 6.0
    finally:
        told = jam.close()
    causes = {"dropped: too many connections at once", "dropped: no whole Attach within 2 s"}
    assert told and set(told) <= causes, set(told)


def test_a_neighbour_holding_the_python_agents_socket_cannot_lock_a_monitor_out(tmp_path):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "-c", LOOP], env={**os.environ, "XDG_RUNTIME_DIR": str(xdg)})
    try:
        attach_under_siege(proc.pid, wait_for_agent(proc))
    finally:
        proc.kill()
        proc.wait()


def test_a_neighbour_holding_the_injection_librarys_socket_cannot_lock_a_monitor_out(tmp_path, injection_library):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    proc = subprocess.Popen(["sleep", "120"], env={**os.environ, "XDG_RUNTIME_DIR": str(xdg),
                                                   "LD_PRELOAD": str(injection_library), "DECODEMON_CUPTI_START_AT_LOAD": "1"})
    try:
        attach_under_siege(proc.pid, wait_for_agent(proc))
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("agent", ["python", "library"])
def test_a_second_monitor_is_told_who_is_attached(tmp_path, injection_library, agent):
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    if agent == "python":
        proc = subprocess.Popen([sys.executable, "-c", LOOP], env=env)
    else:
        proc = subprocess.Popen(["sleep", "120"], env={**env, "LD_PRELOAD": str(injection_library),
                                                       "DECODEMON_CUPTI_START_AT_LOAD": "1"})
    try:
        wait_for_agent(proc)
        first = live_frames(proc.pid, seconds=30)
        assert isinstance(next(first)[2], wire.Hello)  # attached, and held while the second comes
        second = [f for _, _, f in live_frames(proc.pid, seconds=0.5)]
        assert len(second) == 1 and re.fullmatch(rf"busy: monitor pid {os.getpid()} is attached \(last heard \d+\.\d s "
                                                 r"ago\); one monitor at a time", second[0].reason), second
        first.close()
    finally:
        proc.kill()
        proc.wait()


FAKE_AGENT = """
from decodemon.probes.wire_socket import socket_home
home = socket_home()
home.sock.setblocking(True)
print("listening", flush=True)
while True:
    conn, _ = home.sock.accept()
    conn.close()
"""


def test_an_agent_that_closes_without_a_word_is_not_said_to_have_gone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", FAKE_AGENT], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    try:
        assert proc.stdout.readline().strip() == "listening"
        frames = [f for _, _, f in live_frames(proc.pid, seconds=2, inject=False)]
        assert [f.reason for f in frames] == [f"the agent of pid {proc.pid} closed the connection without "
                                              f"answering (pid {proc.pid} still runs)"]
    finally:
        proc.kill()
        proc.wait()
