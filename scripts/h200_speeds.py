"""Why does the eager demo loop run at two speeds? (seventh session: ~21-24 and ~32-40 ms/token, attached or not)

    bash scripts/h200.sh scripts/h200_speeds.py [--phase-s 10] [--rounds 2]

One eager demo engine decodes until stopped. Phases on it: U (unobserved), then per round P (PM only:
`--no-pm` off, `--no-trace`), U, T (traced windows only: `--no-pm`), U, N (token clock and NVML only:
`--no-pm --no-trace`), U, D (defaults), U. Beside the loop, sampled every 0.25 s:

- a CPU speed probe: a separate process times a fixed pure-Python loop (µs per run), so a change of the host
  core's speed shows without the decode process in it;
- the core the decode thread is on (/proc/PID/stat) and the machine's steal share (/proc/stat);
- GPU SM/memory clocks, power, P-state and throttle reasons (`nvidia-smi -lms 250`).

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
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    cpu = os.environ.get("BENCH_CPU") == "1"
    from decodemon.monitor.demo import spawn_engine

    times_file = work / "times.json"
    dev = ["--tiny", "--device", "cpu"] if cpu else []
    eng, pid = spawn_engine(dev + ["--mode", "eager", "--tokens", "0", "--times-file", str(times_file)])
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
    plan = ["U"] + ["P", "U", "T", "U", "N", "U", "D", "U"] * a.rounds
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
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "bash scripts/h200.sh scripts/h200_speeds.py OUT " + " ".join(sys.argv[2:]), "phases": []}
    for label, t0, t1, err in phases:
        x = ms[(end > t0 + 0.3) & (end <= t1)]
        res["phases"].append({"phase": label, "error": err, "tokens": int(len(x)),
                              "median_ms": float(np.median(x)) if len(x) else None})
    # 0.5 s bins over the whole run
    lo, hi = phases[0][1], phases[-1][2]
    edges = np.arange(lo, hi, 0.5)
    bins = []
    pr = [(t, float(v.split()[1])) for t, v in probe_lines if len(v.split()) == 2]
    for b0 in edges:
        b1 = b0 + 0.5
        x = ms[(end > b0) & (end <= b1)]
        row = {"t": round(b0 - lo, 2), "loop_ms": float(np.median(x)) if len(x) else None,
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

    res["corr_loop_ms_with"] = {k: corr(k) for k in ("probe_us", "sm_mhz", "mem_mhz", "power_w", "steal")}
    res["cores_seen"] = sorted({r["core"] for r in bins if r["core"] is not None})
    res["core_changes"] = sum(1 for x, y in zip(bins, bins[1:]) if x["core"] != y["core"])
    (out / "speeds.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "bins"}, indent=1))


if __name__ == "__main__":
    main()
