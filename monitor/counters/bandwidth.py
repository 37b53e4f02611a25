"""The device's copy bandwidth for the floor: measured outside the target, once per device and driver.

The monitor never touches CUDA itself: it asks `python -m decodemon.monitor.counters.copy_bandwidth` (its own process),
which answers from its cache or measures 1 GiB device-to-device copies. A recording keeps the figure in its
header's note, so a replay prices the floor as the live attach did.
"""

from __future__ import annotations

import json
import subprocess
import sys

TIMEOUT_S = 30.0
CACHE_NOTE = "decodemon: the cache "


def with_copy_gbs(gpu):
    """`gpu` (wire.GpuInfo) with decodemon's measured copy bandwidth from the cache, where one was measured for this
    device and driver: every live source's hello carries it, so the app, the exporter, `attach --json`, `record`
    and the sweep price one floor."""
    import msgspec

    if gpu.copy_gbs:
        return gpu
    gbs = measured_copy_gbs(gpu)
    return msgspec.structs.replace(gpu, copy_gbs=float(gbs)) if gbs else gpu


def measured_copy_gbs(gpu) -> float | None:
    """GB/s (read + write) for a `wire.GpuInfo` from the cache, or None when it was never measured here.

    Never measured at an attach: copies on the GPU the watched loop runs on would slow the loop (a first attach's
    one-token stall) and read low beside it (a busy loop's 60% of the peak). `decodemon run` measures before its
    program starts, while the GPU is still idle (measure_copy_gbs)."""
    if gpu is None or not gpu.uuid:
        return None
    from decodemon.monitor.counters.copy_bandwidth import cached_gbs

    return cached_gbs(gpu.uuid, gpu.driver_version or "?")


def measure_copy_gbs(gpu) -> float | None:
    """Measure (or read from the cache) the copy bandwidth of `gpu` in a process of its own: only where nothing
    decodes on it yet."""
    from decodemon.probes import children

    uuid = children.gpu_uuid(gpu.uuid) if gpu is not None else ""
    if not uuid:
        return None
    cmd = children.python_argv("decodemon.monitor.counters.copy_bandwidth", "--device", str(int(gpu.index)), "--uuid", uuid,
                               "--driver", children.driver_version(gpu.driver_version), "--json")
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=children.CWD)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in r.stderr.splitlines():
        if line.startswith(CACHE_NOTE):  # a cache it would not read: said here, where stderr is the user's
            print(line, file=sys.stderr)
    try:
        return float(json.loads(r.stdout)["copy_gbs"]) if r.returncode == 0 else None
    except (ValueError, KeyError, TypeError):
        return None


def measure_before_start() -> float | None:
    """`decodemon run`'s first step on a GPU machine: the copy bandwidth of the device its program will use,
    measured (or read from the cache) now, while nothing of the program runs on it yet. None without a GPU."""
    from pathlib import Path

    if not Path("/dev/nvidia0").exists():
        return None
    try:
        import pynvml

        from decodemon.probes.device import cuda_device_index, nvml_index
        from decodemon.probes.wire import GpuInfo

        pynvml.nvmlInit()
        idx = cuda_device_index()
        h = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(idx))
        gpu = GpuInfo(index=idx, name="", sm_count=0, mem_bandwidth_gbs=0.0, uuid=str(pynvml.nvmlDeviceGetUUID(h)),
                      driver_version=str(pynvml.nvmlSystemGetDriverVersion()))
    except Exception:  # no NVML here: the attach prices the floor on NVML's peak, and says so
        return None
    return measure_copy_gbs(gpu)


def header_note(copy_gbs: float | None) -> str:
    """What a recording's header keeps of it."""
    return json.dumps({"copy_gbs": copy_gbs}) if copy_gbs else ""


def from_note(note: str) -> float | None:
    """The figure a recording's header kept, if any."""
    try:
        v = json.loads(note).get("copy_gbs") if note else None
        return float(v) if v else None
    except (ValueError, AttributeError, TypeError):
        return None
