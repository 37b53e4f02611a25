"""PM sampling's set-up and release: which metrics, how big a buffer, the process's evaluator and configuration
images, and a release that leaves the counters free for the next session.
"""

from __future__ import annotations

import math

from decodemon.probes.sidecar import PM_METRICS

# DRAM bytes read and written, for bytes per token measured by the hardware (no model facts needed). On GH100
# they configure together with PM_METRICS; a chip that refuses them is sampled without them.
DRAM_BYTES_METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum"]
_REFUSED_DRAM_BYTES: set = set()  # chips that refused DRAM_BYTES_METRICS in this process
HARDWARE_BUSY = 26  # CUPTI_ERROR_HARDWARE_BUSY: another profiler (or a session still releasing them) holds the counters

MAX_REGULAR_PER_PUMP = 16  # see PmSampler.samples
PUMP_PERIOD_S = 1.0  # how often the agent pumps by default (wire.Attach.pm_pump_s)
MAX_SAMPLES = 1024  # the fewest samples one pump's counter-data image holds (250 are made per pump at 2 ms)


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


def max_samples_for(interval_us: int, pump_s: float = PUMP_PERIOD_S) -> int:
    """Samples one pump decodes at most: two pump periods (`pump_s`) worth at `interval_us`, and at least
    MAX_SAMPLES.

    A decode that fills the counter-data image loses the rest of the hardware buffer. On the H200, after a 10 s
    stall at 2 ms the first pump's 1,024 samples ended 7,988 ms before it and the next pump's newest 23 ms before
    it: ~4,000 samples gone, no overflow reported. With a fixed 1,024, every pump at 500 us filled its image."""
    return max(MAX_SAMPLES, math.ceil(2 * pump_s * 1e6 / interval_us))


def hw_buffer_bytes(interval_us: int) -> int:
    """PM's hardware buffer for `interval_us`: 64 MB at 2 ms, scaled with the sample rate, within 32..256 MB.

    It must hold the samples made between two pumps. On the H200 32 and 64 MB held a 10 s stall at 2 ms with no
    overflow (at most 6.7 KB a sample), and 64 MB at 100 us overflowed within 2 s. set_config allocates it, and
    its time grows with it: 100-131 ms at 32-64 MB against 220-229 ms at 256 MB."""
    mb = min(256, max(32, round(64 * 2000 / interval_us)))
    return mb << 20


HW_BUFFER_BYTES = hw_buffer_bytes(2000)

# Made once per process, not once per attach: the metrics evaluator (a host-side ProfilerHost) and the PM
# configuration image per metric list. Both are host-side (libnvperf_host) and depend only on the chip and the
# metrics. On the H200 arms took 221 ms instead of 234, and every re-armed session's samples evaluated to finite
# values, after traced windows' CUPTI finalizes too.
EVALUATORS: dict = {}
CONFIG_IMAGES: dict = {}


def evaluator(chip: str):
    """The process's initialised PM metrics evaluator for `chip` (made on first use, kept)."""
    host = EVALUATORS.get(chip)
    if host is None:
        from cupti import profiler_host  # noqa: PLC0415

        host = profiler_host.ProfilerHost(chip, profiler_host.ProfilerType.PM_SAMPLING)
        host.initialize()
        EVALUATORS[chip] = host
    return host


def config_image(chip: str, metrics: tuple[str, ...]):
    """The PM configuration image for `metrics` on `chip` (made on first use with a host of its own, as
    cupti-python's Collector.configure makes it, then kept)."""
    key = (chip, metrics)
    image = CONFIG_IMAGES.get(key)
    if image is None:
        from cupti import profiler_host  # noqa: PLC0415

        host = profiler_host.ProfilerHost(chip, profiler_host.ProfilerType.PM_SAMPLING)
        host.initialize()
        try:
            image = host.create_config_image(metrics=list(metrics))
        finally:
            host.deinitialize()
        CONFIG_IMAGES[key] = image
    return image


def configure(coll, interval_us: int, buffer_bytes: int = HW_BUFFER_BYTES, metrics=PM_METRICS) -> None:
    """Collector.configure() for `metrics`, with the process's configuration image (config_image) instead of a
    new one: cupti-python's PmSamplingSetConfigParams filled and set on an enabled `coll`."""
    from cupti import cupti as c  # noqa: PLC0415

    image = config_image(coll._chip_name, tuple(metrics))
    p = c.PmSamplingSetConfigParams()
    p.struct_size = c.PM_SAMPLING_SET_CONFIG_PARAMS_STRUCT_SIZE
    p.p_pm_sampling_object = coll._pm_sampling_object
    p.config_size = len(image)
    p.p_config = image.ctypes.data
    p.hardware_buffer_size = buffer_bytes
    p.sampling_interval = interval_us * 1000
    p.trigger_mode = c.PmSamplingTriggerMode.GPU_TIME_INTERVAL
    p.hw_buffer_append_mode = c.PmSamplingHardwareBufferAppendMode.KEEP_OLDEST
    c.pm_sampling_set_config(p.ptr)
    coll._metrics = list(metrics)  # what Collector.start/stop and the counter-data image read
    coll._config = image


def release(coll, c) -> list[str]:
    """Stop sampling, disable the PM sampling object and deinitialize the profiler, each step tried whatever the
    one before did; the steps that failed, as text (CUPTI may already be gone).

    cupti-python's Collector.disable() runs its finalizer once: cuptiPmSamplingDisable, then
    cuptiProfilerDeInitialize. When the disable raises (a CUPTI finalize after a traced window had taken the
    session down), the deinitialize never runs, and a later session in the same process can find the counters
    still held (ERROR_HARDWARE_BUSY). So the deinitialize is made here when the disable failed."""
    failed = []
    try:
        coll.stop()
    except Exception as exc:
        failed.append(f"stop: {type(exc).__name__}: {exc}")
    obj = getattr(coll, "_pm_sampling_object", None)
    try:
        coll.disable()
        return failed
    except Exception as exc:
        failed.append(f"disable: {type(exc).__name__}: {exc}")
    for step in ("pm_sampling_disable", "profiler_deinitialize"):
        if step == "pm_sampling_disable" and obj is None:
            continue
        try:
            if step == "pm_sampling_disable":
                p = c.PmSamplingDisableParams()
                p.struct_size = c.PM_SAMPLING_DISABLE_PARAMS_STRUCT_SIZE
                p.p_pm_sampling_object = obj
            else:
                p = c.ProfilerDeInitializeParams()
                p.struct_size = c.PROFILER_DEINITIALIZE_PARAMS_STRUCT_SIZE
            getattr(c, step)(p.ptr)
        except Exception as exc:
            failed.append(f"{step}: {type(exc).__name__}: {exc}")
    coll._pm_sampling_object = None
    coll._finalizer = None
    return failed
