"""Does the PM hardware buffer's size change what an arm costs the eager decode thread?

    bash scripts/h200.sh scripts/h200_pm_buffer.py

One eager demo model decodes in the main thread; a second thread arms PM (set_config with a 256 MB or a 64 MB
hardware buffer, alternating, 2 ms interval) every 2 s and closes it 1 s later. Per arm: set_config's ms, and the
largest and the summed excess of the tokens that ended during set_config and 50 ms after it, over the median of the
0.5 s before. Prints JSON.
"""
import json
import statistics
import sys
import threading
import time

import torch

from cupti import pm_sampling
from decodemon.engine_adapter.model import SHAPES, DecodeModel
from decodemon.probes import pm_inproc as P

model = DecodeModel(SHAPES["qwen3-0.6b"], "cuda", torch.bfloat16, 4096)
model.reset()
ends, ms, arms, st = [], [], [], {"stop": False}


def arm(mb):
    co = pm_sampling.Collector(0)
    co.enable()
    t0 = time.time()
    P.configure(co, 2000, mb << 20)  # pm_sampling_set_config (the configuration image is the process's)
    t1 = time.time()
    co.start()
    time.sleep(1.0)
    co.stop()
    co.disable()
    arms.append({"mb": mb, "t0": t0, "t1": t1, "set_config_ms": round((t1 - t0) * 1e3, 1)})


def driver():
    time.sleep(3)
    arm(256)  # the process's first PM session, apart
    time.sleep(2)
    for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
        arm(256 if i % 2 else 64)
        time.sleep(1.0)
    st["stop"] = True


threading.Thread(target=driver, daemon=True).start()
t_prev = time.perf_counter()
while not st["stop"]:
    int(model.step().item())
    t = time.perf_counter()
    ms.append((t - t_prev) * 1e3)
    ends.append(time.time())
    t_prev = t
for a in arms:
    base = statistics.median([m for e, m in zip(ends, ms) if a["t0"] - 0.5 <= e < a["t0"]])
    dur = [m - base for e, m in zip(ends, ms) if a["t0"] <= e < a["t1"] + 0.05]
    a.update(base_ms=round(base, 2), tokens=len(dur), max_excess_ms=round(max(dur), 2),
             sum_excess_ms=round(sum(dur), 2))
    del a["t0"], a["t1"]
print(json.dumps(arms))
