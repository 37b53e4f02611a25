"""Where does a traced window's cost land, token by token — and can CUPTI's start-up leave the decode thread?

    bash scripts/h200.sh scripts/h200_window_costs.py OUTDIR [--reps 8] [--gap 30] [--variants now,pre_ctypes]

The eager demo model (Qwen3-0.6B shape) decodes in one process; every `gap` tokens one token (w) is traced, the
variants taking turns (interleaved, so drift hits them alike):

- now:          open at the boundary before w; close, flush and finalize at the one after it; the record fields
                read inside the buffer callback (as the tracer did until the tenth session)
- split:        as now, but the finalize one boundary later
- pre_ts / pre_register / pre_device / pre_ctypes: as now, but during token w-1 a second thread (the agent's)
  first calls cupti.get_timestamp() / cupti-python's activity_register_callbacks() / activity_enable(DEVICE)
  / cuptiActivityRegisterCallbacks through ctypes (GIL released), to see whether
  CUPTI's start-up can be paid off the decode thread so that open() is cheap
- pre_all:      the second thread enables every kind during token w-1; the decode thread only notes the boundary
- defer:        as now, but the buffer callback only keeps cupti-python's record objects (the tracer's way now);
                their fields are read right after the flush ("deferred_read", timed apart but at the same boundary,
                so still counted in token w; the agent reads them on its own thread)
- dnosync / dk: deferred, without SYNCHRONIZATION records / with kernel records only
- dpre3:        deferred, and CUPTI's start-up made on a second thread (tracer.prepare) from the boundary after
                token w-4, as the agent does it with --prepare-lead 3
- nort / kern:  as now, without RUNTIME records (kernels, copies, syncs) / with kernel records only

Work done at a boundary counts in the token that just ended, as in the demo engine's clock (the first run,
docs/h200/window_costs_run1_2026-11-29.json, counted it in the next token instead). Reports, per variant, the
median and max extra ms of tokens w-4..w+2 over the median of tokens w-14..w-5, and the time of each step
(open, flush, time inside the buffer-completed callback, finalize, the thread's call). Writes
OUTDIR/window_costs.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _child import device_header, run_child_json  # scripts/ is on sys.path when this runs as a script

CHILD = r'''
import json, os, statistics, sys, threading, time
import torch
from decodemon.engine_adapter.model import SHAPES, DecodeModel
mode, variants, reps, gap = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
cpu = os.environ.get("BENCH_CPU") == "1"
m = DecodeModel(SHAPES["tiny" if cpu else "qwen3-0.6b"], "cpu" if cpu else "cuda",
                torch.float32 if cpu else torch.bfloat16, 512, seed=0)
m.reset()
probe = {}  # what cupti-python hands the buffer callback (its first record)
step = m.step  # eager only: graphed windows need their guard token (see main)
count = [0]
def tok():
    if count[0] >= 500:
        m.reset(); count[0] = 0
    count[0] += 1
    step().item()
if cpu:
    class _T:  # the plumbing only: no CUPTI on a CPU
        active = initialised = False
        def open(self): self.active = self.initialised = True
        def boundary(self): pass
        def close(self): self.active = False
        def flush(self): pass
        def detach(self): self.initialised = False
        def _completed(self, a): pass
        _kernels = []
    tr = _T(); c = None
else:
    from decodemon.probes.tracer import WindowTracer
    from cupti import cupti as c
    cb_ns = [0]
    # The tracer keeps the records in its buffer callback and reads their fields in collect() (since the tenth
    # session); InCallback reads them inside the callback, as it did before. Kinds as each variant first ran.
    class InCallback(WindowTracer):
        def _completed(self, activities):
            self._read(activities)
    SYNC = WindowTracer.KINDS + ("SYNCHRONIZATION",)
    KINDS = {"now": SYNC, "defer": SYNC, "dpre3": SYNC, "dnosync": WindowTracer.KINDS, "dk": ("CONCURRENT_KERNEL",),
             "nort": ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION"), "kern": ("CONCURRENT_KERNEL",)}
    def make(v):
        deferred = v in ("defer", "dpre3", "dnosync", "dk")
        t = (WindowTracer if deferred else InCallback)(kinds=KINDS.get(v, SYNC))
        inner = t._completed
        def timed(acts, inner=inner):
            if "first" not in probe and len(acts):  # what cupti-python hands the callback
                a = acts[0]
                probe["first"] = {"type": type(a).__name__, "kind": int(a.kind), "start": int(a.start),
                                  "attrs": [x for x in dir(a) if not x.startswith("__")][:80]}
            t0 = time.perf_counter_ns(); inner(acts); cb_ns[0] += time.perf_counter_ns() - t0
        t._completed = timed
        t.deferred = deferred
        return t
    tracers = {v: make(v) for v in variants}
    tr = tracers[variants[0]]
import ctypes
_REQ = ctypes.CFUNCTYPE(None, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                        ctypes.POINTER(ctypes.c_size_t))
_DONE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
keep = []
@_REQ
def _req(buf, size, nrec):  # never expected (nothing is enabled while these are registered)
    b = ctypes.create_string_buffer(1 << 16); keep.append(b)
    buf[0] = ctypes.cast(b, ctypes.c_void_p); size[0] = len(b); nrec[0] = 0
@_DONE
def _done(ctx, stream, buf, size, valid):
    pass
def register_through_ctypes():
    """cuptiActivityRegisterCallbacks through ctypes, which lets go of the GIL for the call (cupti-python keeps it)."""
    c.get_timestamp()  # libcupti loaded
    path = next(l.rsplit(None, 1)[-1] for l in open("/proc/self/maps") if "/libcupti.so" in l)
    ctypes.CDLL(path).cuptiActivityRegisterCallbacks(_req, _done)
steps = {}
def note(v, k, ns):
    steps.setdefault(v, {}).setdefault(k, []).append(ns / 1e6)
def timed_call(v, k, f):
    t0 = time.perf_counter_ns(); f(); note(v, k, time.perf_counter_ns() - t0)
box = {}
def pre(v):
    def work():
        t0 = time.perf_counter_ns()
        if v == "pre_ts": c.get_timestamp()
        elif v == "pre_register": c.activity_register_callbacks(tr._requested, tr._completed)
        elif v == "pre_device": c.activity_enable(c.ActivityKind.DEVICE)
        elif v == "pre_all": tr.open()
        elif v == "pre_ctypes": register_through_ctypes()
        elif v == "dpre3": tr.prepare()  # as the agent does it with --prepare-lead 3
        note(v, "thread_call", time.perf_counter_ns() - t0)
    th = threading.Thread(target=work); th.start(); box["th"] = th
def join(v):
    th = box.pop("th", None)
    if th is not None:
        t0 = time.perf_counter_ns(); th.join(); note(v, "join_wait", time.perf_counter_ns() - t0)
def hooks_for(v, w):
    # the hook keyed i runs at the boundary after token i and counts in token i (the demo engine's clock);
    # the traced token is w: opened at the boundary after w-1, closed at the one after w
    h = {}
    if v.startswith("pre_") and not cpu:
        h[w - 2] = lambda: pre(v)  # the agent's thread works during token w-1
    if v == "dpre3" and not cpu:
        def early():
            global tr
            tr = tracers[v]; pre(v)  # the agent's thread works during tokens w-4..w-1
        h[w - 4] = early
    def opening():
        global tr
        if not cpu: tr = tracers[v]
        join(v)
        if v == "pre_all" and not cpu:
            timed_call(v, "boundary", tr.boundary)
        else:
            timed_call(v, "open", tr.open)
    h[w - 1] = opening
    def closing():
        timed_call(v, "close", tr.close)
        if not cpu: cb_ns[0] = 0
        timed_call(v, "flush", tr.flush)
        if not cpu:
            note(v, "in_callback", cb_ns[0]); note(v, "kernels", len(tr._kernels) * 1e6)
            if tr.deferred:  # read the kept records now (after the window, as collect() would), and time it
                t0 = time.perf_counter_ns(); raw, tr._batches = tr._batches, []
                for acts in raw: tr._read(acts)
                note(v, "deferred_read", time.perf_counter_ns() - t0); note(v, "kernels", len(tr._kernels) * 1e6)
                ks = tr._kernels
                note(v, "kernel_ends_sane", 1e6 * float(bool(ks) and all(k[2] >= k[1] > 0 for k in ks)))
        if v != "split":
            timed_call(v, "finalize", tr.detach)
    h[w] = closing
    if v == "split":
        h[w + 1] = lambda: timed_call(v, "finalize", tr.detach)
    return h
for _ in range(30): tok()
plan = [variants[i % len(variants)] for i in range(reps * len(variants))]
hooks, where = {}, []
for k, v in enumerate(plan):
    w = 20 + gap * (k + 1)
    hooks.update(hooks_for(v, w)); where.append((v, w))
n = 20 + gap * (len(plan) + 1)
times = []
t = time.perf_counter()
for i in range(n):
    tok()
    h = hooks.get(i)
    if h: h()
    t1 = time.perf_counter(); times.append((t1 - t) * 1e3); t = t1
res = {"mode": mode, "variants": {}, "tokens": n, "median_ms": statistics.median(times)}
for v in variants:
    rel = {r: [] for r in range(-4, 3)}
    for vv, w in where:
        if vv != v: continue
        base = statistics.median(times[w - 14:w - 4])
        for r in rel: rel[r].append(times[w + r] - base)
    res["variants"][v] = {"extra_ms_median": {r: statistics.median(x) for r, x in rel.items()},
                          "extra_ms_max": {r: max(x) for r, x in rel.items()},
                          "steps_ms_median": {k: statistics.median(x) for k, x in steps.get(v, {}).items()}}
far = [times[w + r] for _, w in where for r in range(-14, -4)]
res["probe"] = probe
res["base_median_ms"] = statistics.median(far)
res["base_p99_ms"] = sorted(far)[int(0.99 * len(far))]
if not cpu: torch.cuda.synchronize()
res["survived"] = True
print(json.dumps(res))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--gap", type=int, default=30)
    ap.add_argument("--variants", default="now,pre_ctypes,pre_register")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = device_header(f"bash scripts/h200.sh scripts/h200_window_costs.py OUT --reps {a.reps} --gap {a.gap} "
                        f"--variants {a.variants}")
    res["runs"] = []
    # eager only: graphed windows keep a guard token (probes/agent.py); in the first run of this script
    # (docs/h200/window_costs_run1_2026-11-29.json) one-token graphed windows without it ended in
    # cudaErrorLaunchFailure in both graph processes
    one = run_child_json(CHILD, ["eager", a.variants, str(a.reps), str(a.gap)], 300,
                         mode="eager", variants=a.variants)
    res["runs"].append(one)
    print(json.dumps(one), flush=True)
    (out / "window_costs.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
