"""Why does the eager demo loop run at two speeds? (seventh session: ~21-24 and ~32-40 ms/token, attached or not)

    bash scripts/h200.sh scripts/h200_speeds.py [--phase-s 10] [--rounds 2]

One eager demo engine decodes until stopped. Phases on it: U (unobserved), then per round P (PM only:
`--no-pm` off, `--no-trace`), U, T (traced windows only: `--no-pm`), U, N (token clock and NVML only:
`--no-pm --no-trace`), U, D (defaults), U. Beside the loop, sampled every 0.25 s:

- a CPU speed probe: a separate process times a fixed pure-Python loop (µs per run), so a change of the host
  core's speed shows without the decode process in it;
- the core the decode thread is on (/proc/PID/stat) and the machine's steal share (/proc/stat);
- GPU SM/memory clocks, power, P-state and throttle reasons (`nvidia-smi -lms 250`).

In the engine (`--cpu-clocks`), per token: the decode thread's CPU ms, the other threads' CPU ms, the decode
thread's run-queue wait and a ~30 us canary of fixed pure Python timed on the decode thread itself. Slow tokens
(over 1.3x the unobserved median) beside fast ones: CPU and canary up together, the core ran slower; CPU up and
canary flat, the thread did more work; other threads' CPU up, they held the GIL; run-queue wait up, the scheduler.

Per 0.5 s bin: the loop's median ms/token beside each of them, and their correlation over the run; per phase the
loop's median. If the slow stretches go with the CPU probe, the host's core got slower; with a core change, the
scheduler moved the thread; with the SM clock or P-state, the GPU; with one attach component only, decodemon.

Writes OUTDIR/speeds.json. A dry run on CPU: BENCH_CPU=1 python scripts/h200_speeds.py OUT --phase-s 2 --rounds 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

PY = sys.executable
DM = [PY, "-m", "decodemon.monitor.cli"]
PROBE = r'''
import sys, time
while True:
    t0 = time.perf_counter_ns()
    s = 0
    for i in range(200_000):
        s += i
    print(time.time(), (time.perf_counter_ns() - t0) / 1e3, flush=True)
    time.sleep(0.25)
'''
ATTACH = {"P": ["--no-trace"], "T": ["--no-pm"], "N": ["--no-pm", "--no-trace"], "D": []}


def steal_total() -> tuple[int, int]:
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:9]]
    return v[7], sum(v)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--plan", default="PUTUNUDU",
                    help="one round's phases after the first U: U unobserved, P PM only, T traces only, N token clock "
                         "and NVML only, D defaults")
    a = ap.parse_args()
    plan = ["U"] + list(a.plan) * a.rounds
    if set(plan) - {"U", *ATTACH}:
        ap.error(f"--plan: phases are U, {', '.join(ATTACH)}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    cpu = os.environ.get("BENCH_CPU") == "1"
    from decodemon.monitor.demo import spawn_engine

    times_file = work / "times.json"
    dev = ["--tiny", "--device", "cpu"] if cpu else []
    eng, pid = spawn_engine(dev + ["--mode", "eager", "--tokens", "0", "--times-file", str(times_file),
                                 "--cpu-clocks"])
    probe = subprocess.Popen([PY, "-c", PROBE], stdout=subprocess.PIPE, text=True)
    smi = None
    if not cpu:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,pstate,"
                                "clocks_throttle_reasons.active", "--format=csv,noheader,nounits", "-lms", "250"],
                               stdout=subprocess.PIPE, text=True)
    samples: list[tuple] = []  # (unix s, core, steal share since the last sample)
    stop = threading.Event()

    def sample():
        last = steal_total()
        while not stop.is_set():
            try:
                core = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[36])
            except (OSError, ValueError, IndexError):
                core = -1
            now = steal_total()
            d = now[1] - last[1]
            samples.append((time.time(), core, (now[0] - last[0]) / d if d > 0 else 0.0))
            last = now
            stop.wait(0.25)

    def read_lines(p, sink):
        for line in p.stdout:
            sink.append((time.time(), line.strip()))

    probe_lines, smi_lines = [], []
    threads = [threading.Thread(target=sample, daemon=True),
               threading.Thread(target=read_lines, args=(probe, probe_lines), daemon=True)]
    if smi is not None:
        threads.append(threading.Thread(target=read_lines, args=(smi, smi_lines), daemon=True))
    for t in threads:
        t.start()
    phases = []
    time.sleep(2)
    for label in plan:
        t0 = time.time()
        err = ""
        if label == "U":
            time.sleep(a.phase_s)
        else:
            r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", str(a.phase_s)] + ATTACH[label],
                               capture_output=True, text=True)
            err = r.stderr.strip()[-300:] if r.returncode else ""
        phases.append((label, t0, time.time(), err))
    stop.set()
    eng.send_signal(signal.SIGTERM)
    eng.wait(timeout=60)
    probe.kill()
    if smi is not None:
        smi.kill()
    tt = json.loads(times_file.read_text())
    end, ms = np.array(tt["end_unix_s"]), np.array(tt["ms"])
    # per token: the decode thread's CPU ms, the other threads' CPU ms (process minus decode thread), run-queue wait
    thr = np.array(tt.get("thread_cpu_ms") or [np.nan] * len(ms))
    oth = np.array(tt.get("process_cpu_ms") or [np.nan] * len(ms)) - thr
    rq = np.array(tt.get("runq_wait_ms") or [np.nan] * len(ms))
    can = np.array(tt.get("canary_us") or [np.nan] * len(ms))
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "bash scripts/h200.sh scripts/h200_speeds.py OUT " + " ".join(sys.argv[2:]), "phases": []}
    u_all = np.concatenate([ms[(end > t0 + 0.3) & (end <= t1)] for lab, t0, t1, _ in phases if lab == "U"])
    slow_at = 1.3 * float(np.median(u_all)) if len(u_all) else float("inf")
    res["slow_token_ms"] = round(slow_at, 3)
    for label, t0, t1, err in phases:
        sel = (end > t0 + 0.3) & (end <= t1)
        x = ms[sel]
        slow = sel & (ms > slow_at)
        fast = sel & (ms <= slow_at)

        def med(v, m):
            return round(float(np.nanmedian(v[m])), 4) if m.any() and not np.isnan(v[m]).all() else None
        res["phases"].append({"phase": label, "error": err, "tokens": int(len(x)),
                              "median_ms": float(np.median(x)) if len(x) else None,
                              "slow_tokens": int(slow.sum()),
                              # where a slow token's time went, beside a fast token's, per token (medians)
                              "slow": {"ms": med(ms, slow), "thread_cpu_ms": med(thr, slow),
                                       "other_threads_cpu_ms": med(oth, slow), "runq_wait_ms": med(rq, slow),
                                       "canary_us": med(can, slow)},
                              "fast": {"ms": med(ms, fast), "thread_cpu_ms": med(thr, fast),
                                       "other_threads_cpu_ms": med(oth, fast), "runq_wait_ms": med(rq, fast),
                                       "canary_us": med(can, fast)}})
    by_kind = {}
    for p in res["phases"]:
        k = by_kind.setdefault(p["phase"], [0, 0])
        k[0] += p["slow_tokens"]
        k[1] += p["tokens"]
    res["slow_share_by_phase_kind"] = {k: [v[0], v[1], round(100 * v[0] / max(v[1], 1), 1)] for k, v in by_kind.items()}
    everything_slow = ms > slow_at
    res["all_tokens"] = {
        kind: {"ms": round(float(np.median(ms[m])), 4) if m.any() else None,
               "thread_cpu_ms": round(float(np.nanmedian(thr[m])), 4) if m.any() else None,
               "other_threads_cpu_ms": round(float(np.nanmedian(oth[m])), 4) if m.any() else None,
               "runq_wait_ms": round(float(np.nanmedian(rq[m])), 4) if m.any() else None,
               "canary_us": round(float(np.nanmedian(can[m])), 3) if m.any() else None}
        for kind, m in (("slow", everything_slow), ("fast", ~everything_slow))}
    # 0.5 s bins over the whole run
    lo, hi = phases[0][1], phases[-1][2]
    edges = np.arange(lo, hi, 0.5)
    bins = []
    pr = [(t, float(v.split()[1])) for t, v in probe_lines if len(v.split()) == 2]
    for b0 in edges:
        b1 = b0 + 0.5
        x = ms[(end > b0) & (end <= b1)]
        sel = (end > b0) & (end <= b1)
        row = {"t": round(b0 - lo, 2), "loop_ms": float(np.median(x)) if len(x) else None,
               "thread_cpu_ms": float(np.nanmedian(thr[sel])) if sel.any() else None,
               "other_cpu_ms": float(np.nanmedian(oth[sel])) if sel.any() else None,
               "runq_ms": float(np.nanmedian(rq[sel])) if sel.any() else None,
               "canary_us": float(np.nanmedian(can[sel])) if sel.any() else None,
               "probe_us": statistics.median([v for t, v in pr if b0 < t <= b1] or [float("nan")]),
               "core": [c for t, c, _ in samples if b0 < t <= b1][-1:] or [None],
               "steal": max([s for t, _, s in samples if b0 < t <= b1] or [0.0])}
        row["core"] = row["core"][0]
        sm = [ln.split(", ") for t, ln in smi_lines if b0 < t <= b1]
        if sm:
            f = sm[-1]
            row.update(sm_mhz=float(f[1]), mem_mhz=float(f[2]), power_w=float(f[3]) if f[3] != "[N/A]" else None,
                       pstate=f[4], throttle=f[5])
        row["phase"] = next((p[0] for p in phases if p[1] <= b0 < p[2]), None)
        bins.append(row)
    res["bins"] = bins

    def corr(key):
        pairs = [(r["loop_ms"], r[key]) for r in bins if r.get("loop_ms") is not None
                 and isinstance(r.get(key), (int, float)) and r[key] == r[key]]
        if len(pairs) < 5 or len({p[1] for p in pairs}) < 2:
            return None
        return round(float(np.corrcoef(np.array(pairs).T)[0, 1]), 3)

    res["corr_loop_ms_with"] = {k: corr(k) for k in ("probe_us", "sm_mhz", "mem_mhz", "power_w", "steal",
                                                              "thread_cpu_ms", "other_cpu_ms", "runq_ms", "canary_us")}
    res["cores_seen"] = sorted({r["core"] for r in bins if r["core"] is not None})
    res["core_changes"] = sum(1 for x, y in zip(bins, bins[1:]) if x["core"] != y["core"])
    (out / "speeds.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "bins"}, indent=1))


if __name__ == "__main__":
    main()
