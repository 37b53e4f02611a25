"""The bundled recordings and the device checks behind them, made on a GPU machine in one call.

    source benchmarks/device_setup.sh && python benchmarks/capture.py OUTDIR

Smoke-runs the demo engine in both modes (the same 64 tokens, eager and graphed), records 21 s of each
(h200_eager.dmon, h200_graph.dmon) with three attach/detach cycles around the recording, then records the
Llama-8B shape graphed (h200_llama8b_graph.dmon) and a 12-block streaming kernel (h200_narrow12_graph.dmon), and
replays each with `decodemon replay --json`. Writes the recordings and capture.tar.gz (logs, JSON summaries,
versions) under OUTDIR. CAPTURE_QUICK=1: the eager and graph recordings only. CAPTURE_API_EVERY=1: recordings whose
windows alternate between launch calls traced and kernels only (h200_eager_api2.dmon, h200_graph_api2.dmon).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
LOGS = Path("/tmp/decodemon-capture-logs")
LOGS.mkdir(parents=True, exist_ok=True)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.pythons import DM, engine_env  # noqa: E402
from harness.pythons import ENGINE_PY as PY  # noqa: E402

DEMO = [PY, "-m", "decodemon.engine_adapter.demo"]
summary: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def sh(cmd, name, timeout=300):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=engine_env(cmd))
    (LOGS / f"{name}.out").write_text(r.stdout)
    (LOGS / f"{name}.err").write_text(r.stderr)
    print(f"[{time.time() - t0:6.1f}s] {name}: rc={r.returncode} {r.stderr.strip().splitlines()[-1:] }", flush=True)
    return r


def start_engine(name, args):
    log = open(LOGS / f"{name}.engine.out", "w")
    err = open(LOGS / f"{name}.engine.err", "w")
    pidf = LOGS / f"{name}.pid"
    p = subprocess.Popen(DM + ["run", "--pid-file", str(pidf), "--"] + DEMO + args + ["--tokens", "0", "--log-every", "0.5"],
                         stdout=log, stderr=err, env=engine_env(DEMO))
    t0 = time.time()
    while time.time() - t0 < 180:
        if "decoding" in (LOGS / f"{name}.engine.err").read_text():
            break
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited: {(LOGS / f'{name}.engine.err').read_text()[-2000:]}")
        time.sleep(0.5)
    pid = int(pidf.read_text())
    print(f"engine {name} pid {pid} ready after {time.time() - t0:.1f}s", flush=True)
    return p, pid


def stop_engine(p):
    p.terminate()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()


def live_cycle(mode):
    """Unobserved baseline, attach --json, record, three attach/detach cycles, unobserved again."""
    p, pid = start_engine(mode, ["--mode", mode])
    pm_opts: list[str] = []  # --no-pm once an engine died with PM armed
    ev = []
    time.sleep(3)
    ev.append(("unobserved", time.time()))
    time.sleep(3)
    ev.append(("attach_json", time.time()))
    r = sh(DM + ["attach", str(pid), "--json", "--seconds", "8"], f"{mode}.attach")
    ev.append(("after_attach", time.time()))
    summary[f"{mode}_attach"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr
    if p.poll() is not None:  # the probe must never take the target down: record it, then go on without PM
        summary[f"{mode}_engine_died_with_pm"] = (LOGS / f"{mode}.engine.err").read_text()[-1500:]
        print(f"!!! {mode} engine died while attached; retrying with --no-pm", flush=True)
        pm_opts = ["--no-pm"]
        p, pid = start_engine(mode + "_nopm", ["--mode", mode])
    time.sleep(2)
    ev.append(("record", time.time()))
    sh(DM + ["record", str(pid), "-o", str(OUT / f"h200_{mode}.dmon"), "--seconds", "21", *pm_opts],
       f"{mode}.record")
    for k in range(3):
        ev.append((f"cycle{k}_attached", time.time()))
        sh(DM + ["attach", str(pid), "--json", "--seconds", "4", *pm_opts], f"{mode}.cycle{k}")
        ev.append((f"cycle{k}_detached", time.time()))
        time.sleep(3)
    ev.append(("end", time.time()))
    stop_engine(p)
    summary[f"{mode}_events"] = ev


def record_only(name, args, seconds=21, probe_opts=()):
    p, pid = start_engine(name, args)
    time.sleep(3)
    sh(DM + ["record", str(pid), "-o", str(OUT / f"h200_{name}.dmon"), "--seconds", str(seconds), *probe_opts],
       f"{name}.record")
    r = sh(DM + ["replay", str(OUT / f"h200_{name}.dmon"), "--json"], f"{name}.replay")
    summary[f"{name}_replay"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr
    stop_engine(p)


def quick():
    """Only the eager and graph recordings (a short device call)."""
    for mode in ("eager", "graph"):
        record_only(mode, ["--mode", mode], seconds=15)
    (LOGS / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    with tarfile.open(OUT / "capture.tar.gz", "w:gz") as tf:
        tf.add(LOGS, arcname="logs")
    for mode in ("eager", "graph"):
        v = summary.get(f"{mode}_replay")
        print(mode, {x: v.get(x) for x in ("ms_per_token", "gpu_busy_pct", "sm_active_pct", "dram_pct", "ceiling",
                                           "probe")} if isinstance(v, dict) else v)


def api_every():
    """Recordings whose windows alternate: runtime-API records in one, kernels only in the next (api_every=2,
    a window a second), so a test can check what kernels-only windows say against the full ones of the same
    process: h200_eager_api2.dmon, h200_graph_api2.dmon."""
    opts = ["--probe", "api_every=2", "--probe", "window_period_s=1", "--probe", "window_max_s=1",
            "--probe", "window_min_tokens=0"]
    for mode in ("eager", "graph"):
        record_only(f"{mode}_api2", ["--mode", mode], seconds=8, probe_opts=opts)
    (LOGS / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    with tarfile.open(OUT / "capture.tar.gz", "w:gz") as tf:
        tf.add(LOGS, arcname="logs")


def main():
    if os.environ.get("CAPTURE_QUICK"):
        return quick()
    if os.environ.get("CAPTURE_API_EVERY"):
        return api_every()
    env = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
              "--format=csv,noheader"], "nvidia-smi")
    summary["nvidia_smi"] = env.stdout.strip()
    vers = sh([PY, "-c", "import torch,sys,importlib.metadata as m; print(sys.version.split()[0], torch.__version__, "
               "m.version('cupti-python'), m.version('nvidia-cuda-cupti'), m.version('msgspec'))"], "versions")
    summary["versions"] = vers.stdout.strip()
    toks = {}
    for mode in ("eager", "graph"):
        r = sh(DEMO + ["--mode", mode, "--tokens", "64", "--print-tokens", "--json"], f"smoke.{mode}")
        if r.returncode == 0:
            toks[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    if len(toks) == 2:
        summary["tokens_identical"] = toks["eager"]["token_ids"] == toks["graph"]["token_ids"]
        summary["smoke"] = {m: {k: v for k, v in t.items() if k != "token_ids"} for m, t in toks.items()}
    print("smoke:", json.dumps(summary.get("smoke")), "identical:", summary.get("tokens_identical"), flush=True)
    live_cycle("eager")
    live_cycle("graph")
    record_only("llama8b_graph", ["--mode", "graph", "--shape", "llama-8b"])
    record_only("narrow12_graph", ["--mode", "graph", "--narrow-blocks", "12", "--narrow-mb", "1024"])
    for mode in ("eager", "graph"):
        r = sh(DM + ["replay", str(OUT / f"h200_{mode}.dmon"), "--json"], f"{mode}.replay")
        summary[f"{mode}_replay"] = json.loads(r.stdout) if r.returncode == 0 else r.stderr
    summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    (LOGS / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    with tarfile.open(OUT / "capture.tar.gz", "w:gz") as tf:
        tf.add(LOGS, arcname="logs")
    for k in ("eager_replay", "graph_replay", "llama8b_graph_replay", "narrow12_graph_replay"):
        v = summary.get(k)
        if isinstance(v, dict):
            print(k, {x: v.get(x) for x in ("ms_per_token", "kernels_per_token", "kernel_sum_ms_per_token",
                                            "gpu_busy_pct", "sm_active_pct", "dram_pct", "ceiling", "verdict")})
        else:
            print(k, str(v)[-500:])


if __name__ == "__main__":
    main()
