"""Decode loops that carry no line of decodemon, watched as a new user would: does the verdict come out right?

    python benchmarks/unmodified.py OUTDIR [--cases hf_eager,hf_static,compiled_8b,demo] [--profile] [--cost]

Each case starts a loop from benchmarks/loops (or the demo engine with `--no-marks`) under `decodemon run`,
waits for it to decode, records it (`decodemon record PID -o OUTDIR/CASE.dmon`), attaches five more times
(`decodemon attach PID --json --seconds 2`: the first verdict and PM re-arming), and reads the loop's own token
log over the recorded seconds. A case ending in `_plain` starts with plain python and is loaded by injection first:
the loop's slowest token while the agent loads, during its first attach, and its ms/token before the injection
against after the last detach. `--probe KEY=VALUE` goes to every record and attach. `--profile` also runs each
loop once under torch.profiler for its kernels and kernel time per step; `--cost` runs interleaved
unobserved/attached phases on the compiled loop and prints the median cost. Everything lands in
OUTDIR/summary.json; the recordings are what tests/data keeps.
On a machine with no GPU the cases run their tiny CPU shapes (`--tiny`), which is how the tests run this file.
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
PROBE: list[str] = []  # --probe KEY=VALUE arguments given to every record and attach (main's --probe)
ATTACH_S = 2.0  # each re-attach's seconds (--attach-s)
INJECTED_IDLE_S = 3.0  # seconds between the injection and the first attach
AFTER_S = 15.0  # seconds the loop runs detached at the end, against as many before the injection
PLAIN_WARM_S = 20.0  # a loop started with plain python decodes this long before the injection (its first
#                      seconds of generate() are slower: they would be the median the injection is held against)


def case_argv(case: str, tiny: bool, log: str) -> list[str]:
    """The loop's command line for a case."""
    dev = ["--device", "cpu"] if tiny else []
    shape = "tiny" if tiny else None
    if case == "hf_eager":
        return [PY, str(LOOPS / "hf_generate.py"), "--shape", shape or "qwen3-0.6b", "--log", log, *dev]
    if case == "hf_static":
        return [PY, str(LOOPS / "hf_generate.py"), "--shape", shape or "qwen3-0.6b", "--cache", "static",
                "--log", log, *dev]
    if case == "compiled_8b":
        return [PY, str(LOOPS / "compiled_decode.py"), "--shape", shape or "llama-8b", "--log", log, *dev,
                *(["--batch", "20", "--max-len", "64"] if tiny else [])]
    mode, marks = case.split("_")[1:]  # demo_eager_nomarks, demo_graph_marks, ...
    return [PY, "-m", "decodemon.engine_adapter.demo", "--mode", mode, "--tokens", "0",
            *(["--no-marks"] if marks == "nomarks" else []), *(["--tiny", "--device", "cpu"] if tiny else [])]


def start(argv: list[str], log_path: Path | None, warm_s: float, plain: bool = False,
          engine_log: Path | None = None) -> subprocess.Popen:
    """`decodemon run -- argv` (plain: argv as it is, no agent); returns once the loop has logged tokens. The
    loop's own output goes to `engine_log`."""
    sink = open(engine_log, "w") if engine_log else subprocess.DEVNULL
    env = engine_env(argv)
    if engine_log:  # the agent's event log (probes/eventlog.py) beside the loop's own
        env["DECODEMON_AGENT_EVENTS"] = str(engine_log.with_suffix(".events"))
    proc = subprocess.Popen(argv if plain else [*DM, "run", "--", *argv], stdout=sink,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    t0 = time.time()
    while time.time() - t0 < warm_s:
        if proc.poll() is not None:
            tail = engine_log.read_text()[-2000:] if engine_log else ""
            raise RuntimeError(f"{argv[1]} exited with {proc.returncode}: {tail}")
        if log_path is not None and log_path.exists() and log_path.stat().st_size > 0:
            return proc
        if log_path is None and time.time() - t0 > min(warm_s, 20):
            return proc
        time.sleep(0.5)
    raise RuntimeError(f"{argv[1]} did not decode within {warm_s:.0f} s")


def child_pid(proc: subprocess.Popen, plain: bool = False) -> int:
    """The loop's pid: `decodemon run` execs nothing, it starts the loop as its child."""
    if plain:
        return proc.pid
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    return int(kids[0])


def cli_json(*args, timeout: float = 120) -> tuple[dict | None, str]:
    """Run `decodemon ARGS --json`; (parsed stdout, stderr)."""
    r = subprocess.run([*DM, *map(str, args), "--json"], capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(r.stdout), r.stderr.strip()
    except ValueError:
        return None, (r.stderr or r.stdout).strip()[-500:]


def logged_times(path: Path) -> list[float]:
    """Every token's time (unix s) the loop logged."""
    out: list[float] = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.extend(json.loads(line)["t"])
            except (ValueError, KeyError):
                pass
    return out


def rate(times: list[float], t0: float, t1: float) -> dict:
    """The loop's own count and ms/token between two moments."""
    inside = [t for t in times if t0 <= t <= t1]
    ms = 1e3 * (inside[-1] - inside[0]) / (len(inside) - 1) if len(inside) > 1 else None
    return {"tokens": len(inside), "ms_per_token": ms}


def injection(pid: int) -> dict:
    """Load the agent into a loop started with plain python (decodemon.monitor.inject, what `attach` does first),
    wait, then attach: when the injection began and ended and when the attach began (`slowest_during` reads the
    loop's log for those moments once the loop has written it)."""
    from decodemon.monitor.inject import InjectError, inject

    t0 = time.time()
    try:
        inject(pid)
        err = ""
    except InjectError as exc:
        err = str(exc)
    ready = time.time()
    time.sleep(INJECTED_IDLE_S)  # the loop decodes beside the dormant agent
    t_attach = time.time()
    j, err2 = cli_json("attach", pid, "--seconds", 3, *PROBE)
    return {"attach": j, "error": err or (err2 if j is None else ""), "t0": t0, "ready": ready,
            "attach_t0": t_attach}


def slowest_during(times: list[float], t0: float, t1: float, base_t: float | None = None) -> dict:
    """The loop's slowest token ending in [t0, t1] against its median token in the 10 s before `base_t` (t0)."""
    base_t = t0 if base_t is None else base_t
    prior = [b - a for a, b in zip(times, times[1:]) if base_t - 10 <= a and b < base_t]
    during = [b - a for a, b in zip(times, times[1:]) if t0 <= b <= t1]
    med = statistics.median(prior) if prior else None
    return {"seconds": round(t1 - t0, 3), "median_ms": med and 1e3 * med,
            "slowest_ms": during and 1e3 * max(during),
            "slowest_over_median": (max(during) / med) if (during and med) else None}


def logged_generations(path: Path) -> list[list[float]]:
    """Each generation's token times (unix s), as the loop logged them (one line a generation)."""
    out: list[list[float]] = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(list(json.loads(line)["t"]))
            except (ValueError, KeyError):
                pass
    return out


def before_and_after(gens: list[list[float]], t_inject: float, t_detached: float, span_s: float) -> dict:
    """ms/token of the whole generations in the `span_s` before the injection against those in the `span_s` after
    the last detach. Whole generations of one length, because an eager generate() slows as its cache grows
    within a generation (30 -> 50 ms/token over 256 tokens on an H200): stretches of time would compare different
    positions. The spread of the generations before is the run's own noise."""
    def ms(g):
        return 1e3 * (g[-1] - g[0]) / (len(g) - 1)

    b = [ms(g) for g in gens if len(g) > 1 and g[0] >= t_inject - span_s and g[-1] < t_inject]
    a = [ms(g) for g in gens if len(g) > 1 and g[0] >= t_detached and g[-1] <= t_detached + span_s]
    mb, ma = (statistics.mean(b) if b else None), (statistics.mean(a) if a else None)
    return {"generations_before": len(b), "generations_after": len(a), "before_ms": mb, "after_ms": ma,
            "change_pct": (100 * (ma / mb - 1)) if (ma and mb) else None,
            "noise_pct": (100 * statistics.pstdev(b) / mb) if len(b) > 1 else None, "span_s": span_s}


def watch(case: str, out: Path, tiny: bool, record_s: float, attaches: int, cost_pairs: int = 0,
          phase_s: float = 4.0) -> dict:
    """Start one case, record it, re-attach, and compare with its own log (a case ending in _plain starts with
    plain python, no agent, and is attached by injection first)."""
    plain = case.endswith("_plain")
    base = case[: -len("_plain")] if plain else case
    log = out / f"{case}.tokens.jsonl"
    log.unlink(missing_ok=True)
    argv = case_argv(base, tiny, str(log))
    if plain and base.startswith("hf_"):
        argv += ["--new-tokens", "64"]  # short generations: several whole ones before the injection and after
    proc = start(argv, log if not base.startswith("demo") else None, 600, plain=plain,
                 engine_log=out / f"{case}.engine.log")
    pid = child_pid(proc, plain)
    res: dict = {"case": case, "argv": argv[1:], "pid": pid}
    try:
        if plain:
            time.sleep(PLAIN_WARM_S)
            res["injection"] = injection(pid)
        t0 = time.time()
        rec = out / f"{case}.dmon"
        r = subprocess.run([*DM, "record", str(pid), "-o", str(rec), "--seconds", str(record_s), *PROBE],
                           capture_output=True, text=True, timeout=record_s + 120)
        t1 = time.time()
        res["record"], err = cli_json("replay", rec) if rec.exists() else (None, r.stderr.strip()[-500:])
        res["record_error"] = err if res["record"] is None else ""
        rec_span = (t0, t1)
        res["attaches"] = []
        for _ in range(attaches):
            j, err = cli_json("attach", pid, "--seconds", ATTACH_S, *PROBE)
            res["attaches"].append({k: (j or {}).get(k) for k in (
                "verdict", "ceiling", "ms_per_token", "kernels_per_token", "tokens", "token_clock", "gpu_busy_pct",
                "bytes_per_token_measured", "errors")} | {"pm": ((j or {}).get("probe") or {}).get("pm"),
                                                          "probe": (j or {}).get("probe"),
                                                          "error": err if j is None else ""})
        if cost_pairs:
            res["cost"] = pairs_on(pid, log, cost_pairs, phase_s)
        t_detached = time.time()
        cpu0 = thread_cpu(pid)
        time.sleep((AFTER_S if plain else 0) + (0 if base.startswith("demo") else 2.0))
        res["detached_thread_cpu_s"] = {k: round(v - cpu0.get(k, 0.0), 3) for k, v in thread_cpu(pid).items()
                                        if v - cpu0.get(k, 0.0) > 0.01}
        times = logged_times(log)  # by now the loop has written the tokens of the recorded seconds
        res["loop_own"] = rate(times, *rec_span)
        res["first_attach"] = slowest_during(times, rec_span[0], rec_span[0] + 2.0)
        res["alive_at_end"] = proc.poll() is None
        if plain:
            inj = res["injection"]
            inj["during_injection"] = slowest_during(times, inj["t0"], inj["ready"] + 0.5)
            inj["first_attach"] = slowest_during(times, inj["attach_t0"], inj["attach_t0"] + 2.0, inj["t0"])
            inj["detached"] = before_and_after(logged_generations(log), inj["t0"], t_detached, AFTER_S)
    finally:
        stop(proc)
    return res


def thread_cpu(pid: int) -> dict:
    """CPU seconds so far of each thread of `pid`, by "name:tid" (from /proc): what runs in a detached target."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            out[f"{comm}:{task.name}"] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            continue
    return out


def stop(proc: subprocess.Popen) -> None:
    """End a loop `start` began, with its whole process group: SIGTERM, then SIGKILL after 30 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def profile(case: str, out: Path, tiny: bool) -> dict:
    """torch.profiler's kernels and kernel time per step for one loop (no decodemon)."""
    argv = case_argv(case, tiny, str(out / "unused.jsonl"))
    pj = out / f"{case}.profile.json"
    r = subprocess.run([*argv, "--profile-steps", "20", "--profile-out", str(pj)], capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        return {"case": case, "error": r.stderr[-1500:]}
    return {"case": case, **json.loads(pj.read_text())}


def pairs_on(pid: int, log: Path, pairs: int, phase_s: float) -> dict:
    """Interleaved unobserved / attached phases on one process: each pair's ms/token ratio from the loop's log
    (an attached phase against the mean of the unobserved phases on both sides)."""
    phases = []
    time.sleep(phase_s)
    for _ in range(pairs):
        t0 = time.time()
        time.sleep(phase_s)
        t1 = time.time()
        subprocess.run([*DM, "attach", str(pid), "--json", "--seconds", str(phase_s), *PROBE], capture_output=True,
                       timeout=phase_s + 60)
        t2 = time.time()
        phases.append((t0, t1, t2))
    time.sleep(phase_s)
    t_end = time.time()
    times = logged_times(log)
    ratios, floor, each = [], [], []
    for k, (t0, t1, t2) in enumerate(phases):
        after = phases[k + 1][:2] if k + 1 < len(phases) else (t2, t_end)  # the next pair's unobserved phase
        u = [rate(times, t0, t1)["ms_per_token"], rate(times, *after)["ms_per_token"]]
        a = rate(times, t1, t2)["ms_per_token"]
        each.append({"unobserved_s": [round(t0, 2), round(t1, 2)], "attached_s": [round(t1, 2), round(t2, 2)],
                     "ms_per_token": [u[0], a, u[1]]})
        if a and all(u):
            ratios.append(a / statistics.mean(u))
            floor.append(u[1] / u[0])
    return {"pairs": len(ratios), "phase_s": phase_s, "phases": each, "log_span_s": [round(min(times), 2),
            round(max(times), 2)] if times else None, "overhead_pcts": [round(100 * (x - 1), 3) for x in ratios],
            "median_overhead_pct": round(100 * (statistics.median(ratios) - 1), 3) if ratios else None,
            "noise_floor_pct": round(100 * statistics.pstdev(floor), 3) if len(floor) > 1 else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cases", default="hf_eager,hf_static,compiled_8b,demo_eager_marks,demo_eager_nomarks,"
                                       "demo_graph_marks,demo_graph_nomarks")
    ap.add_argument("--record-s", type=float, default=8.0)
    ap.add_argument("--attaches", type=int, default=5)
    ap.add_argument("--attach-s", type=float, default=ATTACH_S, help="seconds of each re-attach")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-only", action="store_true")
    ap.add_argument("--cost", default="", help="a case to price with interleaved phases after its attaches")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--tiny", action="store_true", help="the tiny CPU shapes (default with no GPU)")
    ap.add_argument("--probe", action="append", default=[], metavar="KEY=VALUE",
                    help="a probe setting for every record and attach (repeatable)")
    a = ap.parse_args()
    PROBE.extend(x for kv in a.probe for x in ("--probe", kv))
    globals()["ATTACH_S"] = a.attach_s
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny = a.tiny or not Path("/dev/nvidia0").exists()
    summary: dict = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "tiny": tiny,
                     "probe": a.probe, "cases": [],
                     "profiles": []}
    for case in a.cases.split(","):
        if a.profile or a.profile_only:
            if not case.startswith("demo"):
                summary["profiles"].append(profile(case, out, tiny))
                print(json.dumps(summary["profiles"][-1]), flush=True)
        if not a.profile_only:
            try:
                summary["cases"].append(watch(case, out, tiny, a.record_s, a.attaches,
                                              a.pairs if case == a.cost else 0, a.phase_s))
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
                summary["cases"].append({"case": case, "error": str(exc)[-2000:]})
            print(json.dumps(summary["cases"][-1])[:3000], flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
