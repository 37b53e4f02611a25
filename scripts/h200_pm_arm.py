"""What arming PM sampling costs an eager decode thread, with the process's evaluator and configuration image made
once (the default since the thirteenth session) against made at every arm (as before).

    bash scripts/h200.sh scripts/h200_pm_arm.py [--arms 4]

One eager demo model decodes in this process's main thread (Qwen3-0.6B shape, bf16, batch 1, `.item()` every
token, the demo engine's canary timed after each token). A second thread, standing in for the agent, arms
`PmSampler` (2 ms interval) every 3 s, alternating "fresh" (the caches emptied first: a configuration image and two
metrics evaluators made, as every arm did before) and "cached"; each armed session is pumped twice, 0.5 s apart,
then closed. Between some arms the main thread traces one token with `WindowTracer` and finalizes CUPTI, as a
window does, so a cached evaluator is also checked after a finalize. Per arm: its wall and thread CPU time, the
tokens that ended during it and 0.3 s after, their largest and median excess over the median of the 1 s before the
arm, and whether the pumps gave finite values (GPU busy). Writes OUTDIR/pm_arm.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _child import eager_model, start  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arms", type=int, default=4, help="arms of each kind")
    a = ap.parse_args()
    out, header = start(a, "h200_pm_arm.py")
    from decodemon.probes import pm_inproc
    from decodemon.probes.tracer import WindowTracer

    model = eager_model()
    state = {"stop": False, "window": False}
    arms: list[dict] = []
    ends: list[float] = []
    ms: list[float] = []

    def one_arm(kind: str) -> None:
        if kind == "fresh":
            for h in pm_inproc._EVALUATORS.values():
                h.deinitialize()
            pm_inproc._EVALUATORS.clear()
            pm_inproc._CONFIG_IMAGES.clear()
        t0 = time.time()
        pm = pm_inproc.PmSampler(0, 2000)
        t1 = time.time()
        busy, finite = [], True
        for _ in range(2):
            time.sleep(0.5)
            got = pm.samples()
            if got is not None:
                for row in got[2]:
                    finite = finite and all(math.isfinite(v) for v in row)
                    busy.append(row[0])
        pm.close()
        arms.append({"kind": kind, "t0": t0, "t1": t1, "wall_ms": round(pm.arm_ns / 1e6, 2),
                     "cpu_ms": round(pm.arm_cpu_ns / 1e6, 2), "samples": len(busy), "finite": finite,
                     "gpu_busy_pct_median": round(statistics.median(busy), 2) if busy else None})

    def driver() -> None:
        try:
            time.sleep(4.0)
            one_arm("first")  # the process's first PM session (it changes the loop's speed for good): apart
            time.sleep(3.0)
            for i in range(a.arms):
                for kind in ("fresh", "cached"):
                    one_arm(kind)
                    time.sleep(1.0)
                    if i % 2 == 0:
                        state["window"] = True  # a traced token and CUPTI's finalize before the next arm
                    time.sleep(1.5)
        except Exception as exc:
            arms.append({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            state["stop"] = True

    th = threading.Thread(target=driver, daemon=True)
    th.start()
    tr = WindowTracer()
    tr.with_apis = False
    windows = 0
    t_prev = time.perf_counter()
    pos = 0
    while not state["stop"]:
        int(model.step().item())
        t1 = time.perf_counter()
        ms.append((t1 - t_prev) * 1e3)
        ends.append(time.time())
        t_prev = t1
        if tr.active:
            tr.close()
            tr.flush()
            tr.detach()
            tr.collect(windows, 0)
            windows += 1
        elif state["window"]:
            state["window"] = False
            tr.open()
        pos += 1
        if pos >= 4000:
            model.reset()
            pos = 0
    th.join()

    for arm in arms:
        if "t0" not in arm:
            continue
        before = [m for e, m in zip(ends, ms) if arm["t0"] - 1.0 <= e < arm["t0"]]
        during = [m for e, m in zip(ends, ms) if arm["t0"] <= e < arm["t1"] + 0.3]
        if before and during:
            base = statistics.median(before)
            arm.update(tokens_during=len(during), max_excess_ms=round(max(during) - base, 2),
                       median_excess_ms=round(statistics.median(during) - base, 2), base_ms=round(base, 2))
    res = {**header, "windows": windows, "arms": arms}
    summary = {}
    for kind in ("fresh", "cached"):
        ks = [x for x in arms if x.get("kind") == kind and "wall_ms" in x]
        if ks:
            summary[kind] = {k: round(statistics.median(x[k] for x in ks if x.get(k) is not None), 2)
                             for k in ("wall_ms", "cpu_ms", "max_excess_ms", "median_excess_ms")
                             if any(x.get(k) is not None for x in ks)}
            summary[kind]["all_finite"] = all(x["finite"] and x["samples"] for x in ks)
    res["summary"] = summary
    (out / "pm_arm.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({"summary": summary, "arms": arms}, indent=1))


if __name__ == "__main__":
    main()
