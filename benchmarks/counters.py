"""The device-wide counters read from decodemon's own process, held against loops of known bytes, on a GPU machine.

    source benchmarks/device_setup.sh && python benchmarks/counters.py OUTDIR [--cases a,b,...] [--record-s 6]

Each case starts with plain `python3` (or as a plain binary) and is attached by pid as a new user would: one
`decodemon attach PID --json --seconds ATTACH_S` (the first attach: the agent is loaded), then `decodemon record
PID -o OUTDIR/CASE.dmon --seconds RECORD_S`, replayed with `decodemon replay --json`. The loop's own clock (its
token log, or the C++ loop's printed rate) over the recorded seconds is the truth the figures are held against:

- bytes per step, measured (PM's DRAM bytes), against the bytes the step must move by construction;
- for the C++ loop (no Python, no clock decodemon can read): GPU busy and DRAM GB/s against its own;
- where PM was read (the sidecar), which libcupti it loaded, and the agent's own CPU a second.

Cases: cuda_loop (8 GiB a step, built with nvcc), reduce1.5 and reduce8.6 (a CUDA graph reducing 1.5 or 8.6 GB a
step, with `_marks`: decodemon's mark_token after each), kv262k (a Llama-1B-shaped step over 262,144 cached
positions: 2.47 GB of weights and 8.59 GB of KV, graphed, its attention as transformers runs it; `_mm`: as three
kernels, the scores through DRAM; `_marks` as above; `_profile`: torch.profiler's kernels and kernel time a step, no
decodemon), compiled8b_marks (gpt-fast's torch.compile reduce-overhead loop of a Llama-8B shape that marks at
enqueue: five records of 5 s in a row; `_profile`: its torch.profiler count). Everything lands in
OUTDIR/counters.json, with a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "benchmarks" / "loops"
from harness.pythons import DM, engine_env  # noqa: E402
from harness.pythons import ENGINE_PY as PY  # noqa: E402
RECORDS = 5  # records in a row of the compiled loop (--records)
CASES = ("cuda_loop", "reduce1.5", "reduce1.5_marks", "reduce8.6", "reduce8.6_marks", "kv262k", "kv262k_marks",
         "kv262k_profile", "kv262k_mm_marks", "compiled8b_marks", "compiled8b_profile")


def case_argv(case: str, log: Path) -> list[str]:
    """The loop's command line: plain python or the plain binary, nothing of decodemon in its start."""
    if case.startswith("compiled8b"):
        extra = ["--profile-steps", "20", "--profile-out", str(log.with_suffix(".profile.json"))] \
            if case.endswith("_profile") else []
        return [PY, str(LOOPS / "compiled_decode.py"), "--shape", "llama-8b", "--marks", "--log", str(log), *extra]
    if case == "cuda_loop":
        exe = Path("/tmp/decodemon_cuda_loop")
        if not exe.exists():
            subprocess.run(["nvcc", "-O2", "-arch=sm_90", "-o", str(exe), str(LOOPS / "cuda_loop.cu")], check=True)
        return [str(exe), "8", "600"]
    kind, *rest = case.split("_")
    argv = [PY, str(LOOPS / "known_bytes.py"), "--log", str(log)]
    argv += ["--kv", "262144"] if kind == "kv262k" else ["--gb", kind.removeprefix("reduce")]
    if "mm" in rest:
        argv += ["--attn", "matmul"]
    if "marks" in rest:
        argv.append("--marks")
    if "profile" in rest:
        argv += ["--profile-steps", "50", "--profile-out", str(log.with_suffix(".profile.json"))]
    return argv


def dm(*args, timeout: float = 120) -> tuple[dict | None, str, float, float]:
    """`decodemon ARGS`: (its JSON, or None; stderr's tail; wall start; wall end)."""
    t0 = time.time()
    r = subprocess.run([*DM, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    t1 = time.time()
    try:
        return json.loads(r.stdout), r.stderr.strip()[-400:], t0, t1
    except ValueError:
        return None, (r.stderr or r.stdout).strip()[-400:], t0, t1


def own_figures(case: str, log: Path, out_log: Path, t0: float, t1: float) -> dict:
    """The loop's own clock over [t0, t1]: median ms a step (and the C++ loop's GB/s)."""
    if case == "cuda_loop":
        rows = [json.loads(x) for x in out_log.read_text().splitlines() if x.startswith("{\"t\"")]
        rows = [r for r in rows if t0 + 1 <= r["t"] <= t1]
        if not rows:
            return {}
        return {"ms_per_step": statistics.median(r["ms_per_step"] for r in rows),
                "gbs": statistics.median(r["gbs"] for r in rows), "seconds": len(rows)}
    times: list[float] = []
    for line in log.read_text().splitlines() if log.exists() else ():
        times.extend(json.loads(line).get("t", []))
    times = sorted(t for t in times if t0 <= t <= t1)
    if len(times) < 3:
        return {}
    d = [(b - a) * 1e3 for a, b in zip(times, times[1:])]
    return {"ms_per_step": statistics.median(d), "steps": len(d)}


def known_bytes(out_log: Path, log: Path) -> dict:
    """The first JSON line the loop printed: the bytes its step must move, by construction."""
    for p in (log, out_log):
        if p.exists():
            for line in p.read_text().splitlines():
                if "known_bytes_per_step" in line:
                    return json.loads(line)
    return {}


def run_case(case: str, out: Path, attach_s: float, record_s: float, warm_s: float) -> dict:
    """One loop: start it, attach, record, replay, read its own clock; stop it."""
    log, out_log = out / f"{case}.tokens.jsonl", out / f"{case}.out"
    argv = case_argv(case, log)
    res: dict = {"case": case, "argv": " ".join(argv[1:])}
    with open(out_log, "w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, text=True,
                                env=engine_env(argv))
    try:
        t0 = time.time()
        while not (known_bytes(out_log, log) if not case.startswith("compiled8b") else
                   (log.exists() and log.stat().st_size) or log.with_suffix(".profile.json").exists()):
            if (proc.poll() is not None and not case.endswith("_profile")) or time.time() - t0 > 240:
                res["error"] = f"exited {proc.returncode}: {out_log.read_text()[-600:]}"
                return res
            time.sleep(0.5)
        res.update(known=known_bytes(out_log, log))
        if case.endswith("_profile"):
            proc.wait(timeout=300)
            p = log.with_suffix(".profile.json")
            res["profile"] = json.loads(p.read_text()) if p.exists() else None
            return res
        time.sleep(warm_s)
        if case.startswith("compiled8b"):  # five records in a row, each against the loop's own clock
            res["records"] = []
            for k in range(1, RECORDS + 1):
                rec = out / f"{case}_{k}.dmon"
                _, err, r0, r1 = dm("record", proc.pid, "-o", rec, "--seconds", 5)
                j, err2, *_ = dm("replay", rec, "--json") if rec.exists() else (None, err, 0, 0)
                time.sleep(1.0)
                res["records"].append({"record": _figures(j) if j else {"error": err2 or err},
                                       "own": own_figures(case, log, out_log, r0, r1)})
            return res
        j, err, a0, a1 = dm("attach", proc.pid, "--json", "--seconds", attach_s)
        res["attach"] = _figures(j) if j else {"error": err}
        rec = out / f"{case}.dmon"
        _, err, r0, r1 = dm("record", proc.pid, "-o", rec, "--seconds", record_s)
        j, err2, *_ = dm("replay", rec, "--json") if rec.exists() else (None, err, 0, 0)
        res["record"] = _figures(j) if j else {"error": err2 or err}
        time.sleep(1.5)  # the C++ loop prints once a second: the record's last second
        res["own"] = own_figures(case, log, out_log, r0, r1)
        if j:
            (out / f"{case}.replay.json").write_text(json.dumps(j, indent=1))
        sidecars = subprocess.run(["pgrep", "-f", "decodemon.monitor.counters.sampler"], capture_output=True, text=True)
        res["sidecars_left"] = sidecars.stdout.split()
    finally:
        _stop(proc)
    return res


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the loop's process group, SIGKILL after 20 s; quiet if it already ended."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _figures(j: dict) -> dict:
    """What a summary says that this run checks."""
    p = j.get("probe") or {}
    keys = ("tokens", "ms_per_token", "token_clock", "bytes_per_token", "bytes_per_token_measured",
            "bytes_per_token_model", "bandwidth_gbs", "bandwidth_source", "gpu_busy_pct", "gpu_busy_source",
            "pm_gpu_busy_pct", "sm_active_pct", "dram_pct", "dram_gbs", "kernel_sum_ms_per_token",
            "kernels_per_token", "verdict", "windows", "ended", "observer_cost")
    out = {k: j.get(k) for k in keys}
    out.update(pm=p.get("pm"), agent_cpu_ms_per_s=p.get("agent_cpu_ms_per_s"), trace=p.get("trace"))
    return out


def table(results: list[dict]) -> str:
    """One line a case: known bytes against measured, own clock against decodemon's, PM's word."""
    lines = ["case | known GB/step | measured GB/token | ratio | own ms | dm ms | busy % | DRAM GB/s | own GB/s | "
             "agent ms/s | verdict"]
    for r in results:
        rec, own, k = r.get("record") or {}, r.get("own") or {}, r.get("known") or {}
        if "profile" in r:
            lines.append(f"{r['case']} | profile {r['profile']}")
            continue
        for k, x in enumerate(r.get("records") or (), 1):
            f, own = x["record"], x["own"]
            lines.append(f"{r['case']} #{k} | own {own.get('ms_per_step', 0):.3f} ms | dm {f.get('ms_per_token')} ms "
                         f"{f.get('token_clock')} | kernels {f.get('kernel_sum_ms_per_token')} ms, "
                         f"{f.get('kernels_per_token')} launches | bytes {f.get('bytes_per_token_measured')} | "
                         f"{f.get('verdict')} {f.get('error') or ''}")
        if r.get("records"):
            continue
        kb = k.get("known_bytes_per_step")
        mb = rec.get("bytes_per_token_measured")
        ratio = f"{mb / kb:.3f}" if kb and mb else "-"
        lines.append(" | ".join(str(x) for x in (
            r["case"], f"{kb / 1e9:.3f}" if kb else "-", f"{mb / 1e9:.3f}" if mb else "-", ratio,
            f"{own.get('ms_per_step', 0):.3f}", rec.get("ms_per_token"), rec.get("pm_gpu_busy_pct"),
            rec.get("dram_gbs"), own.get("gbs", "-"), (r.get("attach") or {}).get("agent_cpu_ms_per_s"),
            rec.get("verdict"))))
        if rec.get("error") or r.get("error"):
            lines.append(f"   error: {rec.get('error') or r.get('error')}")
        lines.append(f"   pm: {rec.get('pm')}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--attach-s", type=float, default=4.0)
    ap.add_argument("--record-s", type=float, default=6.0)
    ap.add_argument("--warm-s", type=float, default=3.0)
    ap.add_argument("--records", type=int, default=RECORDS, help="records in a row of the compiled loop")
    a = ap.parse_args()
    globals()["RECORDS"] = a.records
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in a.cases.split(","):
        t = time.time()
        try:
            results.append(run_case(case, out, a.attach_s, a.record_s, a.warm_s))
        except Exception as exc:  # noqa: BLE001 - one case's failure is its row, the others still run
            results.append({"case": case, "error": f"{type(exc).__name__}: {exc}"})
        print(f"[{time.time() - t:5.1f}s] {case}: {json.dumps(results[-1])[:1500]}", flush=True)
        (out / "counters.json").write_text(json.dumps(results, indent=1))
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
