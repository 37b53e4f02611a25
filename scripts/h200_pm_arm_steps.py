"""Each step of a PM arm, timed, with a 256 MB and a 32 MB hardware buffer.

    bash scripts/h200.sh scripts/h200_pm_arm_steps.py > steps.json

Five arms in one process with a CUDA context and nothing decoding (buffers 256, 256, 32, 256, 32 MB; 2 ms
interval): Collector.enable, the configuration image (decodemon's per-process one, probes/pm_inproc.py),
pm_sampling_set_config, start, the evaluator, the counter-data image and its copy, then stop and disable, each in
ms. Prints one JSON list. The thirteenth session ran it (docs/h200/pm_arm_steps_session13_2026-11-30.json, the same
steps written as one block).
"""

import json
import time

import torch
from cupti import pm_sampling

from decodemon.probes import pm_inproc as P
from decodemon.probes.sidecar import PM_METRICS


def main() -> None:
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    out = []
    T = time.perf_counter
    for buf in (256, 256, 32, 256, 32):
        r = {"buf_mb": buf}
        t = T()
        co = pm_sampling.Collector(0)
        co.enable()
        r["enable"] = T() - t
        t = T()
        P._config_image(co._chip_name, tuple(PM_METRICS))
        r["config_image"] = T() - t
        t = T()
        P.configure(co, 2000, buf << 20)  # pm_sampling_set_config, with the image made just above
        r["set_config"] = T() - t
        t = T()
        co.start()
        r["start"] = T() - t
        t = T()
        P._evaluator(co._chip_name)
        r["evaluator"] = T() - t
        t = T()
        im = co._create_counter_data_image(1024)
        im.copy()
        r["image"] = T() - t
        time.sleep(0.3)
        t = T()
        co.stop()
        r["stop"] = T() - t
        t = T()
        co.disable()
        r["disable"] = T() - t
        out.append({k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in r.items()})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
