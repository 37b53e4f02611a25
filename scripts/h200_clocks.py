"""Why did a graphed loop speed up for good after its first attach? Clocks and power around each probe part.

    bash scripts/h200.sh scripts/h200_clocks.py OUTDIR [A|B|AB]

Two fresh graphed demo engines (OUTDIR A or B: just one). nvidia-smi logs SM/memory clocks, power,
P-state and clock-event reasons every 100 ms throughout. Engine A: unobserved,
then attached with PM sampling only (no traced windows), unobserved, traced
windows only (no PM), unobserved. Engine B: the reverse order. Each phase's
ms/token (the engine's own clock) and median clocks go to OUTDIR/clocks.json,
so whichever part moves the speed shows itself, with what the clocks did.
"""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from decodemon.monitor.demo import spawn_engine

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
OUT.mkdir(parents=True, exist_ok=True)
DM = [sys.executable, "-m", "decodemon.monitor.cli"]
Q = "timestamp,clocks.sm,clocks.mem,power.draw,pstate,clocks_event_reasons.active,temperature.gpu"


def phases_of(order):
    plan = [("U", 6)]
    for part in order:
        plan += [(part, 5), ("U", 5)]
    return plan


def run_engine(tag, order):
    times = OUT.parent / f"times_{tag}.json"
    proc, pid = spawn_engine(["--mode", "graph", "--tokens", "0", "--times-file", str(times)])
    time.sleep(2)
    phases = []
    for label, secs in phases_of(order):
        t0 = time.time()
        if label == "U":
            time.sleep(secs)
        else:
            extra = {"pm_only": ["--no-trace"], "trace_only": ["--no-pm"], "both": []}[label]
            r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", str(secs)] + extra,
                               capture_output=True, text=True)
            try:
                d = json.loads(r.stdout)
                label_info = {"probe": d.get("probe"), "windows": d.get("windows"), "errors": d.get("errors")}
            except ValueError:
                label_info = {"stderr": r.stderr[-300:]}
            phases.append({"label": label, "t0": t0, "t1": time.time(), **label_info})
            continue
        phases.append({"label": label, "t0": t0, "t1": time.time()})
    proc.terminate()
    proc.wait(timeout=60)
    td = json.loads(times.read_text())
    for p in phases:
        xs = [m for e, m in zip(td["end_unix_s"], td["ms"]) if p["t0"] + 0.3 <= e <= p["t1"]]
        p["tokens"] = len(xs)
        p["ms_median"] = round(statistics.median(xs), 4) if xs else None
    return phases


def num(s):
    try:
        return float(s.split()[0])
    except (ValueError, IndexError):
        return None


def main():
    raw = OUT.parent / "smi.csv"
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={Q}", "--format=csv,noheader", "-lms", "100"],
                           stdout=open(raw, "w"), stderr=subprocess.DEVNULL)
    smi_rows: list[dict] = []

    def refresh():
        smi_rows.clear()
        for row in csv.reader(open(raw)):
            if len(row) < 7:
                continue
            try:
                t = time.mktime(time.strptime(row[0].strip().split(".")[0], "%Y/%m/%d %H:%M:%S"))
                t += float("0." + row[0].strip().split(".")[1]) if "." in row[0] else 0
            except ValueError:
                continue
            smi_rows.append({"t": t, "sm_mhz": num(row[1]), "mem_mhz": num(row[2]), "power_w": num(row[3]),
                             "pstate": row[4].strip(), "reasons": row[5].strip(), "temp_c": num(row[6])})

    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "bash scripts/h200.sh scripts/h200_clocks.py OUT"}
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ")
    res["gpu"], res["driver"] = (q + ["?", "?"])[:2]
    orders = {"A": ["pm_only", "trace_only", "both"], "B": ["trace_only", "pm_only"]}
    for tag in (sys.argv[2] if len(sys.argv) > 2 else "AB"):
        order = orders[tag]
        t_engine = time.time()
        phases_tmp = run_engine(tag, order)
        refresh()
        res[tag] = run_stats = []
        for p in phases_tmp:
            rows = [r for r in smi_rows if p["t0"] + 0.3 <= r["t"] <= p["t1"]]
            for k in ("sm_mhz", "mem_mhz", "power_w", "temp_c"):
                vals = [r[k] for r in rows if r[k] is not None]
                p[k] = statistics.median(vals) if vals else None
            p["pstates"] = sorted({r["pstate"] for r in rows})
            p["event_reasons"] = sorted({r["reasons"] for r in rows})
            p["t0"], p["t1"] = round(p["t0"] - t_engine, 1), round(p["t1"] - t_engine, 1)
            run_stats.append(p)
            print(tag, json.dumps(p), flush=True)
        (OUT / "clocks.json").write_text(json.dumps(res, indent=1))
    smi.terminate()


if __name__ == "__main__":
    main()
