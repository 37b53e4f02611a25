"""Tensor parallel on a machine with two GPUs: TP=1 and TP=2 recordings, decodemon's all-reduce µs per call against
a CUDA-event microbenchmark at the same payload, each rank's verdict, and the serial fraction, in one command.

    source benchmarks/device_setup.sh && python benchmarks/tensor_parallel.py OUT [--seconds 12] [--modes eager,graph]
        [--shape llama-8b]                                                      (two GPUs, NVLink multicast off)
    TP_CPU=1 python benchmarks/tensor_parallel.py OUT --seconds 3                  (a CPU dry run over gloo)

For each mode and TP degree (1, 2) it starts the demo engine (`--tp N`), takes one `decodemon attach PID --json`
(the group view from rank 0) and records every rank at once (`decodemon record`, each rank's first window
staggered so one rank is traced at a time), then stops the engine. Then `decodemon allreduce --payload-bytes P
--tp 2 --json` at the payload the TP=2 engine reported, spaced by the GEMVs whose outputs a decode reduces, and
`decodemon scaling` on the two rank-0 recordings. Writes OUT/tp_check.json (per rank: decodemon's µs per call
against the microbenchmark's, the ratio and whether it is within 10%, the verdict and COMM's share; the serial
fraction) and OUT/h200_tp{1,2}_{mode}[_{shape}]_rank{r}.dmon. `--extra-payloads` adds microbenchmark payloads;
with `--modes ""` it starts no engine.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
DM = [PY, "-m", "decodemon.monitor.cli"]
CPU = os.environ.get("TP_CPU") == "1"
ENV = dict(os.environ, NCCL_NVLS_ENABLE="0")


def run_json(cmd: list[str], timeout: float) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or r.stdout.strip())[-800:], "rc": r.returncode}
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": f"not JSON: {r.stdout[-300:]}"}


def one_run(mode: str, tp: int, out: Path, seconds: float, shape: str) -> dict:
    from decodemon.monitor.demo import spawn_engine
    from decodemon.monitor.ranks import discover_ranks

    dev = ["--tiny", "--device", "cpu"] if CPU else []
    tag = "" if shape == "qwen3-0.6b" else "_" + shape.replace("-", "")
    eng, pid = spawn_engine(dev + ["--mode", "eager" if CPU else mode, "--tokens", "0", "--tp", str(tp)]
                            + ([] if CPU else ["--shape", shape]),
                            timeout_s=240, env=ENV)
    time.sleep(2)
    try:
        ranks = discover_ranks(pid)
        res = {"mode": mode, "tp": tp, "rank_pids": ranks}
        res["attach"] = run_json(DM + ["attach", str(pid), "--json", "--seconds", str(seconds)], seconds + 120)
        recs = []
        for r, rp in enumerate(ranks):
            f = out / f"h200_tp{tp}_{mode}{tag}_rank{r}.dmon"
            # one rank traced at a time, as `attach` staggers a group: rank r's first window r/N of a period later
            stagger = ["--probe", f"first_window_s={0.5 + r * 4.0 / len(ranks):g}"]
            recs.append((f, subprocess.Popen(DM + ["record", str(rp), "-o", str(f), "--seconds", str(seconds)]
                                             + stagger,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)))
        res["recordings"] = []
        for f, p in recs:
            _, e = p.communicate(timeout=seconds + 120)
            res["recordings"].append({"file": f.name, "rc": p.returncode, "stderr": e.strip()[-300:]})
        return res
    finally:
        eng.send_signal(signal.SIGTERM)
        try:
            eng.wait(timeout=60)
        except subprocess.TimeoutExpired:
            eng.kill()


def rank_rows(attach: dict) -> list[dict]:
    g = attach.get("group")
    if g:
        return g["ranks"]
    return [{"tp_rank": 0, "ms_per_token": (attach.get("tokens") or {}).get("ms_per_token"),
             "verdict": (attach.get("diagnosis") or {}).get("ceiling"), "collectives": attach.get("collectives")}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--modes", default="eager")
    ap.add_argument("--shape", default="qwen3-0.6b")
    ap.add_argument("--extra-payloads", default="", help="comma-separated bytes: more microbenchmarks")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    q = ["cpu (gloo)", "-"] if CPU else subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True).stdout.strip().splitlines()
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpus": q,
           "command": "python benchmarks/tensor_parallel.py OUT " + " ".join(sys.argv[2:]), "modes": {}}

    def save():
        (out / "tp_check.json").write_text(json.dumps(res, indent=1, ensure_ascii=False))

    bench_cmd = ["allreduce", "--tp", "2", "--json", "--iters", "400"] + ([] if CPU else ["--profile-kernels"]) + (["--device", "cpu"] if CPU else ["--device", "cuda"])
    res["shape"] = a.shape
    for p in filter(None, a.extra_payloads.split(",")):
        res.setdefault("extra_microbenchmarks", {})[p] = run_json(DM + bench_cmd + ["--payload-bytes", p], 600)
        save()
    tag = "" if a.shape == "qwen3-0.6b" else "_" + a.shape.replace("-", "")
    for mode in filter(None, a.modes.split(",")):
        m = res["modes"][mode] = {}
        for tp in (1, 2):
            try:
                m[f"tp{tp}"] = one_run(mode, tp, out, a.seconds, a.shape)
            except Exception as exc:
                m[f"tp{tp}"] = {"error": f"{type(exc).__name__}: {exc}"[-1500:]}
            save()
        two = m.get("tp2", {}).get("attach", {})
        rows = rank_rows(two) if "error" not in two and two else []
        payload = next((r["collectives"].get("payload_bytes") for r in rows if r.get("collectives")), None)
        if payload:
            # the GEMVs whose outputs the decode reduces, one rank's shard: o_proj and down_proj
            from decodemon.engine_adapter.model import SHAPES

            sh = SHAPES["tiny" if CPU else a.shape]
            spacers = f"{sh.q_heads * sh.head_dim // 2},{sh.ffn // 2}"
            bench = run_json(DM + bench_cmd + ["--payload-bytes", str(int(payload)), "--spacer-in", spacers], 600)
            m["microbenchmark"] = bench
            ref = (bench.get("sizes") or {}).get("1", {}).get("us_per_call")
            group = two.get("group") or {}
            m["group_check"] = {"last_to_arrive_rank": group.get("last_to_arrive_rank"),
                                "decodemon_us_per_call": group.get("collective_us_per_call"),
                                "microbenchmark_us_per_call": ref,
                                "ratio": round(group["collective_us_per_call"] / ref, 3)
                                if group.get("collective_us_per_call") and ref else None}
            m["check"] = []
            for r in rows:
                c = r.get("collectives") or {}
                us = c.get("us_per_call")
                m["check"].append({"tp_rank": r.get("tp_rank"), "source": c.get("source"), "decodemon_us_per_call": us,
                                   "decodemon_kernel_us_per_call": c.get("kernel_us_per_call"),
                                   "decodemon_launch_gap_us_per_call": c.get("launch_gap_us_per_call"),
                                   "microbenchmark_kernel_us_profiler": (bench.get("sizes") or {}).get("1", {})
                                   .get("kernel_us_profiler"),
                                   "microbenchmark_us_per_call": ref,
                                   "ratio": round(us / ref, 3) if us and ref else None,
                                   "within_10pct": bool(us and ref and abs(us / ref - 1) <= 0.10),
                                   "calls_per_token": c.get("calls_per_token"),
                                   "counted_per_token": c.get("counted_per_token"),
                                   "share_of_step_pct": c.get("share_of_step_pct"), "verdict": r.get("verdict")})
        f1, f2 = out / f"h200_tp1_{mode}{tag}_rank0.dmon", out / f"h200_tp2_{mode}{tag}_rank0.dmon"
        if f1.exists() and f2.exists():
            m["scaling"] = run_json(DM + ["scaling", str(f1), str(f2), "--json"], 120)
        save()
    print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk in ("check", "scaling")}
                      for k, v in res["modes"].items()}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
