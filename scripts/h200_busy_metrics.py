"""Which PM counter tells how much of a token the GPU spends running kernels — and does the probe change tokens?

    bash scripts/h200.sh scripts/h200_busy_metrics.py OUTDIR [--candidates a.avg,b.max] [--no-identity]

In one process, per mode (eager, graph) of the demo model (Qwen3-0.6B shape):
1. untraced ms/token (median of 200 tokens);
2. one traced window (decodemon's own WindowTracer: 2 tokens + a guard): the union of kernel intervals per
   traced token, and that union divided by the untraced ms/token — "the value derived from the traced window";
3. PM sampling with candidate counters (every base counter of the chip whose name says `cycles_active`, with
   `.max` and `.avg` roll-ups), each configured beside `gr__cycles_elapsed.max` and `gr__cycles_active.avg`,
   over untraced tokens: the mean of counter / elapsed per sample;
4. tokens from reset, twice without the probe and once with PM running and a 1-token window every 25 tokens:
   identical or not, and where they first differ.
Writes OUTDIR/busy_metrics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from decodemon.engine_adapter.model import SHAPES, DecodeModel, cuda_graph_step
from decodemon.monitor.metrics import _union_ns
from decodemon.probes.tracer import WindowTracer

_ap = argparse.ArgumentParser()
_ap.add_argument("out", nargs="?", default="out")
_ap.add_argument("--candidates", default="", help="comma-separated PM metrics to try instead of the cycles_active ones")
_ap.add_argument("--no-identity", action="store_true", help="skip the token-identity part")
ARGS = _ap.parse_args()
OUT = Path(ARGS.out)
OUT.mkdir(parents=True, exist_ok=True)
RES: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "command": "bash scripts/h200.sh scripts/h200_busy_metrics.py OUT " + " ".join(sys.argv[2:])}


def save():
    (OUT / "busy_metrics.json").write_text(json.dumps(RES, indent=1))


CPU = os.environ.get("BENCH_CPU") == "1"  # a dry run of the script's plumbing: tiny model, no CUPTI


def build(mode):
    """The model and a step function that starts again from position 0 before the 512-position cache ends."""
    model = DecodeModel(SHAPES["tiny" if CPU else "qwen3-0.6b"], "cpu" if CPU else "cuda",
                        torch.float32 if CPU else torch.bfloat16, 512, seed=0)
    model.reset()
    reset = model.reset
    model.count = 0

    def counted_reset(*a):
        model.count = 0
        reset(*a)
    model.reset = counted_reset

    def wrap(step):
        def run():
            if model.count >= 500:
                model.reset()
            model.count += 1
            return step()
        return run
    if mode == "eager":
        return model, wrap(model.step)
    replay = cuda_graph_step(model.step, model.reset)
    return model, wrap(replay)


def tokens(run, n, hook=None):
    ids, times = [], []
    t = time.perf_counter()
    for i in range(n):
        ids.append(int(run().item()))
        if hook is not None:
            hook(i)
        t1 = time.perf_counter()
        times.append((t1 - t) * 1e3)
        t = t1
    return ids, times


def traced_union(run):
    tr = WindowTracer()
    tr.open()
    for i in range(3):
        run().item()
        if i < 2:
            tr.boundary()
    tr.close()
    tr.flush()
    tr.detach()
    w = tr.collect(0, 1)
    b = w.token_bounds_ns.array()
    st, en = w.kernels["start"].array(), w.kernels["end"].array()
    per = []
    for k in range(2):
        lo, hi = b[k], b[k + 1]
        m = (st >= lo) & (en <= hi)
        per.append({"kernels": int(m.sum()), "union_ms": _union_ns(st[m], en[m]) / 1e6,
                    "sum_ms": float((en[m] - st[m]).sum()) / 1e6, "traced_wall_ms": (hi - lo) / 1e6})
    return per


def pm_run(run, metrics, n):
    from cupti import pm_sampling

    coll = pm_sampling.Collector(int(os.environ.get("DECODEMON_DEVICE", "0")))
    coll.enable()
    try:
        coll.configure(metrics=metrics, hardware_buffer_size=256 << 20, sampling_interval=2_000_000)
        coll.start()
        _, times = tokens(run, n)
        torch.cuda.synchronize()
        coll.stop()
        data = coll.decode()
        vals = np.array([s.metric_values for s in data])
    finally:
        coll.disable()
    return vals, statistics.median(times)


def candidates():
    from cupti import pm_sampling, profiler_host
    from cupti.cupti import MetricType, ProfilerType

    torch.zeros(1, device="cuda")  # a CUDA context first: without one the collector refuses device 0
    coll = pm_sampling.Collector(0)
    coll.enable()
    try:
        chip = coll._chip_name
    finally:
        coll.disable()
    host = profiler_host.ProfilerHost(chip, ProfilerType.PM_SAMPLING)
    host.initialize()
    base = host.get_base_metrics(MetricType.COUNTER)
    host.deinitialize()
    RES["chip"] = chip
    RES["base_counters"] = base
    names = [m for m in base if "cycles_active" in m or "time_active" in m]
    first = ("sm__cycles_active", "gpc__", "tpc__", "gpu__", "fe__", "gr__")
    names.sort(key=lambda m: next((i for i, p in enumerate(first) if m.startswith(p)), len(first)))
    return [f"{m}.{r}" for m in names for r in ("max", "avg")][:16]


def main():
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ")
    RES["gpu"], RES["driver"] = (q + ["?", "?"])[:2]
    try:
        cands = candidates()
        if ARGS.candidates:
            cands = ARGS.candidates.split(",")
    except Exception as exc:
        RES["candidates_error"] = f"{type(exc).__name__}: {exc}"
        cands = ["sm__cycles_active.max", "sm__cycles_active.avg"]
    RES["candidates"] = cands
    save()
    for mode in ("eager", "graph"):
        r = RES[mode] = {}
        model, run = build(mode)
        tokens(run, 20)
        ids, times = tokens(run, 200)
        r["untraced_ms_median"] = statistics.median(times)
        r["traced"] = traced_union(run)
        u = statistics.median(x["union_ms"] for x in r["traced"])
        r["traced_union_ms"] = u
        r["derived_busy_pct"] = 100 * u / r["untraced_ms_median"]
        save()
        n = 100 if mode == "eager" else 500
        r["pm"] = {}
        for c in cands:
            metrics = ["gr__cycles_elapsed.max", "gr__cycles_active.avg"] + ([c] if c != "gr__cycles_active.avg" else [])
            try:
                vals, med = pm_run(run, metrics, n)
                v = vals[2:-2] if len(vals) > 6 else vals
                el = v[:, 0]
                r["pm"][c] = {"samples": len(vals), "ms_median": med,
                              "gr_active_pct": float(np.mean(v[:, 1] / el) * 100),
                              "pct_of_elapsed": float(np.mean(v[:, -1] / el) * 100),
                              "raw_mean": float(np.mean(v[:, -1]))}
            except Exception as exc:
                r["pm"][c] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            save()
        if ARGS.no_identity:
            del model, run
            torch.cuda.empty_cache()
            continue
        # tokens: plain twice, then with the probe's two parts at work
        model.reset()
        a, _ = tokens(run, 300)
        model.reset()
        b, _ = tokens(run, 300)
        from cupti import pm_sampling

        coll = pm_sampling.Collector(0)
        coll.enable()
        coll.configure(metrics=["gr__cycles_elapsed.max", "gr__cycles_active.avg"], hardware_buffer_size=256 << 20,
                       sampling_interval=2_000_000)
        coll.start()
        tr = WindowTracer()
        state = {"left": 0}

        def hook(i):
            if tr.active:
                state["left"] -= 1
                if state["left"] <= 0:
                    tr.close()
                    tr.flush()
                    tr.detach()
                    tr.collect(0, 1)
                else:
                    tr.boundary()
            elif i % 25 == 0:
                tr.open()
                state["left"] = 2
        model.reset()
        c, _ = tokens(run, 300, hook)
        if tr.active:
            tr.close()
        if tr.initialised:
            tr.flush()
            tr.detach()
        try:
            coll.stop()
            coll.disable()
        except Exception as exc:
            r["pm_stop_error"] = f"{type(exc).__name__}: {exc}"

        def diff(x, y):
            return next((i for i, (p, q_) in enumerate(zip(x, y)) if p != q_), None)
        r["tokens"] = {"n": len(a), "plain_vs_plain_first_diff": diff(a, b), "plain_vs_probe_first_diff": diff(a, c),
                       "first_ids": a[:10]}
        save()
        del model, run
        torch.cuda.empty_cache()
    print(json.dumps(RES)[:3000])


if __name__ == "__main__":
    main()
