"""What does each way of tracing cost, and which ones are safe with CUDA graphs? (H200 experiments)

    python scripts/h200_probe_experiments.py OUTDIR

Each experiment runs in its own process (a crash is a result, not the end of
the run): decode 300 tokens unobserved, open one traced window of 2 tokens,
collect it, optionally finalize CUPTI, decode 300 more, and report the
median ms/token before and after, the window's record counts and whether
the process survived. Then PM sampling from a second process, with and
without a CUDA context of its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from _child import run_child_json  # scripts/ is on sys.path when this runs as a script

CHILD = r'''
import json, os, statistics, sys, threading, time
import torch
from decodemon.engine_adapter.model import SHAPES, DecodeModel, cuda_graph_step
mode, variant = sys.argv[1], sys.argv[2]
m = DecodeModel(SHAPES["qwen3-0.6b"], "cuda", torch.bfloat16, 512)
m.reset()
step = m.step
if mode == "graph":
    step = cuda_graph_step(step, m.reset)
def run(n):
    ts = []
    for i in range(n):
        if int(m.pos.item()) >= 500: m.reset()
        t0 = time.perf_counter(); step().item(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3
res = {"mode": mode, "variant": variant}
run(20)
res["before_ms"] = run(300)
if variant != "none":
    from decodemon.probes.tracer import WindowTracer
    kinds = {"kernel_only": ("CONCURRENT_KERNEL",), "driver": ("CONCURRENT_KERNEL", "DRIVER"),
             "unfiltered": ("CONCURRENT_KERNEL", "RUNTIME", "DRIVER", "MEMCPY", "MEMSET", "SYNCHRONIZATION")}.get(
        variant.split("+")[0], ("CONCURRENT_KERNEL", "RUNTIME", "MEMCPY", "MEMSET", "SYNCHRONIZATION"))
    tr = WindowTracer(kinds=kinds, api_filter=not variant.startswith("unfiltered"))
    for rep in range(3):
        t0 = time.perf_counter(); tr.open(); t1 = time.perf_counter()
        step().item(); tr.boundary(); step().item()
        t2 = time.perf_counter(); tr.close(); t3 = time.perf_counter()
        if "thread" in variant:
            box = {}
            th = threading.Thread(target=lambda: box.setdefault("w", tr.collect(rep))); th.start()
            while th.is_alive(): step().item()
            w = box["w"]
        else:
            w = tr.collect(rep)
        t4 = time.perf_counter()
        if "finalize" in variant:
            tr.detach()
        t5 = time.perf_counter()
        res[f"w{rep}"] = {"open_ms": (t1-t0)*1e3, "traced_2tok_ms": (t2-t1)*1e3, "close_ms": (t3-t2)*1e3,
                          "collect_ms": (t4-t3)*1e3, "finalize_ms": (t5-t4)*1e3,
                          "kernels": len(w.kernels["start"].data) // 8, "apis": len(w.apis["start"].data) // 8 if w.apis else 0}
        res[f"after{rep}_ms"] = run(150)
torch.cuda.synchronize()
res["survived"] = True
print(json.dumps(res))
'''

PM_CHILD = r'''
import ctypes, json, sys, time
ctx = sys.argv[1] == "ctx"
if ctx:
    cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
    dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
    c = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev); cu.cuCtxSetCurrent(c)
from cupti import pm_sampling
from decodemon.probes.sidecar import PM_METRICS
col = pm_sampling.Collector(0)
out = {"ctx": ctx}
try:
    col.enable(); col.configure(metrics=PM_METRICS, hardware_buffer_size=256 << 20, sampling_interval=2_000_000)
    col.start(); time.sleep(1.5)
    d = col.decode(max_samples=4096)
    rows = [s.metric_values for s in d]
    out["samples"] = len(rows)
    if rows:
        import statistics as st
        out["gpu_busy_pct"] = 100 * st.mean(r[0] / r[1] for r in rows if r[1])
        out["sm_active_pct"] = 100 * st.mean(r[2] / r[1] for r in rows if r[1])
        out["dram_pct"] = st.mean(r[3] for r in rows)
    col.stop(); col.disable()
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
'''


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    results = []
    plan = [("graph", "none"), ("graph", "default"), ("graph", "default+finalize"), ("graph", "default+thread"),
            ("graph", "kernel_only"), ("graph", "driver"), ("eager", "none"), ("eager", "default"),
            ("eager", "default+finalize"), ("eager", "unfiltered+finalize")]
    for mode, variant in plan:
        res = run_child_json(CHILD, [mode, variant], 240, mode=mode, variant=variant)
        results.append(res)
        print(json.dumps(res), flush=True)
    # PM sampling from a second process while a graphed loop runs
    eng = subprocess.Popen([sys.executable, "-m", "decodemon.engine_adapter.demo", "--mode", "graph", "--tokens", "0"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in eng.stderr:
        if "decoding" in line:
            break
    time.sleep(2)
    for variant in ("noctx", "ctx"):
        r = subprocess.run([sys.executable, "-c", PM_CHILD, variant], capture_output=True, text=True, timeout=60)
        res = {"pm": variant, "stdout": r.stdout.strip()[-600:], "stderr": r.stderr.strip()[-600:]}
        results.append(res)
        print(json.dumps(res), flush=True)
    eng.terminate()
    eng.wait(timeout=20)
    (out / "experiments.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
