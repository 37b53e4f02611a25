"""Can a PM pump reset its counter-data image without copying all of it?

    python scripts/h200_pm_reset.py OUTDIR [--pumps 10]

Each pump resets a 14.3 MB counter-data image (1,024 samples) from an initialised template before decoding into
it: 2.1-2.8 ms of the agent thread a second on the H200 (run 42, `pm_cpu`), ~29 MB through the caches the eager
decode thread shares. A pump at 2 ms and 1 s decodes ~500 samples, so about half the image is written. This arms
PM sampling as the agent does (probes/pm_inproc.PmSampler, 2 ms) beside a GPU kept busy by a matmul thread, then
pumps once a second, alternating two resets:

- copy: np.copyto(work, template), as the agent does now;
- init: cuptiPmSamplingCounterDataImageInitialize on the work buffer in place (kineto's resetImage), no copy.

Per pump it records the reset's time, whether the buffer then equals the template byte for byte, the samples
decoded, how far into the image the decode wrote (the last byte differing from the template, against the header
plus n samples predicted from the image sizes for 512 and 1,024 samples), the gap between this pump's first sample
and the last pump's last (continuity), and the GPU-busy value of the first and last samples (the same metric
either way, if the in-place reset is a reset). Writes OUTDIR/pm_reset.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pumps", type=int, default=10)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch  # noqa: PLC0415

    from decodemon.probes import pm_inproc  # noqa: PLC0415

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    stop = threading.Event()

    def work():
        while not stop.is_set():
            for _ in range(20):
                x @ x
            torch.cuda.synchronize()

    threading.Thread(target=work, daemon=True).start()
    pm = pm_inproc.PmSampler(0, 2000)
    c, coll = pm._c, pm._coll
    template, work_buf = pm._image_pair(pm.max_samples)
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "max_samples": pm.max_samples,
                 "image_bytes": int(template.nbytes), "metrics": list(pm_inproc.PM_METRICS), "pumps": []}

    def size_for(n: int) -> int:
        from cupti.utils import metrics_to_c_array  # noqa: PLC0415

        _, names = metrics_to_c_array(list(pm_inproc.PM_METRICS))
        p = c.PmSamplingGetCounterDataSizeParams()
        p.struct_size = c.PM_SAMPLING_GET_COUNTER_DATA_SIZE_PARAMS_STRUCT_SIZE
        p.p_pm_sampling_object = coll._pm_sampling_object
        p.p_metric_names = names
        p.num_metrics = len(pm_inproc.PM_METRICS)
        p.max_samples = n
        c.pm_sampling_get_counter_data_size(p.ptr)
        return int(p.counter_data_size)

    sizes = {n: size_for(n) for n in (256, 512, 1024)}
    per = (sizes[1024] - sizes[512]) / 512
    header = sizes[512] - 512 * per
    res.update(sizes=sizes, bytes_per_sample=per, header_bytes=header)

    def init_inplace(buf) -> None:
        p = c.PmSamplingCounterDataImageInitializeParams()
        p.struct_size = c.PM_SAMPLING_COUNTER_DATA_IMAGE_INITIALIZE_PARAMS_STRUCT_SIZE
        p.p_pm_sampling_object = coll._pm_sampling_object
        p.counter_data_size = len(buf)
        p.p_counter_data = buf.ctypes.data
        c.pm_sampling_counter_data_image_initialize(p.ptr)

    def decode(buf):
        p = c.PmSamplingDecodeDataParams()
        p.struct_size = c.PM_SAMPLING_DECODE_DATA_PARAMS_STRUCT_SIZE
        p.p_pm_sampling_object = coll._pm_sampling_object
        p.p_counter_data_image = buf.ctypes.data
        p.counter_data_image_size = len(buf)
        c.pm_sampling_decode_data(p.ptr)
        info = c.PmSamplingGetCounterDataInfoParams()
        info.struct_size = c.PM_SAMPLING_GET_COUNTER_DATA_INFO_PARAMS_STRUCT_SIZE
        info.p_counter_data_image = buf.ctypes.data
        info.counter_data_image_size = len(buf)
        c.pm_sampling_get_counter_data_info(info.ptr)
        return int(info.num_completed_samples), int(p.decode_stop_reason), int(p.overflow)

    def sample(buf, i):
        info = c.PmSamplingCounterDataGetSampleInfoParams()
        info.struct_size = c.PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE
        info.p_pm_sampling_object = coll._pm_sampling_object
        info.p_counter_data_image = buf.ctypes.data
        info.counter_data_image_size = len(buf)
        info.sample_index = i
        c.pm_sampling_counter_data_get_sample_info(info.ptr)
        values = np.zeros(len(pm_inproc.PM_METRICS), dtype=np.float64)
        ev = c.ProfilerHostEvaluateToGpuValuesParams()
        ev.struct_size = c.PROFILER_HOST_EVALUATE_TO_GPU_VALUES_PARAMS_STRUCT_SIZE
        ev.p_host_object = pm._host._p_host_object
        ev.p_counter_data_image = buf.ctypes.data
        ev.counter_data_image_size = len(buf)
        ev.pp_metric_names = pm._names_ptr
        ev.num_metrics = len(pm_inproc.PM_METRICS)
        ev.p_metric_values = values.ctypes.data
        ev.range_index = i
        c.profiler_host_evaluate_to_gpu_values(ev.ptr)
        return int(info.start_timestamp), int(info.end_timestamp), [round(v, 2) for v in values.tolist()]

    last_end = None
    try:
        for k in range(a.pumps):
            time.sleep(1.0)
            mode = "copy" if k % 2 == 0 else "init"
            t0 = time.perf_counter()
            if mode == "copy":
                np.copyto(work_buf, template)
            else:
                init_inplace(work_buf)
            reset_ms = 1e3 * (time.perf_counter() - t0)
            equal = bool(np.array_equal(work_buf, template))
            n, reason, overflow = decode(work_buf)
            diff = np.flatnonzero(work_buf != template)
            row = {"k": k, "reset": mode, "reset_ms": round(reset_ms, 3), "equal_to_template_after_reset": equal,
                   "samples": n, "stop_reason": reason, "overflow": overflow,
                   "written_to_byte": int(diff[-1]) + 1 if len(diff) else 0, "bytes_differing": int(len(diff)),
                   "predicted_extent": round(header + n * per)}
            if n:
                s0, s1 = sample(work_buf, 0), sample(work_buf, n - 1)
                row.update(first_start=s0[0], last_end=s1[1], first_values=s0[2], last_values=s1[2],
                           gap_from_last_pump_us=None if last_end is None else round((s0[0] - last_end) / 1e3, 1))
                last_end = s1[1]
            # a partial copy (up to the written extent) on a scratch copy of the decoded buffer, which the next
            # pump's reset must find dirty
            scratch = work_buf.copy()
            m = min(len(template), int(row["written_to_byte"]))
            t1 = time.perf_counter()
            np.copyto(scratch[:m], template[:m])
            row["partial_copy_ms"] = round(1e3 * (time.perf_counter() - t1), 3)
            del scratch
            res["pumps"].append(row)
            print(json.dumps({k: v for k, v in row.items() if "values" not in k}), flush=True)
            (out / "pm_reset.json").write_text(json.dumps(res, indent=1))
    finally:
        stop.set()
        pm.close()
    (out / "pm_reset.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
