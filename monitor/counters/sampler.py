"""Device-wide counters from a process of decodemon's own: CUPTI PM sampling and NVML telemetry.

PM counters and NVML cover the whole GPU, so reading them does not have to happen in the decode process at all
(measured on an H200: a sampler in another process read a decode loop's counters). The monitor starts this
sidecar when it attaches (monitor/counters/sidecar.py) and reads its stdout, already framed; the sidecar exits when its
stdin closes, so it never outlives the watch. Nothing here runs in the target: its GIL, its CUPTI and its
interpreter are left to the loop.

    python -m decodemon.monitor.counters.sampler --device 0 --uuid GPU-... --pm-interval-us 2000 --nvml-hz 4
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from decodemon.monitor.counters import pm_config
from decodemon.probes.device import nvml_index
from decodemon.probes.wire import Column, NvmlSamples, PmSamples, ProbeStatus, pack



# counters held by another profiler: tried again this long after the first refusal, doubling up to the most
BUSY_WAIT_S = 0.25
BUSY_WAIT_MAX_S = 30.0


class _Out:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd = sys.stdout.buffer

    def send(self, frame) -> None:
        """Write one frame to stdout (the agent's pipe), whole."""
        with self._lock:
            self._fd.write(pack(frame))
            self._fd.flush()


def _pm_loop(out: _Out, device: int, interval_us: int, period_s: float, stop: threading.Event) -> None:
    from decodemon.monitor.counters import libcupti as cupti_lib  # noqa: PLC0415

    lib, why = cupti_lib.load_newest()  # before cupti-python (or torch) can map another libcupti of the same soname
    lib_text = lib.describe() if lib else ""
    if why:
        out.send(ProbeStatus(pm="unavailable", pm_reason="libcupti", pm_error=why, pm_where="sidecar", pm_lib=lib_text))
        return
    try:
        from cupti import pm_sampling
    except Exception as exc:
        out.send(ProbeStatus(pm="unavailable", pm_reason="not_importable", pm_error=str(exc), pm_where="sidecar",
                             pm_lib=lib_text))
        return
    t_arm, busy_tries = time.monotonic(), 0
    while True:
        coll, tried, outcome = _arm(pm_sampling, device, interval_us)
        if outcome == "denied":
            out.send(ProbeStatus(pm="unavailable", pm_reason="no_permission", pm_where="sidecar"))
            return
        if outcome != "busy":
            break
        # the counters are held (DCGM, Nsight, or an earlier session still releasing them): said, with what may
        # hold them, and tried again further and further apart while the attach lasts
        busy_tries += 1
        out.send(ProbeStatus(pm="unavailable", pm_reason="hardware_busy", pm_where="sidecar", pm_lib=lib_text,
                             pm_error=tried[-1], pm_holders=pm_config.counter_holders(False),
                             pm_busy_tries=busy_tries))
        if stop.wait(min(BUSY_WAIT_MAX_S, BUSY_WAIT_S * 2 ** min(busy_tries - 1, 8))):
            return
    mixed = cupti_lib.check()
    if coll is None:
        out.send(ProbeStatus(pm="unavailable", pm_reason="error", pm_where="sidecar", pm_lib=lib_text,
                             pm_error="; ".join(tried + ([mixed] if mixed else []))))
        return
    if busy_tries:
        out.send(ProbeStatus(pm_armed_after_s=round(time.monotonic() - t_arm, 1), pm_busy_tries=busy_tries))
    out.send(ProbeStatus(pm="armed", pm_where="sidecar", pm_interval_us=interval_us, pm_lib=lib_text,
                         pm_dram_bytes="dram__bytes_read.sum" in (getattr(coll, "_metrics", None) or [])))
    overflows = 0
    try:
        while not stop.wait(period_s):
            try:
                data = coll.decode(max_samples=4096)
            except MemoryError:  # cupti-python's word for a hardware buffer that overflowed
                overflows += 1
                out.send(ProbeStatus(pm_overflow_pumps=overflows))
                continue
            n = len(data)
            if n == 0:
                continue
            rows = [s.metric_values for s in data]
            out.send(PmSamples(
                metrics=list(data.metrics),
                start_ns=Column.of([s.start_timestamp for s in data]),
                end_ns=Column.of([s.end_timestamp for s in data]),
                values=Column.of(rows, "<f8"),
            ))
    finally:
        try:
            coll.stop()
        finally:
            coll.disable()


def _arm(pm_sampling, device: int, interval_us: int):
    """(a started Collector or None, what each way of arming said, and "armed", "denied" (no permission), "busy"
    (the counters are held) or "failed")."""
    coll, tried = None, []
    # the device's primary context made current first: a PM session armed in a process with no context failed
    # on an H200 (ERROR_UNKNOWN), and every later try then failed too (ERROR_INVALID_PARAMETER)
    for how in ("primary context", "as is", "own CUDA context", "torch context"):
        try:
            if how == "primary context":
                _primary_context(device)
            elif how == "own CUDA context":
                _make_context(device)
            elif how == "torch context":
                import torch  # noqa: PLC0415 - last resort, only where the target has torch anyway

                torch.cuda.set_device(device)
                torch.empty(1, device="cuda")
            coll = pm_sampling.Collector(device)
            coll.enable()
            _configure(coll, interval_us)
            coll.start()
            return coll, tried, "armed"
        except PermissionError:
            return None, tried, "denied"
        except Exception as exc:
            _disable(coll)
            if pm_config.is_hardware_busy(exc):
                return None, [f"{type(exc).__name__}: {exc}"], "busy"
            tried.append(f"{how}: {type(exc).__name__}: {exc}")
            coll = None
    return None, tried, "failed"


def _disable(coll) -> None:
    if coll is not None:
        try:
            coll.disable()
        except Exception:
            pass


def _configure(coll, interval_us: int) -> None:
    """PM_METRICS with the DRAM bytes read and written (bytes per token with no model facts), or without them on
    a chip that refuses them."""
    sets = pm_config.metric_sets(getattr(coll, "_chip_name", None))
    for k, metrics in enumerate(sets):
        try:
            coll.configure(metrics=metrics, hardware_buffer_size=pm_config.hw_buffer_bytes(interval_us),
                           sampling_interval=interval_us * 1000)
            return
        except Exception:
            if k + 1 == len(sets):
                raise
            pm_config.refused_dram_bytes(getattr(coll, "_chip_name", None))


def _primary_context(device: int) -> None:
    """Retain the device's primary context (the one the CUDA runtime and torch use) and make it current."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    rc = cu.cuInit(0)
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = rc or cu.cuDeviceGet(ctypes.byref(dev), device)
    rc = rc or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    rc = rc or cu.cuCtxSetCurrent(ctx)
    if rc != 0:
        raise RuntimeError(f"the primary context failed (CUDA error {rc})")


def _make_context(device: int) -> None:
    """Create and make current a CUDA context of our own (PM sampling may need one in this process)."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuInit(0)
    dev = ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(dev), device)
    ctx = ctypes.c_void_p()
    rc = cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev)
    if rc != 0:
        raise RuntimeError(f"cuCtxCreate failed ({rc})")


def _nvml_loop(out: _Out, device: int, hz: float, stop: threading.Event, target: int = 0, uuid: str = "") -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else pynvml.nvmlDeviceGetHandleByIndex(nvml_index(device))
    except Exception as exc:
        out.send(ProbeStatus(nvml="unavailable", nvml_reason="error", nvml_error=str(exc)))
        return
    out.send(ProbeStatus(nvml="armed", nvml_hz=float(hz)))
    me = {os.getpid(), os.getppid(), target}  # the target itself is no other process on the GPU
    cols: dict[str, list] = {k: [] for k in ("t", "sm", "mem", "pw", "used", "util")}
    others: set[int] = set()
    last_flush = time.monotonic()
    while not stop.wait(1.0 / hz):
        try:
            cols["t"].append(time.time_ns())
            cols["sm"].append(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
            cols["mem"].append(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
            cols["pw"].append(pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)
            cols["used"].append(pynvml.nvmlDeviceGetMemoryInfo(h).used)
            cols["util"].append(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                others = {p.pid for p in procs} - me
            except pynvml.NVMLError:
                pass
        except pynvml.NVMLError as exc:
            out.send(ProbeStatus(nvml="error", nvml_reason="error", nvml_error=str(exc)))
            for v in cols.values():
                v.clear()
            continue
        if time.monotonic() - last_flush >= 0.5:
            out.send(NvmlSamples(
                t_unix_ns=Column.of(cols["t"]), sm_clock_mhz=Column.of(cols["sm"]),
                mem_clock_mhz=Column.of(cols["mem"]), power_w=Column.of(cols["pw"], "<f8"),
                mem_used_bytes=Column.of(cols["used"]), gpu_util_pct=Column.of(cols["util"]),
                other_pids=sorted(others),
            ))
            for v in cols.values():
                v.clear()
            last_flush = time.monotonic()


def main(argv=None) -> int:
    """Run until stdin closes."""
    from decodemon.probes.held import name_this_thread  # noqa: PLC0415

    name_this_thread("dm-sidecar")  # the process's name in ps and top, not the interpreter's
    ap = argparse.ArgumentParser(prog="decodemon.monitor.counters.sampler")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--pm-interval-us", type=int, default=2000)
    ap.add_argument("--pm-period-s", type=float, default=0.25)
    ap.add_argument("--nvml-hz", type=float, default=4.0)
    ap.add_argument("--no-pm", action="store_true")
    ap.add_argument("--target-pid", type=int, default=0, help="the watched process, when it is not the parent")
    ap.add_argument("--uuid", default="", help="the GPU by its UUID (then --device is ignored)")
    a = ap.parse_args(argv)
    if a.uuid:  # CUDA numbers only this device, whatever the target's own CUDA_VISIBLE_DEVICES said
        os.environ["CUDA_VISIBLE_DEVICES"] = a.uuid
        a.device = 0
    out = _Out()
    stop = threading.Event()
    threads = [threading.Thread(target=_nvml_loop, args=(out, a.device, a.nvml_hz, stop, a.target_pid, a.uuid),
                                daemon=True)]
    if not a.no_pm:
        threads.append(threading.Thread(target=_pm_loop,
                                        args=(out, a.device, a.pm_interval_us, a.pm_period_s, stop), daemon=True))
    for t in threads:
        t.start()
    try:
        sys.stdin.buffer.read()  # lifeline: EOF when the agent goes away
    except (OSError, KeyboardInterrupt):
        pass
    stop.set()
    for t in threads:
        t.join(timeout=2.0)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
