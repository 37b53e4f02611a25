"""The live fault checks, on a real GPU engine (the CPU versions run in CI: tests/test_agent.py).

    bash scripts/h200.sh scripts/h200_faults.py OUTDIR

Each check starts the demo engine (Qwen3-0.6B shape) under `decodemon run`,
does one bad thing to it, and records what happened. Windows are made dense
(every 0.1 s, 16 tokens) so that a kill lands inside a traced window. Writes
OUTDIR/faults.json: device, driver, date, and per check the figures and ok.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from decodemon.monitor.demo import spawn_engine
from decodemon.probes.wire import socket_path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
OUT.mkdir(parents=True, exist_ok=True)
DM = [sys.executable, "-m", "decodemon.monitor.cli"]
DENSE = ["--window-period", "0.1", "--window-tokens", "16", "--window-min-tokens", "0"]
# FAULTS_CPU=1: a dry run of this script's logic on a CPU machine (tiny eager engine; no CUPTI, no windows)
CPU = os.environ.get("FAULTS_CPU") == "1"


def demo_args(mode, *extra):
    if CPU:
        return ["--mode", "eager", "--tiny", "--device", "cpu", *extra]
    return ["--mode", mode, *extra]


def engine(mode, *extra):
    log = open(OUT / f"engine_{mode}_{time.monotonic_ns()}.log", "w+")
    proc, pid = spawn_engine(demo_args(mode, "--tokens", "0", "--log-every", "0.5", *extra), stdout=log)
    return proc, pid, log


def log_rates(log, t0, t1):
    """Median ms/token of the engine's half-second log lines between unix times t0 and t1."""
    log.flush()
    xs = []
    for line in open(log.name):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if t0 <= d["t"] <= t1:
            xs.append(d["ms_median"])
    return round(statistics.median(xs), 4) if xs else None


def attach_json(pid, seconds, *extra):
    r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", str(seconds), *extra],
                       capture_output=True, text=True, timeout=120)
    try:
        return r.returncode, json.loads(r.stdout)
    except ValueError:
        return r.returncode, {"stderr": r.stderr.strip()[-500:]}


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def monitor_sigkilled_mid_window(mode):
    proc, pid, log = engine(mode)
    time.sleep(3)
    before = (time.time() - 2.5, time.time())
    mon = subprocess.Popen(DM + ["attach", str(pid), "--json", "--seconds", "60", *DENSE],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2.5)
    mon.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    mon.wait()
    served_after = None
    while time.monotonic() - killed < 10:
        rc, d = attach_json(pid, 0.3, "--no-trace", "--no-pm")
        if rc == 0:
            served_after = round(time.monotonic() - killed, 2)
            break
        time.sleep(0.1)
    time.sleep(3)
    after = (time.time() - 2.5, time.time())
    res = {"served_again_after_s": served_after, "ms_per_token_before": log_rates(log, *before),
           "ms_per_token_after": log_rates(log, *after), "engine_alive": proc.poll() is None}
    stop(proc)
    res["ok"] = bool(served_after is not None and served_after < 2.5 and res["engine_alive"]
                     and res["ms_per_token_after"] and res["ms_per_token_after"] < 1.05 * res["ms_per_token_before"])
    return res


def target_killed_mid_window(mode):
    proc, pid, log = engine(mode)
    time.sleep(2)
    rec = OUT.parent / f"cut_{mode}.dmon"
    r = subprocess.Popen(DM + ["record", str(pid), "-o", str(rec), "--seconds", "60", *DENSE],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    os.kill(pid, signal.SIGKILL)
    out, err = r.communicate(timeout=60)
    stop(proc)
    rep = subprocess.run(DM + ["replay", str(rec), "--json"], capture_output=True, text=True, timeout=120)
    d = json.loads(rep.stdout) if rep.returncode == 0 else {}
    res = {"record_rc": r.returncode, "record_said": (out + err).strip()[-300:], "replay_rc": rep.returncode,
           "replay_tokens": d.get("tokens"), "replay_windows": d.get("windows"), "ended": d.get("ended")}
    res["ok"] = bool(r.returncode == 0 and rep.returncode == 0 and d.get("tokens", 0) > 100
                     and "went away" in (d.get("ended") or ""))
    return res


def busy_garbage_and_profiler(mode):
    proc, pid, log = engine(mode, "--profiler-dir", str(OUT.parent / f"prof_{mode}"))
    time.sleep(2)
    res = {}
    first = subprocess.Popen(DM + ["attach", str(pid), "--json", "--seconds", "4"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    rc2, d2 = attach_json(pid, 1)
    out, _ = first.communicate(timeout=60)
    d1 = json.loads(out) if first.returncode == 0 else {}
    res["second_monitor"] = {"rc": rc2, "answer": d2.get("ended") or d2.get("stderr"),
                             "first_tokens": d1.get("tokens"), "first_launches_per_token": d1.get("launches_per_token")}
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(socket_path(pid)))
    s.sendall(b"\xff\x00\x00\x00" + os.urandom(64))
    s.settimeout(5)
    try:
        while s.recv(4096):
            pass
    except OSError:
        pass
    s.close()
    rc3, d3 = attach_json(pid, 2)
    res["garbage"] = {"engine_alive": proc.poll() is None, "next_attach_rc": rc3, "next_tokens": d3.get("tokens")}
    # CUPTI trouble inside the target: torch.profiler (kineto) holds CUPTI while decodemon attaches
    prof = OUT.parent / f"prof_{mode}"
    os.kill(pid, signal.SIGUSR1)
    t0 = time.monotonic()
    while not (prof / "profiler0.start").exists() and time.monotonic() - t0 < 30:
        time.sleep(0.05)
    time.sleep(0.5)
    rc4, d4 = attach_json(pid, 2)
    os.kill(pid, signal.SIGUSR1)
    while not (prof / "profiler0.json").exists() and time.monotonic() - t0 < 240 and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(1)
    pj = json.loads((prof / "profiler0.json").read_text()) if (prof / "profiler0.json").exists() else {}
    res["cupti_contention"] = {"rc": rc4, "profiler_kernels_per_token": pj.get("kernels_per_token"), "probe": d4.get("probe"), "errors": d4.get("errors"),
                               "launches_per_token": d4.get("launches_per_token"), "tokens": d4.get("tokens"),
                               "engine_alive": proc.poll() is None}
    rc5, d5 = attach_json(pid, 3)
    res["after_profiler"] = {"rc": rc5, "tokens": d5.get("tokens"), "engine_alive": proc.poll() is None}
    stop(proc)
    res["ok"] = bool(rc2 == 3 and "busy" in str(res["second_monitor"]["answer"]) and rc3 == 0
                     and res["garbage"]["engine_alive"] and (d3.get("tokens") or 0) > 0
                     and res["cupti_contention"]["engine_alive"] and res["after_profiler"]["engine_alive"])
    return res


def tokens_identical(mode, n):
    cmd = [sys.executable, "-m", "decodemon.engine_adapter.demo",
           *demo_args(mode, "--tokens", str(n * (20 if CPU else 1)), "--print-tokens", "--json")]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    ref = json.loads(plain.stdout.strip().splitlines()[-1])["token_ids"]
    out = open(OUT / f"watched_{mode}.out", "w+")
    proc, pid = spawn_engine(cmd[3:], stdout=out)
    rc, d = attach_json(pid, 3, *DENSE)
    proc.wait(timeout=300)
    out.seek(0)
    watched = json.loads(out.read().strip().splitlines()[-1])["token_ids"]
    return {"tokens": len(ref), "identical": ref == watched, "attach_rc": rc, "windows_during": d.get("windows"),
            "ok": ref == watched and rc == 0 and ((d.get("windows") or 0) > 0 or CPU)}


def main():
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "bash scripts/h200.sh scripts/h200_faults.py OUT"}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip().split(", ")
    except OSError:
        q = ["no GPU (dry run)" if CPU else "?", "-"]
    env["gpu"], env["driver"] = (q + ["?", "?"])[:2]
    res = {"env": env}
    checks = [("monitor_sigkilled_mid_window_graph", monitor_sigkilled_mid_window, ("graph",)),
              ("monitor_sigkilled_mid_window_eager", monitor_sigkilled_mid_window, ("eager",)),
              ("target_killed_mid_window_graph", target_killed_mid_window, ("graph",)),
              ("busy_garbage_cupti_contention_graph", busy_garbage_and_profiler, ("graph",)),
              ("tokens_identical_graph", tokens_identical, ("graph", 2000)),
              ("tokens_identical_eager", tokens_identical, ("eager", 300))]
    for name, f, args in checks:
        t0 = time.monotonic()
        try:
            res[name] = f(*args)
        except Exception as exc:
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        res[name]["wall_s"] = round(time.monotonic() - t0, 1)
        print(name, json.dumps(res[name])[:600], flush=True)
        (OUT / "faults.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
