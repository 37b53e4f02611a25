"""Live soak on the GPU: the real Textual monitor attached to a graphed demo engine for N minutes.

    python scripts/h200_soak.py OUTDIR [--minutes 10.5] [--mode graph] [--size 160x50]

`decodemon attach PID` runs in a pseudo-terminal (what a user's terminal
gives it) at its default refresh (4 a second until the fourteenth session, 2 since); its screen output is read and
discarded. Every 15 s: the monitor's CPU (% of one core over the interval,
from /proc), RSS of the monitor and of the engine, and the engine's own
ms/token. At the end: `q` is pressed (the app must exit by itself), and one
`decodemon attach --json` shows the probe state and dropped-record count.
Writes OUTDIR/soak.json (incrementally, so a cut-short run still leaves data).

Also works without a GPU (`--cpu`: tiny eager engine), to check the script.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

from decodemon.monitor.demo import spawn_engine

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK  # utime, stime


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def engine_ms(log_path: Path, since: float) -> float | None:
    xs = []
    for line in open(log_path):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d["t"] >= since:
            xs.append(d["ms_median"])
    xs.sort()
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--minutes", type=float, default=10.5)
    ap.add_argument("--mode", default="graph")
    ap.add_argument("--size", default="160x50")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cols, rows = map(int, a.size.split("x"))
    eng_args = ["--tiny", "--device", "cpu", "--mode", "eager"] if a.cpu else ["--mode", a.mode]
    log_path = out / "engine.log"
    eng, pid = spawn_engine(eng_args + ["--tokens", "0", "--log-every", "5"], stdout=open(log_path, "w"))
    time.sleep(12)
    unobserved = engine_ms(log_path, 0)
    mon_pid, fd = pty.fork()
    if mon_pid == 0:
        os.environ.update(TERM="xterm-256color", COLUMNS=str(cols), LINES=str(rows))
        os.execv(sys.executable, [sys.executable, "-m", "decodemon.monitor.cli", "attach", str(pid)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    screen_bytes = [0]
    stop = threading.Event()

    def drain():
        while not stop.is_set():
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    return
                if not data:
                    return
                screen_bytes[0] += len(data)

    threading.Thread(target=drain, daemon=True).start()
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": f"python scripts/h200_soak.py OUT --minutes {a.minutes:g} --mode {a.mode} --size {a.size}",
           "engine_pid": pid, "monitor_pid": mon_pid, "engine_ms_per_token_unobserved": unobserved, "samples": []}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip().split(", ")
        res["gpu"], res["driver"] = q[0], q[1]
    except (OSError, IndexError):
        res["gpu"] = "none (cpu run)"
    t_start = time.monotonic()
    c_prev, t_prev = cpu_s(mon_pid), t_start
    while time.monotonic() - t_start < a.minutes * 60:
        time.sleep(15)
        now = time.monotonic()
        try:
            c = cpu_s(mon_pid)
        except OSError:
            res["monitor_died_at_min"] = round((now - t_start) / 60, 2)
            break
        res["samples"].append({"t_min": round((now - t_start) / 60, 2),
                               "monitor_cpu_pct": round(100 * (c - c_prev) / (now - t_prev), 1),
                               "monitor_rss_mb": round(rss_mb(mon_pid), 1), "engine_rss_mb": round(rss_mb(pid), 1),
                               "engine_ms_per_token": engine_ms(log_path, time.time() - 15),
                               "screen_kb": screen_bytes[0] // 1024})
        c_prev, t_prev = c, now
        print(json.dumps(res["samples"][-1]), flush=True)
        (out / "soak.json").write_text(json.dumps(res, indent=1))
    os.write(fd, b"q")
    t_q = time.monotonic()
    exited = None
    while time.monotonic() - t_q < 10:
        wpid, status = os.waitpid(mon_pid, os.WNOHANG)
        if wpid:
            exited = {"after_s": round(time.monotonic() - t_q, 2), "status": status}
            break
        time.sleep(0.1)
    if exited is None:
        os.kill(mon_pid, 9)
    stop.set()
    res["monitor_quit_on_q"] = exited
    time.sleep(3)
    r = subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "attach", str(pid), "--json", "--seconds", "6"],
                       capture_output=True, text=True, timeout=60)
    try:
        d = json.loads(r.stdout)
        res["after"] = {k: d.get(k) for k in ("ms_per_token", "launches_per_token", "gpu_busy_pct", "probe",
                                              "dropped_records", "errors", "windows")}
    except ValueError:
        res["after"] = {"rc": r.returncode, "stderr": r.stderr[-500:]}
    time.sleep(11)
    res["engine_ms_per_token_after_detach"] = engine_ms(log_path, time.time() - 10)
    eng.terminate()
    eng.wait(timeout=30)
    s = res["samples"]
    if s:
        steady = s[min(2, len(s) - 1):]
        res["summary"] = {
            "minutes": s[-1]["t_min"],
            "monitor_cpu_pct_median": sorted(x["monitor_cpu_pct"] for x in steady)[len(steady) // 2],
            "monitor_cpu_pct_max": max(x["monitor_cpu_pct"] for x in steady),
            "monitor_rss_mb_first_last": [steady[0]["monitor_rss_mb"], s[-1]["monitor_rss_mb"]],
            "engine_rss_mb_first_last": [steady[0]["engine_rss_mb"], s[-1]["engine_rss_mb"]],
            "engine_ms_per_token_first_last": [steady[0]["engine_ms_per_token"], s[-1]["engine_ms_per_token"]],
        }
    (out / "soak.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}), flush=True)


if __name__ == "__main__":
    main()
