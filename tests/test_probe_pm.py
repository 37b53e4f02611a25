"""PM sampling in the sidecar (decodemon's own process), with cupti-python faked: counters held by someone else are
named, tried again, and armed once they free; DRAM bytes dropped on a chip that refuses them."""

from __future__ import annotations

import sys
import threading
import time
import types
from pathlib import Path

from decodemon.monitor.counters import pm_config, sampler as sidecar


class _Busy(Exception):
    status = pm_config.HARDWARE_BUSY


class _Collector:
    """cupti-python's pm_sampling.Collector, refusing to enable while `busy[0]` > 0 (counted down per try), and
    refusing the DRAM byte metrics when `refuse_dram`."""

    def __init__(self, busy: list, refuse_dram: bool, configured: list) -> None:
        self.busy, self.refuse_dram, self.configured = busy, refuse_dram, configured
        self._chip_name, self._metrics = "GH100", None

    def enable(self):
        if self.busy[0] > 0:
            self.busy[0] -= 1
            raise _Busy("CUPTI_ERROR_HARDWARE_BUSY")

    def configure(self, metrics, hardware_buffer_size, sampling_interval):
        if self.refuse_dram and "dram__bytes_read.sum" in metrics:
            raise RuntimeError("CUPTI_ERROR_INVALID_METRIC_NAME")
        self._metrics = list(metrics)
        self.configured.append(list(metrics))

    def start(self):
        pass

    def stop(self):
        pass

    def disable(self):
        pass

    def decode(self, max_samples):
        return []


def _run_pm_loop(monkeypatch, busy: int, refuse_dram: bool = False, seconds: float = 3.0):
    """The sidecar's PM loop against the fake collector; the statuses it sent and the metric lists configured."""
    configured, left = [], [busy]
    fake = types.SimpleNamespace(Collector=lambda dev: _Collector(left, refuse_dram, configured))
    monkeypatch.setitem(sys.modules, "cupti", types.SimpleNamespace(pm_sampling=fake))
    monkeypatch.setitem(sys.modules, "cupti.pm_sampling", fake)
    from decodemon.monitor.counters import libcupti as cupti_lib

    monkeypatch.setattr(cupti_lib, "load_newest", lambda: (None, ""))
    monkeypatch.setattr(cupti_lib, "check", lambda: "")
    monkeypatch.setattr(sidecar, "_primary_context", lambda dev: None)
    monkeypatch.setattr(sidecar, "BUSY_WAIT_S", 0.01)
    monkeypatch.setattr(pm_config, "_REFUSED_DRAM_BYTES", set())
    sent, stop = [], threading.Event()
    out = types.SimpleNamespace(send=sent.append)
    t = threading.Thread(target=sidecar._pm_loop, args=(out, 0, 2000, 0.05, stop), daemon=True)
    t.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not any(getattr(f, "pm", "") == "armed" for f in sent):
        time.sleep(0.01)
    stop.set()
    t.join(5)
    return sent, configured


def test_counters_held_by_another_profiler_are_named_tried_again_and_armed_when_they_free(monkeypatch):
    monkeypatch.setattr(pm_config, "counter_holders", lambda before: ["dcgm-exporter (pid 42)"])
    sent, _ = _run_pm_loop(monkeypatch, busy=3)
    busy = [f for f in sent if getattr(f, "pm_reason", "") == "hardware_busy"]
    assert [f.pm_busy_tries for f in busy] == [1, 2, 3]
    assert all(f.pm == "unavailable" and f.pm_holders == ["dcgm-exporter (pid 42)"] for f in busy)
    assert "HARDWARE_BUSY" in busy[0].pm_error
    after = [f for f in sent if f.pm_armed_after_s is not None]
    assert len(after) == 1 and after[0].pm_busy_tries == 3
    assert sent[-1].pm == "armed"


def test_pm_samples_dram_bytes_where_the_chip_takes_them_and_goes_without_where_it_refuses(monkeypatch):
    sent, configured = _run_pm_loop(monkeypatch, busy=0)
    assert "dram__bytes_read.sum" in configured[-1] and sent[-1].pm_dram_bytes is True
    sent, configured = _run_pm_loop(monkeypatch, busy=0, refuse_dram=True)
    assert configured == [list(pm_config.PM_METRICS)] and sent[-1].pm == "armed" and sent[-1].pm_dram_bytes is False
    assert pm_config.metric_sets("GH100") == [list(pm_config.PM_METRICS)]  # not asked again in this process


def test_what_holds_busy_counters_is_found_by_process_name(tmp_path):
    from decodemon.monitor.counters import pm_config

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

    from decodemon.monitor.counters import pm_config

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
