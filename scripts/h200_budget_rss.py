"""Does the window budget bound the decode process's memory? RSS of a graphed engine under dense windows.

    bash scripts/h200.sh scripts/h200_budget_rss.py OUTDIR [--seconds 200] [--budget 100]

A graphed demo engine is attached for SECONDS with a window every second (`--window-period 1
--window-min-tokens 0`) and `--window-budget BUDGET`; the engine's VmRSS is read every 5 s. CUPTI keeps ~90 KB
per window (scripts/h200_cupti_cycles.py), so RSS should climb while the budget lasts and then all but stop
(one window a minute). Writes OUTDIR/budget_rss.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from decodemon.monitor.demo import spawn_engine


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else 200.0
    budget = int(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 100
    cpu = os.environ.get("BENCH_CPU") == "1"
    args = ["--tiny", "--device", "cpu"] if cpu else ["--mode", "graph"]
    proc, pid = spawn_engine(args + ["--tokens", "0"], stdout=subprocess.DEVNULL)
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ") if not cpu else ["cpu", "-"]
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": q[0], "driver": q[-1],
           "command": f"bash scripts/h200.sh scripts/h200_budget_rss.py OUT --seconds {secs:g} --budget {budget}",
           "rss": []}
    try:
        time.sleep(3)
        t0 = time.time()
        res["rss"].append((0.0, rss_mb(pid)))
        box = {}

        def attach():
            box["r"] = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(pid), "--json",
                                       "--seconds", str(secs), "--window-period", "1", "--window-min-tokens", "0",
                                       "--window-budget", str(budget)], capture_output=True, text=True)
        th = threading.Thread(target=attach)
        th.start()
        while th.is_alive():
            time.sleep(5)
            res["rss"].append((round(time.time() - t0, 1), rss_mb(pid)))
        r = box["r"]
        rep = json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()[-500:]}
        res["windows"] = rep.get("windows")
        res["probe"] = rep.get("probe")
        res["error"] = rep.get("error")
        pts = res["rss"]
        # the budget lasts ~budget seconds at one window a second: compare the slope before and after it
        before = [p for p in pts if 10 <= p[0] <= budget]
        after = [p for p in pts if p[0] >= budget + 10]
        slope = lambda ps: (ps[-1][1] - ps[0][1]) / max(ps[-1][0] - ps[0][0], 1e-9) * 60 if len(ps) > 1 else None
        res["mb_per_min_while_budget_lasts"] = slope(before)
        res["mb_per_min_after_budget"] = slope(after)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        (out / "budget_rss.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "rss"}))


if __name__ == "__main__":
    main()
