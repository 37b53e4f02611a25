"""The monitor slot is leased. An attached client that sends nothing for the agent's lease (5 s) loses the slot,
told why, and the agent disarms as when a monitor leaves; a refused monitor is told who holds the slot and how long
since it was heard from. A real monitor sends a heartbeat every second from the thread that reads its socket, so
one whose consumer is slow, whose app is paused, or that watches from outside (NativeTrace) keeps it. Both agents,
in real processes: the Python agent and the CUPTI injection library (started at load, on CPU)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time

import pytest

from decodemon.monitor.sources import agent_socket
from decodemon.monitor.sources.live import live_frames
from decodemon.probes import wire
from tests.conftest import AGENT_LOOP

LOOP = AGENT_LOOP

# a neighbour of the same uid: one valid Attach, then neither a read nor a word; told on stdin, it reads what the
# agent sent it, to the end, and prints the last frame's reason
SILENT = """
import sys
from decodemon.monitor.sources import agent_socket
from decodemon.probes import wire
pid = int(sys.argv[1])
s = agent_socket.connect(pid, agent_socket.find(pid))
s.sendall(wire.pack(wire.Attach()))
print("attached", flush=True)
sys.stdin.readline()
s.settimeout(5)
data = b""
while chunk := s.recv(1 << 20):
    data += chunk
frames = [wire.decode_frame(p) for p in wire.StreamReader().feed(data)]
print(frames[-1].reason if frames and isinstance(frames[-1], wire.Bye) else "no Bye", flush=True)
"""

LEASE_S = 5.0



@pytest.fixture(params=["python", "library"])
def target(request, tmp_path):
    """A decode loop with the Python agent, or `sleep` with the injection library; its own runtime directory."""
    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg)}
    if request.param == "python":
        proc = subprocess.Popen([sys.executable, "-c", LOOP], env=env)
    else:
        lib = request.getfixturevalue("injection_library")
        proc = subprocess.Popen(["sleep", "120"], env={**env, "LD_PRELOAD": str(lib),
                                                       "DECODEMON_CUPTI_START_AT_LOAD": "1"})
    try:
        t0 = time.monotonic()
        while agent_socket.find(proc.pid) is None:
            assert time.monotonic() - t0 < 30 and proc.poll() is None, "the agent did not listen"
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timing
def test_a_client_that_attaches_and_goes_silent_loses_the_slot_within_the_lease(target):
    silent = subprocess.Popen([sys.executable, "-c", SILENT, str(target.pid)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert silent.stdout.readline().strip() == "attached"
        t0 = time.monotonic()
        refusals, served = [], None
        while served is None and time.monotonic() - t0 < 10:
            frames = [f for _, _, f in live_frames(target.pid, seconds=0.5)]
            if isinstance(frames[0], wire.Hello):
                served = (time.monotonic() - t0, frames)
            else:
                refusals.append(frames[0].reason)
                time.sleep(0.25)
        assert served is not None, refusals[-3:]
        after, frames = served
        assert LEASE_S - 1 < after < 10 and isinstance(frames[-1], wire.Bye) and frames[-1].reason == "detached"
        # each monitor refused meanwhile was told who holds the slot and how long it has been silent
        heard = [re.fullmatch(rf"busy: monitor pid {silent.pid} is attached \(last heard (\d+\.\d) s ago\); one "
                              r"monitor at a time", r) for r in refusals]
        assert refusals and all(heard), refusals
        ago = [float(m.group(1)) for m in heard]
        assert ago == sorted(ago) and ago[-1] > LEASE_S - 2, ago
        silent.stdin.write("\n")
        silent.stdin.flush()
        told = silent.stdout.readline().strip()
        m = re.fullmatch(r"dropped: silent for (\d+\.\d) s", told)
        assert m and LEASE_S <= float(m.group(1)) < 10, told
        assert target.poll() is None
    finally:
        silent.kill()
        silent.wait()


@pytest.mark.timing
def test_a_monitor_whose_consumer_is_slow_keeps_the_slot_past_the_lease(target):
    t0 = time.monotonic()
    frames = []
    for _, _, f in live_frames(target.pid, wire.Attach(agent_tick_s=1.0), seconds=1.5 * LEASE_S):
        frames.append(f)
        time.sleep(0.3)  # a consumer that takes its time over every frame
    assert time.monotonic() - t0 > 1.5 * LEASE_S
    assert isinstance(frames[0], wire.Hello) and frames[0].lease_s == LEASE_S
    assert isinstance(frames[-1], wire.Bye) and frames[-1].reason == "detached", frames[-1]


@pytest.mark.timing
def test_a_paused_app_keeps_the_slot_past_the_lease(tmp_path):
    asyncio.run(_paused_app(tmp_path))


async def _paused_app(tmp_path):
    from decodemon.monitor.app import DecodemonApp
    from decodemon.monitor.player import LivePlayer

    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "-c", LOOP], env={**os.environ, "XDG_RUNTIME_DIR": str(xdg)})
    try:
        t0 = time.monotonic()
        while agent_socket.find(proc.pid) is None:
            assert time.monotonic() - t0 < 30 and proc.poll() is None, "the agent did not listen"
            time.sleep(0.05)
        player = LivePlayer(proc.pid)
        app = DecodemonApp([player], paused=True, refresh_s=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            await asyncio.sleep(1.5 * LEASE_S)
            await pilot.pause()
            assert player.paused and player.session.feed.bye is None, player.session.feed.bye
            assert player.status() == "live, frozen"
        player.thread.join(10)  # the app's exit detached it
        assert player.session.feed.bye == "detached"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timing
def test_the_outside_watchs_connection_to_the_library_keeps_the_slot_past_the_lease(injection_library, tmp_path):
    """llama-server's outside watch reads the library's windows through NativeTrace, taking them every quarter
    second: it keeps the slot, and its detach frees it."""
    from decodemon.monitor.sources.outside import FRAME_S, NativeTrace

    xdg = tmp_path / "run"
    xdg.mkdir(mode=0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(xdg), "LD_PRELOAD": str(injection_library),
           "DECODEMON_CUPTI_START_AT_LOAD": "1"}
    proc = subprocess.Popen(["sleep", "120"], env=env)
    try:
        t0 = time.monotonic()
        while agent_socket.find(proc.pid) is None:
            assert time.monotonic() - t0 < 30, "the library did not listen"
            time.sleep(0.05)
        native = NativeTrace(proc.pid, wire.Attach())
        assert native.sock is not None, native.why
        t0 = time.monotonic()
        statuses = []
        while time.monotonic() - t0 < 1.5 * LEASE_S:
            statuses += [f for _, f in native.take() if isinstance(f, wire.ProbeStatus)]
            time.sleep(FRAME_S)
        assert native.sock is not None and native.why == "" and statuses
        native.close()
        t0 = time.monotonic()  # the library reads the detach a moment after it is sent
        while not isinstance((frames := [f for _, _, f in live_frames(proc.pid, seconds=0.3)])[0], wire.Hello):
            assert frames[0].reason.startswith("busy:") and time.monotonic() - t0 < 3, frames
            time.sleep(0.05)
        assert frames[-1].reason == "detached"
    finally:
        proc.kill()
        proc.wait()
