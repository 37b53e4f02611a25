"""What does opening a traced window cost, call by call — and do CUPTI's buffer attributes change it? Also: how
noisy is the eager loop itself, pinned to one core and not?

    bash scripts/h200.sh scripts/h200_open_costs.py OUTDIR [--reps 8] [--gap 30] [--noise-s 30]

Part A (window costs): for each variant a fresh process decodes the demo model (Qwen3-0.6B shape) and every
`gap` tokens traces one token (graph mode: one token + the guard token decodemon keeps there). The open is timed
call by call: the activity attributes a variant sets, cuptiActivityRegisterCallbacks, each activity_enable,
the runtime-API filter; the close, flush and finalize after it. Reports the extra ms of the tokens around each
window over the median of tokens w-12..w-3 (work at a boundary counts in the token that just ended, as in the
demo engine's clock).

Variants: default (CUPTI's defaults: 3 device buffers of 3.2 MB pre-allocated per context), prealloc1 (one
buffer pre-allocated), small (512 KB buffers, one pre-allocated), small_pinned (the same in pinned host memory),
kernel_only (CONCURRENT_KERNEL records only: what the runtime-API records cost while tracing).

Part B (noise): the demo engine decodes eager for `noise-s` seconds unobserved, once as it is and once pinned to
one core with taskset; per 4 s phase the median ms/token, and the noise floor as the benchmark computes it
(median |phase / previous phase - 1|). While the unpinned one runs, the core its decode thread is on is sampled.

Writes OUTDIR/open_costs.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _child import run_child_json  # scripts/ is on sys.path when this runs as a script

CHILD = r'''
import ctypes, json, os, statistics, sys, time
import torch
from decodemon.engine_adapter.model import SHAPES, DecodeModel, cuda_graph_step
mode, variant, reps, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = DecodeModel(SHAPES["qwen3-0.6b"], "cuda", torch.bfloat16, 512, seed=0)
m.reset()
step = m.step
if mode == "graph":
    step = cuda_graph_step(step, m.reset)
count = [0]
def tok():
    if count[0] >= 500:
        m.reset(); count[0] = 0
    count[0] += 1
    step().item()
from cupti import cupti as c
from decodemon.probes.tracer import WindowTracer
A = c.ActivityAttribute
attrs = {"default": [], "prealloc1": [(A.ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, 1, ctypes.c_size_t)],
         "small": [(A.ATTR_DEVICE_BUFFER_SIZE, 1 << 19, ctypes.c_size_t),
                   (A.ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, 1, ctypes.c_size_t)],
         "small_pinned": [(A.ATTR_DEVICE_BUFFER_SIZE, 1 << 19, ctypes.c_size_t),
                          (A.ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE, 1, ctypes.c_size_t),
                          (A.ATTR_MEM_ALLOCATION_TYPE_HOST_PINNED, 1, ctypes.c_uint8)],
         "kernel_only": []}.get(variant, [])
kinds = ("CONCURRENT_KERNEL",) if variant == "kernel_only" else ("CONCURRENT_KERNEL", "RUNTIME", "MEMCPY", "MEMSET", "SYNCHRONIZATION")
tr = WindowTracer(kinds=kinds)
steps = {}
def note(k, ns):
    steps.setdefault(k, []).append(ns / 1e6)
def timed(k, f):
    t0 = time.perf_counter_ns(); f(); note(k, time.perf_counter_ns() - t0)
def set_attr(a, v, ct):
    val = ct(v); size = ctypes.c_size_t(ctypes.sizeof(val))
    c.activity_set_attribute(int(a), ctypes.addressof(size), ctypes.addressof(val))
def get_size_attr(a):
    val = ctypes.c_size_t(0); size = ctypes.c_size_t(ctypes.sizeof(val))
    c.activity_get_attribute(int(a), ctypes.addressof(size), ctypes.addressof(val))
    return val.value
def opening():
    t0 = time.perf_counter_ns()
    for a, v, ct in attrs:
        timed("set_" + a.name, lambda: set_attr(a, v, ct))
    tr._reset()
    timed("register", lambda: c.activity_register_callbacks(tr._requested, tr._completed))
    enable_all(t0)
def enable_all(t0):
    for k in tr._kinds:
        timed("enable_" + k.name, lambda: c.activity_enable(k))
    timed("filter", tr._filter_apis)
    tr.initialised = tr.active = True
    tr.bounds.append(c.get_timestamp())
    note("open_total", time.perf_counter_ns() - t0)
def closing():
    timed("close", tr.close)
    timed("flush", tr.flush)
    note("kernels", len(tr._kernels) * 1e6)
    timed("finalize", tr.detach)
# preinit*: CUPTI's re-initialisation (the first CUPTI call after a finalize, cuptiActivityRegisterCallbacks)
# made on another thread PRE tokens before the window, so the decode thread's open only enables.
# *_flushoff: the decode thread only disables at the window's end; another thread flushes (the GIL handed back
# every 0.2 ms meanwhile), and the decode thread finalizes at the first boundary after the flush has finished.
import threading
PRE = 4
bg_jobs, bg_ev, bg_done = [], threading.Event(), threading.Event()
bg_done.set()
def bg_loop():
    while True:
        bg_ev.wait(); bg_ev.clear()
        name, f, polite = bg_jobs.pop(0)
        saved = sys.getswitchinterval()
        if polite: sys.setswitchinterval(0.0002)
        t0 = time.perf_counter_ns(); f(); note(name, time.perf_counter_ns() - t0)
        if polite: sys.setswitchinterval(saved)
        bg_done.set()
threading.Thread(target=bg_loop, daemon=True).start()
def in_bg(name, f, polite=False):
    def h():
        bg_done.clear(); bg_jobs.append((name, f, polite)); bg_ev.set()
    return h
def wait_bg(name):
    t0 = time.perf_counter_ns(); bg_done.wait(); note(name, time.perf_counter_ns() - t0)
def opening_enable_only():
    wait_bg("wait_preinit")
    enable_all(time.perf_counter_ns())
def preinit():
    tr._reset()
    c.activity_register_callbacks(tr._requested, tr._completed)
def finalize_after_flush():
    wait_bg("wait_flush")
    note("kernels", len(tr._kernels) * 1e6)
    timed("finalize", tr.detach)
guard = 1 if mode == "graph" else 0
for _ in range(30): tok()
hooks, where = {}, []
for k in range(reps):
    w = 20 + gap * (k + 1)
    if variant.startswith("preinit"):
        hooks[w - 1 - PRE] = in_bg("register_bg", preinit)
        hooks[w - 1] = opening_enable_only
    else:
        hooks[w - 1] = opening
    for j in range(guard):
        hooks[w + j] = tr.boundary
    if variant.endswith("_flushoff"):
        def close_then_flush(): 
            timed("close", tr.close); in_bg("flush_bg", tr.flush, polite=True)()
        hooks[w + guard] = close_then_flush
        hooks[w + guard + 2] = finalize_after_flush
    else:
        hooks[w + guard] = closing
    where.append(w)
n = 20 + gap * (reps + 1)
times = []
t = time.perf_counter()
for i in range(n):
    tok()
    h = hooks.get(i)
    if h: h()
    t1 = time.perf_counter(); times.append((t1 - t) * 1e3); t = t1
res = {"mode": mode, "variant": variant, "tokens": n, "median_ms": statistics.median(times)}
rel = {r: [] for r in range(-2 - (PRE + 1 if variant.startswith("preinit") else 0), 4 + guard)}
for w in where:
    base = statistics.median(times[w - 18:w - 8])
    for r in rel: rel[r].append(times[w + r] - base)
res["extra_ms_median"] = {r: round(statistics.median(x), 3) for r, x in rel.items()}
res["extra_ms_max"] = {r: round(max(x), 3) for r, x in rel.items()}
res["steps_ms_median"] = {k: round(statistics.median(x), 3) for k, x in steps.items()}
res["steps_ms_first"] = {k: round(x[0], 3) for k, x in steps.items()}
far = [times[w + r] for w in where for r in range(-18, -8)]
res["base_median_ms"] = statistics.median(far)
try:
    res["buffer_size_after"] = get_size_attr(A.ATTR_DEVICE_BUFFER_SIZE)
    res["prealloc_after"] = get_size_attr(A.ATTR_DEVICE_BUFFER_PRE_ALLOCATE_VALUE)
    tr.detach()
except Exception as exc:
    res["attr_read_error"] = str(exc)
torch.cuda.synchronize()
res["survived"] = True
print(json.dumps(res))
'''


def noise_run(seconds: float, pin: str | None) -> dict:
    """The eager demo engine, unobserved, for `seconds`; per 4 s phase medians and the noise floor."""
    work = Path(tempfile.mkdtemp(prefix="dm-noise-"))
    tf = work / "times.json"
    cmd = [sys.executable, "-m", "decodemon.engine_adapter.demo", "--mode", "eager", "--tokens", "0",
           "--times-file", str(tf)]
    if pin is not None:
        cmd = ["taskset", "-c", pin] + cmd
    err = open(work / "err", "w")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    t0 = time.time()
    while "decoding" not in (work / "err").read_text():
        if p.poll() is not None or time.time() - t0 > 180:
            return {"pin": pin, "error": (work / "err").read_text()[-1500:]}
        time.sleep(0.2)
    cores = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        try:
            cores.append(int(open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[36]))
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=60)
    d = json.loads(tf.read_text())
    ends, ms = d["end_unix_s"], d["ms"]
    start = ends[0] + 2.0
    phases = []
    while start + 4 <= ends[-1]:
        xs = [m for e, m in zip(ends, ms) if start <= e < start + 4]
        phases.append({"median_ms": round(statistics.median(xs), 3), "p99_ms": round(sorted(xs)[int(0.99 * len(xs))], 3),
                       "tokens": len(xs)})
        start += 4
    med = [p_["median_ms"] for p_ in phases]
    null = [abs(b / a - 1) for a, b in zip(med, med[1:])]
    return {"pin": pin, "phases": phases, "noise_floor_pct": round(100 * statistics.median(null), 2) if null else None,
            "phase_median_range_ms": [min(med), max(med)] if med else None,
            "core_changes": sum(a != b for a, b in zip(cores, cores[1:])), "cores_seen": sorted(set(cores)),
            "core_samples": len(cores)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--gap", type=int, default=30)
    ap.add_argument("--noise-s", type=float, default=30.0)
    ap.add_argument("--variants", default="default,prealloc1,small,small_pinned,kernel_only")
    ap.add_argument("--graph-variants", default="default,small")
    ap.add_argument("--pin", default="6")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": q[0], "driver": (q + ["?"])[1],
           "nproc": os.cpu_count(),
           "lscpu": subprocess.run(["lscpu"], capture_output=True, text=True).stdout[-3000:],
           "command": "bash scripts/h200.sh scripts/h200_open_costs.py OUT " + " ".join(sys.argv[2:]),
           "windows": [], "noise": []}

    def save():
        (out / "open_costs.json").write_text(json.dumps(res, indent=1))
    for mode, variants in (("eager", a.variants), ("graph", a.graph_variants)):
        for v in [x for x in variants.split(",") if x]:
            r = run_child_json(CHILD, [mode, v, str(a.reps), str(a.gap)], 300, mode=mode, variant=v)
            res["windows"].append(r)
            print(json.dumps(r), flush=True)
            save()
    if a.noise_s > 0:
        for pin in (None, a.pin):
            r = noise_run(a.noise_s, pin)
            res["noise"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "phases"}), flush=True)
            save()


if __name__ == "__main__":
    main()
