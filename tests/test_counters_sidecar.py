"""The device-wide counters are read by a process of the monitor's own, not by the target: once an agent's hello
names a GPU, the monitor starts the sidecar (NVML always, and PM) and its frames join the
agent's in one stream. Run against a stand-in agent that says it has a GPU; on this machine the sidecar finds no
driver and says so, which is the frame the test looks for."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from decodemon.monitor.sources import live
from decodemon.probes import wire
from decodemon.probes.server import ensure_dir


@pytest.fixture
def stand_in_agent():
    """An agent socket for this process that sends a hello with a GPU, then a Bye when detached; the Attach it
    got."""
    ensure_dir(wire.socket_dir())
    path = wire.socket_path(os.getpid())
    path.unlink(missing_ok=True)
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    got: list = []

    def serve():
        c, _ = srv.accept()
        r = wire.StreamReader()
        gpu = wire.GpuInfo(index=0, name="NVIDIA H200", sm_count=132, mem_bandwidth_gbs=4800.0, uuid="GPU-0")
        sent = False
        while True:
            d = c.recv(4096)
            if not d:
                break
            for p in r.feed(d):
                msg = wire.decode_control(p)
                if isinstance(msg, wire.Attach) and not sent:
                    got.append(msg)
                    c.sendall(wire.pack(wire.Hello(wire_version=wire.WIRE_VERSION, pid=os.getpid(), argv=[],
                                                   python="", hostname="", gpu=gpu)))
                    sent = True
                if isinstance(msg, wire.Detach):
                    c.sendall(wire.pack(wire.Bye(reason="detached")))
                    c.close()
                    return

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield got
    srv.close()
    path.unlink(missing_ok=True)


def _statuses(settings: wire.Attach, until) -> list[wire.ProbeStatus]:
    """The statuses of one attach, read until `until(statuses)` holds (the sidecar's start, imports included, is
    the machine's to time: seconds on a loaded 2-core one), or a minute has passed."""
    frames = []
    got = lambda: until([f for f in frames if isinstance(f, wire.ProbeStatus)])  # noqa: E731
    for _, _, f in live.live_frames(os.getpid(), settings, seconds=60.0, stop=got):
        frames.append(f)
    assert isinstance(frames[0], wire.Hello) and isinstance(frames[-1], wire.Bye)
    return [f for f in frames if isinstance(f, wire.ProbeStatus)]


def _nvml_said(st) -> bool:
    return any(s.nvml == "unavailable" and s.nvml_error for s in st)


@pytest.mark.timing  # the sidecar starts in its own process: waited for, on a loaded machine too
def test_pm_and_nvml_are_read_by_the_monitors_sidecar_by_default(stand_in_agent):
    st = _statuses(wire.Attach(), lambda st: _nvml_said(st) and any(s.pm and s.pm_where == "sidecar" for s in st))
    assert any(s.nvml == "unavailable" and s.nvml_error for s in st)  # the sidecar's word: no NVML here
    pm = [s for s in st if s.pm]
    assert pm and pm[-1].pm_where == "sidecar" and pm[-1].pm == "unavailable" and "CUDA driver" in pm[-1].pm_error
    # it names the libcupti it loaded: the nvidia-cuda-cupti wheel's, chosen before cupti-python could pick one
    assert "libcupti.so" in pm[-1].pm_lib and "nvidia-cuda-cupti 13." in pm[-1].pm_lib



def test_counters_off_says_pm_off(stand_in_agent):
    st = _statuses(wire.Attach(pm=False),
                   lambda st: _nvml_said(st) and any(s.pm == "off" for s in st))
    assert any(s.pm == "off" for s in st) and not any(s.pm_where == "sidecar" for s in st)
