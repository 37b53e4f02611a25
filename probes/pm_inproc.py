"""PM sampling from inside the decode process, in the agent thread.

On the H200 a second process could not enable PM sampling (`ERROR_UNKNOWN` without a context,
`ERROR_INVALID_PARAMETER` with one), and evaluating a counter image shipped to the sidecar failed with
`ERROR_INVALID_PARAMETER` too, so the counters are armed, decoded and evaluated here, in the agent thread, a few
times a second (never on the decode thread), under a time budget. Set-up and release: pm_config.py.
"""

from __future__ import annotations

import math
import time

import numpy as np

from decodemon.probes import held, pm_config
from decodemon.probes.pm_config import (HW_BUFFER_BYTES, MAX_REGULAR_PER_PUMP, MAX_SAMPLES,  # noqa: F401
                                        PUMP_PERIOD_S, configure, hw_buffer_bytes, max_samples_for)


# the libcupti calls made keeping the GIL (cupti-python name: C name): each returns in microseconds; decode_data,
# milliseconds per pump, still lets the GIL go
HELD_CALLS = {"pm_sampling_counter_data_get_sample_info": "cuptiPmSamplingCounterDataGetSampleInfo",
              "profiler_host_evaluate_to_gpu_values": "cuptiProfilerHostEvaluateToGpuValues",
              "pm_sampling_get_counter_data_info": "cuptiPmSamplingGetCounterDataInfo"}
# the longest run of held calls before the GIL is given up once (a decode thread waiting for it waits that long)
HELD_SLICE_S = 0.001


def span_indices(n: int, last_start: int, last_end: int, spans, margin: int = 2) -> set[int]:
    """Indices of the samples (`n` of them, one interval each, the last one from `last_start` to `last_end`) that
    overlap any of `spans`, with `margin` samples either side for an interval that drifts. Counted back from the
    last sample: the first sample of a session starts at 0 on the H200."""
    step = last_end - last_start
    if n <= 0 or step <= 0:
        return set()
    first = last_end - n * step
    out: set[int] = set()
    for a, b in spans:
        if b < first or a > last_end:
            continue
        lo = max(0, int((a - first) // step) - margin)
        hi = min(n - 1, int((b - first) // step) + margin)
        out.update(range(lo, hi + 1))
    return out


class PmSampler:
    """A running PM sampling session on one device."""

    overflows = 0  # pumps whose decode said the hardware buffer had overflowed (KEEP_OLDEST: newer records lost)
    full_pumps = 0  # pumps that filled the counter-data image before the hardware buffer's end (a backlog left)
    max_samples = MAX_SAMPLES  # this session's (max_samples_for its interval)
    last_stop_reason = None  # the last decode's stop reason (cupti's PmSamplingDecodeStopReason, as an int)
    _held: dict = {}  # HELD_CALLS found in libcupti (held.cupti_functions), made at the arm
    handbacks = 0  # the GIL given up between held calls (held.Slicer), all pumps

    def __init__(self, device: int, interval_us: int, buffer_bytes: int | None = None,
                 pump_s: float = PUMP_PERIOD_S) -> None:
        self.armed_ns = time.time_ns()  # the arm's wall time and CPU time end up in arm_ns / arm_cpu_ns
        c0 = time.thread_time_ns()
        from cupti import cupti, pm_sampling  # noqa: PLC0415 - only when a monitor attaches

        self._c = cupti
        self.device, self.interval_us = device, interval_us
        self._coll = pm_sampling.Collector(device)
        self._coll.enable()
        try:
            self.metrics = self._configure(buffer_bytes or hw_buffer_bytes(interval_us))
            self._coll.start()
        except Exception:
            pm_config.release(self._coll, cupti)
            raise
        self.chip = self._coll._chip_name
        # one evaluator for the whole session, not one per decode; and one per process, not one per attach
        self._host = pm_config.evaluator(self.chip)
        # A counter-data image, allocated and initialised once; each pump decodes into a copy of it. Made fresh
        # every pump (cupti-python's Collector.decode does), it took 7.9 ms of a 12.9 ms pump on the H200.
        self._templates: dict = {}
        self._dirty: dict = {}  # per image size: how far into the work buffer the last decode wrote (_decode_image)
        self._layouts: dict = {}  # per image size: (header bytes, bytes per sample), or None (image_layout)
        # ... and made here, at the arm, not in the first pump. The agent's first pump waits for the first traced
        # window to be collected, so making the image there put 12-22 ms of agent CPU (against 2.5-3.6 ms for
        # later pumps) in the tokens just after the traced one. The arm is a one-off at the attach, half a second
        # before any window. The work buffer is written once here too, so its pages are not first touched in a pump.
        self.pump_s = pump_s
        self.max_samples = max_samples_for(interval_us, pump_s)
        from cupti.utils import metrics_to_c_array  # noqa: PLC0415

        self._names_keep, self._names_ptr = metrics_to_c_array(list(self.metrics))
        self._image_pair(self.max_samples)
        # the short per-sample calls, made keeping the GIL (held.py); the decode itself, milliseconds, lets it go
        self._held = held.cupti_functions(HELD_CALLS)
        self.stride = 4
        self.dense_evaluated = 0  # samples evaluated for traced windows' spans, beyond the stride
        self.eval_s = 0.0
        self.decode_s = 0.0  # the last pump: decode, counter-data image included
        self.image_s = 0.0  # the last pump: resetting the counter-data image
        # the agent thread's CPU time in a pump outside libcupti's GIL-free calls: the most the pump can have taken
        # from a decode thread that needs the GIL (the counter-data image copy, image_s, is in it; numpy copies
        # without the GIL, so the true figure is lower). The first pump apart: it decodes all the samples since
        # the arm, the first window's dense ones with them.
        self.cpu_s = 0.0
        self.cpu_first_s = 0.0
        self.cpu_later_s = 0.0
        self.pumps = 0
        self.arm_ns = time.time_ns() - self.armed_ns
        self.arm_cpu_ns = time.thread_time_ns() - c0
        self.logged = False  # the agent's event log has this arm

    def _configure(self, buffer_bytes: int) -> list[str]:
        """Configure the best metric list the chip takes (pm_config.metric_sets); the list configured."""
        sets = pm_config.metric_sets(self._coll._chip_name)
        for i, metrics in enumerate(sets):
            try:
                configure(self._coll, self.interval_us, buffer_bytes, metrics)
            except Exception as exc:
                if i == len(sets) - 1 or pm_config.is_hardware_busy(exc) or isinstance(exc, PermissionError):
                    raise
                continue
            if i:
                pm_config.refused_dram_bytes(self._coll._chip_name)
            return list(metrics)
        raise RuntimeError("no PM metric list to configure")

    @property
    def dram_bytes(self) -> bool:
        """Does this session sample DRAM bytes read and written?"""
        return all(m in self.metrics for m in pm_config.DRAM_BYTES_METRICS)

    def _call(self, name: str, params) -> None:
        """One libcupti call on a params struct.

        Through cupti-python, whose wrappers release the GIL for the C call: its CPU time is counted apart, as it
        is not taken from a decode thread that needs the GIL. But each release lets that thread run, and taking the GIL back from it costs it a voluntary switch, so the
        short calls in HELD_CALLS keep the GIL instead (held.py) and count as the pump's own CPU."""
        fn = self._held.get(name) if held.ENABLED else None
        if fn is not None:
            held.call(fn, name, params.ptr)
            return
        t0 = time.thread_time()
        getattr(self._c, name)(params.ptr)
        self._free_s += time.thread_time() - t0

    def samples(self, max_samples: int | None = None, budget_s: float = 0.0015, dense_spans=()):
        """Decode and evaluate completed samples, within a time budget: (start ns, end ns, rows, extra) or None;
        `extra[i]` is True for a sample evaluated only because it lies in one of `dense_spans`.

        `dense_spans`: (start, end) spans in CUPTI's clock (a traced window's tokens) whose samples are all
        evaluated, whatever the stride, so the monitor can read the counters over exactly the traced tokens and
        set them beside the window's own kernel records. They are found from the last sample's
        timestamps (samples come at a fixed interval), two samples of margin each side, outside the budget.

        The GIL is what the decode thread needs: on the H200 an eager loop ran at 40.9 ms/token instead of ~20
        while every 2 ms sample was evaluated through `Collector.decode()` (a fresh profiler host per call,
        every sample). Here one host and one set of call parameters are kept, and only every `stride`-th
        sample is evaluated; the stride doubles whenever a pump overruns its budget and halves when it
        uses under a quarter of it; and never more than MAX_REGULAR_PER_PUMP regular samples in one pump. The
        averages the diagnosis reads need only a few samples per second.
        Each take-back of the GIL from a decode thread running Python is a voluntary switch of that thread, so
        the per-sample calls keep the GIL (HELD_CALLS, held.py) and it is given up once per HELD_SLICE_S of them,
        not in every call (cupti-python's wrappers give it up in each: ~2 switches per sample).
        MAX_REGULAR_PER_PUMP: on the H200 the stride of a 4 s attach stayed at 8-32, so a pump of 500 samples
        evaluated up to ~60; 16 a second keep the monitor's rolling averages (80 samples in 5 s).
        """
        t_dec = time.perf_counter()
        t_pump = time.thread_time()
        self._free_s = 0.0
        raw = self._decode_image(max_samples or self.max_samples)
        self.decode_s = time.perf_counter() - t_dec
        if raw is None:
            self._account(t_pump)
            return None
        image, n = raw
        t0 = time.perf_counter()
        c, coll = self._c, self._coll
        info = c.PmSamplingCounterDataGetSampleInfoParams()
        info.struct_size = c.PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE
        info.p_pm_sampling_object = coll._pm_sampling_object
        info.p_counter_data_image = image.ctypes.data
        info.counter_data_image_size = len(image)
        values = np.zeros(len(self.metrics), dtype=np.float64)
        ev = c.ProfilerHostEvaluateToGpuValuesParams()
        ev.struct_size = c.PROFILER_HOST_EVALUATE_TO_GPU_VALUES_PARAMS_STRUCT_SIZE
        ev.p_host_object = self._host._p_host_object
        ev.p_counter_data_image = image.ctypes.data
        ev.counter_data_image_size = len(image)
        ev.pp_metric_names = self._names_ptr
        ev.num_metrics = len(self.metrics)
        ev.p_metric_values = values.ctypes.data
        starts, ends, rows, extra = [], [], [], []
        dense: set[int] = set()
        if dense_spans and n:
            info.sample_index = n - 1
            self._call("pm_sampling_counter_data_get_sample_info", info)
            dense = span_indices(n, info.start_timestamp, info.end_timestamp, dense_spans)
        t_dense = 0.0
        step = max(self.stride, math.ceil(n / MAX_REGULAR_PER_PUMP))  # the pump's stride, capped in samples
        slicer = held.Slicer(HELD_SLICE_S)
        for i in sorted(set(range(0, n, step)) | dense):
            slicer.tick()  # the GIL given up once per HELD_SLICE_S of held calls, not at every call
            t_i = time.perf_counter()
            info.sample_index = i
            self._call("pm_sampling_counter_data_get_sample_info", info)
            ev.range_index = i
            self._call("profiler_host_evaluate_to_gpu_values", ev)
            rows.append(values.tolist())
            starts.append(info.start_timestamp)
            ends.append(info.end_timestamp)
            extra.append(bool(i % step))
            if extra[-1]:
                t_dense += time.perf_counter() - t_i
        self.dense_evaluated += sum(extra)
        self.handbacks += slicer.handbacks
        spent = time.perf_counter() - t0 - t_dense  # the stride follows the regular samples' cost only
        self.eval_s += spent
        if spent > budget_s and self.stride < 256:
            self.stride *= 2
        elif spent < budget_s / 4 and self.stride > 1:
            self.stride //= 2
        self._account(t_pump)
        return starts, ends, rows, extra

    def _account(self, t_pump: float) -> None:
        # this thread's CPU time outside the GIL-free calls (waiting for the GIL, e.g. after each sleep(0), takes
        # no CPU time and is not counted)
        self.cpu_s = max(0.0, time.thread_time() - t_pump - self._free_s)
        if self.pumps:
            self.cpu_later_s += self.cpu_s
        else:
            self.cpu_first_s = self.cpu_s
        self.pumps += 1

    def _decode_image(self, max_samples: int):
        c, coll = self._c, self._coll
        t0 = time.perf_counter()
        template, image = self._image_pair(max_samples)
        # Reset from the template into a buffer kept for the purpose, as far as the last decode wrote into it (the
        # rest still is the template's). The whole 14.3 MiB image took 2.1-2.8 ms of the agent thread's CPU per
        # pump on the H200; a decode writes exactly its header and the samples it decoded, 7.2-7.3 MiB at 2 ms and
        # 1 s pumps, and copying that much back took 0.9-1.6 ms.
        dirty = self._dirty.get(max_samples, image.nbytes)
        np.copyto(image[:dirty], template[:dirty])
        self._dirty[max_samples] = image.nbytes  # until this decode says how far it wrote
        self.image_s = time.perf_counter() - t0
        self.image_bytes = dirty  # what that copy moved through the caches, this pump
        p = c.PmSamplingDecodeDataParams()
        p.struct_size = c.PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE
        p.p_pm_sampling_object = coll._pm_sampling_object
        p.p_counter_data_image = image.ctypes.data
        p.counter_data_image_size = len(image)
        self._call("pm_sampling_decode_data", p)
        self.last_stop_reason = int(p.decode_stop_reason)
        if p.overflow:
            self.overflows += 1
        if self.last_stop_reason == int(c.PmSamplingDecodeStopReason.COUNTER_DATA_FULL):
            self.full_pumps += 1
        info = c.PmSamplingGetCounterDataInfoParams()
        info.struct_size = c.PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE
        info.p_counter_data_image = image.ctypes.data
        info.counter_data_image_size = len(image)
        self._call("pm_sampling_get_counter_data_info", info)
        n = info.num_completed_samples
        layout = self._layouts.get(max_samples)
        if layout is not None:  # the header and one sample past the populated ones (a sample in progress)
            header, per = layout
            k = max(int(n), int(getattr(info, "num_populated_samples", 0) or 0)) + 1
            self._dirty[max_samples] = min(image.nbytes, header + k * per)
        return (image, n) if n else None

    def _image_pair(self, max_samples: int):
        """The initialised counter-data image for `max_samples` and the work buffer a pump decodes into, made once
        (the buffer a copy of the image, so its pages are touched when it is made)."""
        pair = self._templates.get(max_samples)
        if pair is None:
            template = self._coll._create_counter_data_image(max_samples)
            pair = self._templates[max_samples] = (template, template.copy())
            self._dirty[max_samples] = 0  # the work buffer is the template's copy
            self._layouts[max_samples] = self.image_layout(max_samples, template.nbytes)
        return pair

    def _image_size(self, samples: int) -> int:
        c = self._c
        p = c.PmSamplingGetCounterDataSizeParams()
        p.struct_size = c.PM_SAMPLING_GET_COUNTER_DATA_SIZE_PARAMS_STRUCT_SIZE
        p.p_pm_sampling_object = self._coll._pm_sampling_object
        p.p_metric_names = self._names_ptr
        p.num_metrics = len(self.metrics)
        p.max_samples = samples
        c.pm_sampling_get_counter_data_size(p.ptr)
        return int(p.counter_data_size)

    def image_layout(self, max_samples: int, nbytes: int) -> tuple[int, int] | None:
        """(header bytes, bytes per sample) of a counter-data image, from the sizes CUPTI gives for `max_samples`,
        half and a quarter as many: a header, then the samples in order. On the H200, 2,540 bytes and 14,617 a
        sample for the agent's metrics, and each decode wrote exactly to header + samples x 14,617. None, and
        every reset copies the whole image, unless the three sizes lie on
        one line that gives this image's size."""
        if max_samples < 4:
            return None
        try:
            n1, n2, n3 = max_samples, max_samples // 2, max_samples // 4
            s1, s2, s3 = self._image_size(n1), self._image_size(n2), self._image_size(n3)
        except Exception:
            return None
        per, rem = divmod(s1 - s2, n1 - n2)
        header = s1 - n1 * per
        if rem or per <= 0 or header < 0 or s2 - s3 != per * (n2 - n3) or s1 != nbytes:
            return None
        return header, per

    def close(self) -> list[str]:
        """Stop sampling and release the session completely (pm_config.release); the steps that failed. The
        evaluator is the process's and stays."""
        return pm_config.release(self._coll, self._c)
