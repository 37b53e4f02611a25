"""PM sampling's arm and release, with cupti-python faked: DRAM bytes when the chip takes them, a full release, and
counters held by someone else named after a few tries."""

from __future__ import annotations

import socket
import sys
import threading
import time
import types
from pathlib import Path

from decodemon.monitor import probe_status
from decodemon.probes import pm_arm, pm_config, wire
from decodemon.probes import session as sess
from decodemon.probes.facts import PROCESS
from decodemon.probes.server import Agent
from decodemon.probes.sidecar import PM_METRICS
from tests.test_agent import _fake_pm_modules


def _refusing(monkeypatch, refuse: bool) -> list:
    """The fake cupti's configuration images, refusing the DRAM byte metrics if `refuse`; the lists asked for."""
    asked = []
    host = sys.modules["cupti"].profiler_host.ProfilerHost
    real = host.create_config_image

    def create(self, metrics):
        asked.append(list(metrics))
        if refuse and "dram__bytes_read.sum" in metrics:
            raise RuntimeError("CUPTI_ERROR_INVALID_METRIC_NAME")
        return real(self, metrics)

    monkeypatch.setattr(host, "create_config_image", create)
    monkeypatch.setattr(pm_config, "_REFUSED_DRAM_BYTES", set())
    return asked


def test_pm_samples_dram_bytes_read_and_written_where_the_chip_takes_them(monkeypatch):
    from decodemon.probes import pm_inproc

    _fake_pm_modules(monkeypatch, [])
    asked = _refusing(monkeypatch, refuse=False)
    pm = pm_inproc.PmSampler(0, 2000)
    assert pm.metrics == PM_METRICS + ["dram__bytes_read.sum", "dram__bytes_write.sum"] and pm.dram_bytes
    assert asked == [pm.metrics]


def test_a_chip_that_refuses_dram_bytes_is_sampled_without_them_and_not_asked_again(monkeypatch):
    from decodemon.probes import pm_inproc

    _fake_pm_modules(monkeypatch, [])
    asked = _refusing(monkeypatch, refuse=True)
    pm = pm_inproc.PmSampler(0, 2000)
    assert pm.metrics == PM_METRICS and not pm.dram_bytes and len(asked) == 2
    asked.clear()
    pm_inproc.PmSampler(0, 2000)
    assert asked == []  # the refusal is remembered (and the image for PM_METRICS kept)
    frames = pm_arm.pm_frames(pm.metrics, [1], [2], [[0.0] * len(pm.metrics)], [False])
    assert frames[0].metrics == PM_METRICS


class _Busy(Exception):
    status = pm_config.HARDWARE_BUSY

    def __str__(self) -> str:
        return "ERROR_HARDWARE_BUSY (26)"


def _sampler_busy_for(monkeypatch, n: int) -> list:
    from decodemon.probes import pm_inproc

    tries = []

    def make(device, interval_us, pump_s):
        tries.append(time.monotonic())
        if len(tries) <= n:
            raise _Busy()
        return types.SimpleNamespace(dram_bytes=True)

    monkeypatch.setattr(pm_inproc, "PmSampler", make)
    monkeypatch.setattr(pm_arm, "cuda_device_index", lambda: 0)
    monkeypatch.setattr(PROCESS, "pm_armed_before", True)
    return tries


def test_an_arm_that_finds_the_counters_busy_tries_again_for_about_a_second(monkeypatch):
    tries = _sampler_busy_for(monkeypatch, 2)
    slept = []
    status: dict = {}
    assert pm_arm.arm_pm(wire.Attach(), status, sleep=slept.append) is not None
    assert len(tries) == 3 and slept == [pm_arm.BUSY_WAIT_S] * 2
    assert (status["pm"], status["pm_reason"], status["pm_dram_bytes"]) == ("armed", "", True)


def test_counters_that_stay_busy_are_reported_as_held_by_another_profiler(monkeypatch):
    tries = _sampler_busy_for(monkeypatch, 10**6)
    slept = []
    status: dict = {}
    assert pm_arm.arm_pm(wire.Attach(), status, sleep=slept.append) is None
    assert len(tries) == pm_arm.BUSY_TRIES and 0.9 <= sum(slept) <= 1.1
    assert (status["pm"], status["pm_reason"]) == ("unavailable", "hardware_busy")
    assert "counters held by another profiler" in probe_status.describe(wire.ProbeStatus(**status))["pm"]


def test_what_holds_busy_counters_is_found_by_process_name(tmp_path):
    from decodemon.probes import pm_config

    for pid, name in ((812, "nv-hostengine"), (900, "python3"), (901, "ncu")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(name + "\n")
    (tmp_path / "self").mkdir()
    assert pm_config.counter_holders(False, proc=str(tmp_path)) == ["nv-hostengine (pid 812)", "ncu (pid 901)"]
    assert pm_config.counter_holders(True, proc=str(tmp_path))[-1].startswith("this process")


def test_a_real_profiler_process_on_this_host_is_named(tmp_path):
    """A process whose name is `ncu` (a copy of `sleep` under that name), found through the real /proc."""
    import shutil
    import subprocess

    from decodemon.probes import pm_config

    ncu = tmp_path / "ncu"
    shutil.copy(shutil.which("sleep"), ncu)
    p = subprocess.Popen([str(ncu), "30"])
    try:
        for _ in range(200):  # Popen returns before the child's exec has renamed it
            if Path(f"/proc/{p.pid}/comm").read_text().strip() == "ncu":
                break
            time.sleep(0.01)
        assert f"ncu (pid {p.pid})" in pm_config.counter_holders(False)
    finally:
        p.kill()
        p.wait()
    assert f"ncu (pid {p.pid})" not in pm_config.counter_holders(False)


def test_counters_busy_at_an_arm_name_what_holds_them(monkeypatch):
    from decodemon.probes import pm_config

    _sampler_busy_for(monkeypatch, 10**6)
    monkeypatch.setattr(pm_config, "counter_holders", lambda before: ["dcgm-exporter (pid 42)"])
    status: dict = {}
    assert pm_arm.arm_pm(wire.Attach(), status, sleep=lambda s: None) is None
    assert status["pm_holders"] == ["dcgm-exporter (pid 42)"]
    assert "held by dcgm-exporter (pid 42)" in probe_status.describe(wire.ProbeStatus(**status))["pm"]


class _Coll:
    _pm_sampling_object = 7

    def __init__(self, calls, disable_fails):
        self.calls, self.disable_fails = calls, disable_fails

    def stop(self):
        self.calls.append("stop")

    def disable(self):
        self.calls.append("disable")
        if self.disable_fails:
            raise RuntimeError("CUPTI_ERROR_INVALID_OPERATION")


def _cupti(calls):
    c = types.SimpleNamespace(PM_SAMPLING_DISABLE_PARAMS_STRUCT_SIZE=1, PROFILER_DEINITIALIZE_PARAMS_STRUCT_SIZE=1)
    c.PmSamplingDisableParams = c.ProfilerDeInitializeParams = lambda: types.SimpleNamespace(ptr=0)
    c.pm_sampling_disable = lambda ptr: calls.append("pm_sampling_disable")
    c.profiler_deinitialize = lambda ptr: calls.append("profiler_deinitialize")
    return c


def test_a_release_whose_disable_fails_still_deinitializes_the_profiler():
    calls = []
    coll = _Coll(calls, disable_fails=True)
    failed = pm_config.release(coll, _cupti(calls))
    assert calls == ["stop", "disable", "pm_sampling_disable", "profiler_deinitialize"]
    assert failed and failed[0].startswith("disable:") and coll._pm_sampling_object is None
    calls.clear()
    assert pm_config.release(_Coll(calls, disable_fails=False), _cupti(calls)) == []
    assert calls == ["stop", "disable"]  # cupti-python's disable made both steps itself


def test_detach_releases_pm_before_the_decode_thread_finalizes_cupti():
    order = []

    class Tracer:
        active, initialised = True, True

        def close(self):
            order.append("trace close")
            self.active = False

        def flush(self):
            order.append("trace flush")

        def boundary(self):
            pass

        def detach(self):
            order.append("trace finalize")
            self.initialised = False

    s = sess.Session(wire.Attach(), Tracer())
    s.tokens_left = 10**9  # a window open until the detach
    s.pm = types.SimpleNamespace(close=lambda: order.append("pm release"))
    sess.ACTIVE.session = s
    stop = threading.Event()

    def decode():
        while not stop.is_set():
            s.on_token(1)
            time.sleep(0.005)

    th = threading.Thread(target=decode)
    th.start()
    mine, theirs = socket.socketpair()
    try:
        Agent.tear_down(object.__new__(Agent), mine, s, "detached")
    finally:
        stop.set()
        th.join()
        theirs.close()
        sess.ACTIVE.session = None
    assert order == ["pm release", "trace close", "trace flush", "trace finalize"]


def test_counters_busy_at_the_attach_are_tried_again_at_each_pump_and_armed_when_they_free(monkeypatch):
    tries = _sampler_busy_for(monkeypatch, pm_arm.BUSY_TRIES + 2)  # busy through the attach and two pumps
    status: dict = {}
    s = sess.Session(wire.Attach(), None)
    s.pm = pm_arm.arm_pm(wire.Attach(), status, sleep=lambda _: None)
    assert s.pm is None and status["pm_reason"] == "hardware_busy"
    for pump, at in enumerate([1.0, 1.5, 2.0, 3.0, 4.0]):  # tried 1 s, then 2 s apart: not at 1.5 or 3.0
        assert pm_arm.pump_pm(s, status, now=lambda: s.started + at) == []
        assert (s.pm is not None) == (pump == 4)
    assert len(tries) == pm_arm.BUSY_TRIES + 3
    assert (status["pm"], status["pm_reason"], status["pm_busy_tries"], status["pm_armed_after_s"]) == \
        ("armed", "", 3, 4.0)
    words = probe_status.describe(wire.ProbeStatus(**status))["pm"]
    assert "armed 4.0 s after the attach (the counters were busy until then)" in words
    off = sess.Session(wire.Attach(pm=False), None)
    assert pm_arm.pump_pm(off, {"pm_reason": "hardware_busy", "pm_where": "in_process"}) == [] and off.pm is None


def test_a_release_that_failed_is_said_at_the_next_attach(monkeypatch):
    monkeypatch.setattr(PROCESS, "pm_last_release", [])
    pm_arm.release_pm(types.SimpleNamespace(close=lambda: ["disable: cuptiError: ERROR_INVALID_OPERATION"]))
    _sampler_busy_for(monkeypatch, 10**6)
    status: dict = {}
    assert pm_arm.arm_pm(wire.Attach(), status, sleep=lambda _: None) is None
    assert status["pm_last_release"] == ["disable: cuptiError: ERROR_INVALID_OPERATION"]
    words = probe_status.describe(wire.ProbeStatus(**status))["pm"]
    assert "releasing the previous PM session failed at disable: cuptiError: ERROR_INVALID_OPERATION" in words
    pm_arm.release_pm(types.SimpleNamespace(close=lambda: []))
    assert PROCESS.pm_last_release == []
