"""Where a live attach's monitor CPU goes, and which of the engine's threads work while it is attached.

    python scripts/h200_monitor_cpu_live.py OUTDIR [--mode eager] [--phase-s 10] [--cpu]

benchmarks/overhead.py counts ~2 s of monitor CPU per default attach on the H200 whatever the attach's length
(seventeenth session and run 41: 220 ms/s over 10 s eager attaches, 500 ms/s over 4 s graph ones), against
~0.3 s for the same `attach --json` on the CPU machine's tiny engine; and a process working on another CPU
slowed the eager decode thread (fourteenth session, scripts/h200_attached_cost.py). This starts the demo engine,
then runs: an unobserved phase; a plain `attach --json` whose CPU is read from /proc every 0.25 s (when does it
spend it: start-up, steady state, the end?); a second attach under cProfile (on what); another unobserved phase.
Throughout, each engine thread's CPU and minor faults are read every second from /proc/PID/task (which threads
work, and fault, while attached). Writes OUTDIR/monitor_cpu_live.json and OUTDIR/monitor_profile.txt.
`--cpu`: the tiny engine on this machine's CPU (a dry run of the script).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pstats
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead import DM, start_demo  # noqa: E402

TCK = os.sysconf("SC_CLK_TCK")


def stat_fields(path: Path) -> list[str] | None:
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (its threads included), seconds."""
    f = stat_fields(Path(f"/proc/{pid}/stat"))
    return None if f is None else (int(f[11]) + int(f[12])) / TCK


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """{'comm tid': (CPU s, minor faults)} for each of the process's threads."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        f = stat_fields(task / "stat")
        try:
            name = (task / "comm").read_text().strip()
        except OSError:
            continue
        if f is not None:
            out[f"{name} {task.name}"] = ((int(f[11]) + int(f[12])) / TCK, int(f[7]))
    return out


class ThreadWatch(threading.Thread):
    """Each engine thread's CPU and faults, every second, labelled with the phase running."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.label, self.rows, self.stop = pid, "start", [], threading.Event()

    def run(self) -> None:
        prev = threads(self.pid)
        while not self.stop.wait(1.0):
            try:
                cur = threads(self.pid)
            except OSError:
                return
            d = {k: (round(v[0] - prev[k][0], 3), v[1] - prev[k][1]) for k, v in cur.items() if k in prev}
            self.rows.append({"label": self.label, "t": time.time(), "threads": {k: v for k, v in d.items() if v != (0, 0)}})
            prev = cur


def attach_timeline(pid: int, secs: float) -> dict:
    t0 = time.time()
    p = subprocess.Popen(DM + ["attach", str(pid), "--json", "--seconds", str(secs)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    tl = []
    while p.poll() is None:
        c = proc_cpu_s(p.pid)
        if c is not None:
            tl.append((round(time.time() - t0, 3), c))
        time.sleep(0.25)
    out, err = p.communicate()
    return {"wall_s": round(time.time() - t0, 2), "cpu_timeline": tl, "rc": p.returncode, "stderr": err[-1500:],
            "report_keys": sorted(json.loads(out).keys()) if out.strip().startswith("{") else out[-500:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mode", default="eager")
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    eng, pid = start_demo(out, a.mode, tiny=a.cpu)
    if pid is None:
        return 1
    watch = ThreadWatch(pid)
    watch.start()
    res: dict = {"mode": a.mode, "phase_s": a.phase_s, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        watch.label = "U1"
        time.sleep(a.phase_s)
        watch.label = "D"
        r0 = os.times()
        res["plain"] = attach_timeline(pid, a.phase_s)
        r1 = os.times()
        res["plain"]["children_cpu_s"] = round((r1.children_user + r1.children_system)
                                               - (r0.children_user + r0.children_system), 3)
        watch.label = "U2"
        time.sleep(a.phase_s / 2)
        watch.label = "Dprof"
        prof = out / "monitor.prof"
        code = ("import cProfile, runpy, sys, time\n"
                f"sys.argv = ['decodemon', 'attach', '{pid}', '--json', '--seconds', '{a.phase_s}']\n"
                "pr = cProfile.Profile(time.process_time)  # CPU time, not waits\n"
                "pr.enable()\n"
                "try:\n    runpy.run_module('decodemon.monitor.cli', run_name='__main__')\n"
                "except SystemExit:\n    pass\n"
                f"pr.disable()\npr.dump_stats({str(prof)!r})\n")
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        res["profiled_rc"] = p.returncode
        watch.label = "U3"
        time.sleep(a.phase_s / 2)
        if prof.exists():
            s = io.StringIO()
            st = pstats.Stats(str(prof), stream=s)
            st.sort_stats("cumulative").print_stats(45)
            st.sort_stats("tottime").print_stats(30)
            (out / "monitor_profile.txt").write_text(s.getvalue())
    finally:
        watch.stop.set()
        eng.terminate()
        try:
            eng.wait(20)
        except subprocess.TimeoutExpired:
            eng.kill()
    # per label: each thread's CPU ms/s and faults/s (median-free: total over the label's seconds)
    by: dict = {}
    for row in watch.rows:
        lab = by.setdefault(row["label"], {"seconds": 0, "threads": {}})
        lab["seconds"] += 1
        for k, (c, f) in row["threads"].items():
            name = k.rsplit(" ", 1)[0]
            t = lab["threads"].setdefault(name, [0.0, 0])
            t[0] += c
            t[1] += f
    for lab in by.values():
        n = max(1, lab["seconds"])
        lab["threads"] = {k: {"cpu_ms_per_s": round(1e3 * v[0] / n, 1), "minflt_per_s": round(v[1] / n, 1)}
                          for k, v in sorted(lab["threads"].items(), key=lambda kv: -kv[1][0])}
    res["engine_threads"] = by
    (out / "monitor_cpu_live.json").write_text(json.dumps(res, indent=1))
    tl = res["plain"]["cpu_timeline"]
    print(f"plain attach: {res['plain']['children_cpu_s']} s CPU (rusage) over {res['plain']['wall_s']} s; "
          f"timeline (s, cpu s): {tl[:6]} ... {tl[-3:]}")
    for lab, v in by.items():
        print(lab, v["seconds"], "s:", json.dumps(dict(list(v["threads"].items())[:8])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
