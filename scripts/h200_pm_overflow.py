"""Does PM's hardware buffer hold the samples between pumps, at the intervals a user may set?

    bash scripts/h200.sh scripts/h200_pm_overflow.py [--pump-s 6] [--stall-s 2]

One eager demo model decodes in the main thread (Qwen3-0.6B shape, bf16, batch 1, `.item()` every token). A
second thread, standing in for the agent, arms PM as the agent does (`PmSampler`) with one hardware buffer size
and sampling interval per case, waits `--stall-s` (the agent's first pump waits for the first traced window), then
pumps every 0.5 s as the agent does for `--pump-s`, each pump decoding into the session's counter-data image
(`pm.max_samples` samples at most). Per case: set_config's ms (the arm), samples decoded against the samples
made since the arm, pumps whose decode reported a hardware-buffer overflow, pumps that stopped at a full
counter-data image, and the gap between the newest decoded sample and the pump
(how far the pumps fall behind). Writes OUTDIR/pm_overflow.json and prints it. `--sized`: the buffer and the
image as PmSampler sizes them for each interval. (The fourteenth session's first run also wrote a
`span_samples` from the first sample's start timestamp, which is 0 on the H200: meaningless, since removed.)
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _child import eager_model, start  # noqa: E402

CASES = [  # (hardware buffer MB, interval us, stall s or None for --stall-s)
    (256, 2000, None), (64, 2000, None), (32, 2000, None), (16, 2000, None),
    (64, 2000, 10.0), (32, 2000, 10.0),
    (64, 500, None), (32, 500, None),
    (256, 100, None), (64, 100, None),
]
SIZED = [  # --sized: the buffer and the image as PmSampler sizes them for the interval (None)
    (None, 2000, None), (None, 2000, 10.0), (None, 500, None), (None, 100, None),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pump-s", type=float, default=6.0)
    ap.add_argument("--stall-s", type=float, default=2.0)
    ap.add_argument("--sized", action="store_true", help="the buffer and the counter-data image as PmSampler sizes "
                    "them for each interval (pm_inproc.hw_buffer_bytes, max_samples_for), not the fixed cases")
    a = ap.parse_args()
    out, header = start(a, "h200_pm_overflow.py")
    from decodemon.probes import pm_inproc as P

    model = eager_model()
    st = {"stop": False}
    results = []

    def span(pm, image, n):
        c = pm._c
        info = c.PmSamplingCounterDataGetSampleInfoParams()
        info.struct_size = c.PM_SAMPLING_COUNTER_DATA_GET_SAMPLE_INFO_PARAMS_STRUCT_SIZE
        info.p_pm_sampling_object = pm._coll._pm_sampling_object
        info.p_counter_data_image = image.ctypes.data
        info.counter_data_image_size = len(image)
        out = []
        for i in (0, n - 1):
            info.sample_index = i
            c.pm_sampling_counter_data_get_sample_info(info.ptr)
            out.append((info.start_timestamp, info.end_timestamp))
        return out

    def case(mb, interval_us, stall_s):
        from cupti import cupti

        t0 = time.perf_counter()
        pm = P.PmSampler(0, interval_us, buffer_bytes=mb << 20 if mb else None)
        arm_ms = (time.perf_counter() - t0) * 1e3
        t_armed = time.perf_counter()
        time.sleep(stall_s)
        pumps, total = [], 0
        end = time.perf_counter() + a.pump_s
        while time.perf_counter() < end:
            pm._free_s = 0.0
            tp = time.perf_counter()
            raw = pm._decode_image(pm.max_samples)
            n = raw[1] if raw else 0
            row = {"t_s": round(tp - t_armed, 3), "n": n, "stop": pm.last_stop_reason,
                   "decode_ms": round((time.perf_counter() - tp) * 1e3, 2)}
            if n:
                (_, _), (_, e1) = span(pm, raw[0], n)
                total += n
                row["now_minus_newest_ms"] = round((cupti.get_timestamp() - e1) / 1e6, 1)
            pumps.append(row)
            time.sleep(0.5)
        pm.close()
        elapsed = time.perf_counter() - t_armed
        res = {"buffer_mb": mb or P.hw_buffer_bytes(interval_us) >> 20, "interval_us": interval_us,
               "stall_s": stall_s, "arm_ms": round(arm_ms, 1), "max_samples": pm.max_samples, "decoded": total,
               "made_since_arm": round(elapsed * 1e6 / interval_us),
               "overflow_pumps": pm.overflows, "full_pumps": pm.full_pumps, "pumps": pumps}
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k != "pumps"}), flush=True)

    def driver():
        try:
            time.sleep(3.0)
            first = P.PmSampler(0, 2000)  # the process's first PM session apart (it changes the speed for good)
            time.sleep(1.0)
            first.close()
            for mb, iv, stall in (SIZED if a.sized else CASES):
                try:
                    case(mb, iv, a.stall_s if stall is None else stall)
                except Exception as exc:
                    results.append({"buffer_mb": mb, "interval_us": iv, "error": f"{type(exc).__name__}: {exc}"})
                    print(json.dumps(results[-1]), flush=True)
                time.sleep(0.3)
        finally:
            st["stop"] = True

    threading.Thread(target=driver, daemon=True).start()
    tokens = 0
    while not st["stop"]:
        int(model.step().item())
        tokens += 1
        if tokens % 4000 == 0:
            model.reset()
    doc = {**header, "pump_s": a.pump_s, "cases": results}
    (out / "pm_overflow.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
