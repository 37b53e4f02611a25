"""PM sampling's set-up, for the sidecar that samples it in decodemon's own process: which metrics, how big a
buffer, and what holds the counters when they are busy.
"""

from __future__ import annotations

# GPU busy is the GR engine's *compute* activity: on an H200 gr__compute_cycles_active read 19.3% of an eager step whose traced kernels cover 17.5%, and 98.8% of a graphed
# one (kernels ~100%), while gr__cycles_active also counts each launch's front-end work (~28% eager). Recordings
# made before carry gr__cycles_active.avg; the monitor reads either.
PM_METRICS = [
    "gr__compute_cycles_active.avg",
    "gr__cycles_elapsed.max",
    "sm__cycles_active.avg",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "gpu__time_duration.sum",
]

# DRAM bytes read and written, for bytes per token measured by the hardware (no model facts needed). On GH100
# they configure together with PM_METRICS; a chip that refuses them is sampled without them.
DRAM_BYTES_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
_REFUSED_DRAM_BYTES: set = set()  # chips that refused DRAM_BYTES_METRICS in this process
HARDWARE_BUSY = 26  # CUPTI_ERROR_HARDWARE_BUSY: another profiler (or a session still releasing them) holds the counters

def metric_sets(chip: str | None) -> list[list[str]]:
    """The metric lists to try for `chip`, best first: with the DRAM bytes, then without them."""
    if chip in _REFUSED_DRAM_BYTES:
        return [list(PM_METRICS)]
    return [list(PM_METRICS) + DRAM_BYTES_METRICS, list(PM_METRICS)]


def refused_dram_bytes(chip: str | None) -> None:
    """`chip` would not configure DRAM_BYTES_METRICS: later arms in this process go without them at once."""
    _REFUSED_DRAM_BYTES.add(chip)


# processes that take the GPU's performance counters: DCGM's host engine and exporter, Nsight Compute and Systems
COUNTER_TAKERS = ("nv-hostengine", "dcgm-exporter", "dcgmi", "ncu", "nsys", "nsight-sys", "ncu-ui", "nvidia-dcgm")


def counter_holders(armed_here_before: bool, proc: str = "/proc") -> list[str]:
    """What may hold the PM counters when they are busy: the counter-taking profilers running on this host (by
    their process name, as "name (pid N)"), and "this process" when an earlier attach here armed PM. Processes of
    other users or containers that /proc does not show are not seen."""
    import os

    found = []
    try:
        pids = sorted((int(d) for d in os.listdir(proc) if d.isdigit()))
    except OSError:
        pids = []
    for pid in pids:
        try:
            with open(f"{proc}/{pid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name in COUNTER_TAKERS:
            found.append(f"{name} (pid {pid})")
    if armed_here_before:
        found.append("this process (an earlier attach's PM session still releasing them)")
    return found


def is_hardware_busy(exc: BaseException) -> bool:
    """Did CUPTI refuse because the counters are held (ERROR_HARDWARE_BUSY)?"""
    status = getattr(exc, "status", None)
    try:
        if status is not None and int(status) == HARDWARE_BUSY:
            return True
    except (TypeError, ValueError):
        pass
    return "HARDWARE_BUSY" in str(exc)


def hw_buffer_bytes(interval_us: int) -> int:
    """PM's hardware buffer for `interval_us`: 64 MB at 2 ms, scaled with the sample rate, within 32..256 MB.

    It must hold the samples made between two pumps. On the H200 32 and 64 MB held a 10 s stall at 2 ms with no
    overflow (at most 6.7 KB a sample), and 64 MB at 100 us overflowed within 2 s. set_config allocates it, and
    its time grows with it: 100-131 ms at 32-64 MB against 220-229 ms at 256 MB."""
    mb = min(256, max(32, round(64 * 2000 / interval_us)))
    return mb << 20
