"""What watching costs a decode loop, read on the loop's own clock: the first attach's after-effect, and
interleaved unobserved / attached phases with an A/A control in the same process.

    python benchmarks/cost.py OUTDIR [--engines hf_eager,manual,gptfast_eager,compiled,demo_eager,demo_graph]
                              [--pairs 6] [--phase-s 4] [--before-s 30] [--after-s 30] [--probe KEY=VALUE] [--run]

Each engine is started with plain python (no agent; `--run`: as `decodemon run` starts it) and, once it decodes,
watched as a new user would:

    before (unobserved) | first attach (`decodemon attach PID --json`, which loads the agent) | after (unobserved)
    then `--pairs` times:  U | A (attached) | U | C (A/A control: nothing attached, read as if it were)

The first attach's after-effect is the median token of the `--after-s` after the detach against the `--before-s`
before the attach, and the slowest token that ended while it ran against that median; beside it, the loop's own
slowest with nothing running: in stretches of the before period as long as the attach, and in the after period. Each A phase is held against the mean of the U
phases on either side, and so is each C phase: the C ratios are the run's noise floor. Medians and p99 are over
single tokens (a generation's first token, its prefill, is left out). The agent's own CPU a second
(`agent_cpu_ms_per_s`) is each attach's. Everything lands in OUTDIR/cost.json, with a table on stdout.
On a machine with no GPU the engines run their tiny CPU shapes: the structure, not the figures.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.pythons import engine_env  # noqa: E402
from unmodified import DM, LOOPS, PY, cli_json, stop, thread_cpu  # noqa: E402

ENGINES = ("hf_eager", "manual", "gptfast_eager", "compiled", "demo_eager", "demo_graph")


def engine_argv(engine: str, tiny: bool, log: Path) -> list[str]:
    """The engine's command line (plain python, no decodemon in its start)."""
    dev = ["--device", "cpu"] if tiny else []
    shape = ["--shape", "tiny"] if tiny else []
    if engine == "hf_eager":
        return [PY, str(LOOPS / "hf_generate.py"), *(shape or ["--shape", "qwen3-0.6b"]), "--log", str(log), *dev]
    if engine == "manual":
        return [PY, str(LOOPS / "manual_decode.py"), *(shape or ["--shape", "qwen3-0.6b"]), "--log", str(log), *dev]
    if engine == "gptfast_eager":
        return [PY, str(LOOPS / "compiled_decode.py"), "--eager", "--marks", *(shape or ["--shape", "qwen3-0.6b"]),
                "--log", str(log), *dev, *(["--batch", "20", "--max-len", "64"] if tiny else ["--batch", "50"])]
    if engine == "compiled":
        return [PY, str(LOOPS / "compiled_decode.py"), *(shape or ["--shape", "llama-8b"]), "--log", str(log), *dev,
                *(["--batch", "20", "--max-len", "64"] if tiny else [])]
    if engine in ("demo_eager", "demo_graph"):
        return [PY, "-m", "decodemon.engine_adapter.demo", "--mode", engine.split("_")[1], "--tokens", "0",
                "--times-file", str(log), *(["--tiny", "--device", "cpu"] if tiny else [])]
    raise ValueError(f"no engine {engine!r}; one of {', '.join(ENGINES)}")


def token_times(log: Path) -> list[list[float]]:
    """The loop's own token times (unix s), one list per generation (the demo's times file: one list)."""
    if not log.exists():
        return []
    text = log.read_text()
    if text.startswith("{") and "end_unix_s" in text[:64]:
        return [json.loads(text)["end_unix_s"]]
    out = []
    for line in text.splitlines():
        try:
            out.append(list(json.loads(line)["t"]))
        except (ValueError, KeyError):
            pass
    return out


def intervals(gens: list[list[float]], t0: float, t1: float) -> list[float]:
    """Each token's time (ms) that ended in [t0, t1], within one generation (its first token, the prefill, out)."""
    out = []
    for g in gens:
        out.extend(1e3 * (b - a) for a, b in zip(g, g[1:]) if t0 <= b <= t1)
    return out


def p99(xs: list[float]) -> float | None:
    return sorted(xs)[min(len(xs) - 1, int(0.99 * len(xs)))] if xs else None


def med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def start(argv: list[str], log: Path, out: Path, name: str, warm_s: float, run: bool = False) -> subprocess.Popen:
    """Start the engine with plain python, or as `decodemon run` starts it (`run`: the agent in it from the start);
    return once it has decoded for `warm_s` (its log exists)."""
    env = dict(os.environ)
    if run:
        from decodemon.monitor.sources.pids import agent_env

        env = agent_env()
    env = engine_env(argv, env)
    # the agent's event log (probes/eventlog.py): what its thread did and when, to name what a slow token overlapped
    with open(out / f"{name}.engine.log", "w") as sink:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**env, "PYTHONUNBUFFERED": "1",
                                     "DECODEMON_AGENT_EVENTS": str(out / f"{name}.events")})
    t0 = time.time()
    demo = "decodemon.engine_adapter.demo" in argv
    while time.time() - t0 < 900:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}: {(out / f'{name}.engine.log').read_text()[-1500:]}")
        ready = "decoding" in (out / f"{name}.engine.log").read_text() if demo else (log.exists() and log.stat().st_size)
        if ready:
            time.sleep(warm_s)
            return proc
        time.sleep(0.5)
    stop(proc)  # never leave an engine holding the GPU behind
    raise RuntimeError(f"{name} did not decode within 900 s")


def attach(pid: int, seconds: float, probe: list[str]) -> dict:
    """One `decodemon attach PID --json --seconds S`: when it ran, and what it said of the loop and of itself."""
    t0 = time.time()
    j, err = cli_json("attach", pid, "--seconds", seconds, *probe, timeout=seconds + 120)
    t1 = time.time()
    p = (j or {}).get("probe") or {}
    keep = ("verdict", "ms_per_token", "tokens", "token_clock", "kernels_per_token", "bytes_per_token_measured",
            "gpu_busy_pct")
    try:
        cpu = float(p.get("agent_cpu_ms_per_s"))
    except (TypeError, ValueError):
        cpu = None
    return {"t": [t0, t1], "error": err if j is None else "", **{k: (j or {}).get(k) for k in keep},
            "agent_cpu_ms_per_s": cpu, "pm": p.get("pm"), "trace": p.get("trace"),
            "observer_cost": (j or {}).get("observer_cost")}


class Stopped(Exception):
    """SIGTERM (the GPU call's `timeout`): stop the engine and judge what was measured so far."""


def first_attach(pid: int, before_s: float, first_s: float, after_s: float, probe: list[str], fa: dict) -> dict:
    """Unobserved, the first attach, unobserved again: the spans, the attach's summary and the target's threads'
    CPU over the after span, written into `fa` as they are measured (a run stopped in the after span keeps them)."""
    tb = time.time()
    time.sleep(before_s)
    a = attach(pid, first_s, probe)
    ta = time.time()
    fa.update({"before": [tb, a["t"][0]], "attach": a, "after": [ta, None]})
    cpu0 = thread_cpu(pid)
    time.sleep(after_s)
    cpu1 = thread_cpu(pid)
    fa.update({"after": [ta, time.time()],
               "after_thread_cpu_s": {k: round(v - cpu0.get(k, 0.0), 3) for k, v in cpu1.items()
                                      if v - cpu0.get(k, 0.0) > 0.01}})
    return fa


def pairs(pid: int, n: int, phase_s: float, probe: list[str]) -> list[dict]:
    """`n` times: U, A, U, C. Each phase's span; A's attach summary."""
    out = []
    for _ in range(n):
        u0 = time.time()
        time.sleep(phase_s)
        a = attach(pid, phase_s, probe)
        u1 = time.time()
        time.sleep(phase_s)
        c0 = time.time()
        time.sleep(phase_s)
        out.append({"u": [u0, a["t"][0]], "a": a, "u2": [u1, c0], "c": [c0, time.time()]})
    return out


def agent_events(out: Path, name: str) -> list[tuple[float, str, float]]:
    """The agent's event log of every attach: (unix s the step ended, what, ms it took where the row says)."""
    rows = []
    for f in sorted(out.glob(f"{name}.events.*.json")):
        try:
            for r in json.loads(f.read_text()):
                took = r[2] / 1e6 if len(r) > 2 and r[1] in TIMED_EVENTS else 0.0
                rows.append((r[0] / 1e9, r[1], took))
        except (ValueError, IndexError, TypeError):
            pass
    return sorted(rows)


# event-log rows whose first value is the ns the step took (attach_loop.py, server.py)
TIMED_EVENTS = ("hello", "preload", "tracer", "prepare", "collect", "pump", "arm")


def slow_tokens(gens: list[list[float]], t0: float, t1: float, median_ms: float, events: list, over: float = 2.0,
                keep: int = 12) -> list[dict]:
    """The tokens ending in [t0, t1] slower than `over` x the median, slowest first, each with the agent steps
    that ran while it did (a step's span is its end less the time it took)."""
    out = []
    for g in gens:
        for a, b in zip(g, g[1:]):
            if t0 <= b <= t1 and 1e3 * (b - a) > over * median_ms:
                near = [f"{w} {took:.1f} ms" if took else w for (e, w, took) in events
                        if e - took / 1e3 <= b and e >= a]
                out.append({"at_s": round(b - t0, 3), "ms": round(1e3 * (b - a), 2), "agent": near[:6]})
    return sorted(out, key=lambda r: -r["ms"])[:keep]


def control(gens: list[list[float]], fa: dict, m: float | None) -> dict:
    """The before period cut into stretches as long as the first attach: how many of them, nothing attached, held a
    token over 2x the median (the odds that a ≤ 2x bound fails on the loop's own noise), and their slowest."""
    (b0, b1), (a0, a1) = fa["before"], fa["attach"]["t"]
    n = int((b1 - b0) // (a1 - a0)) if a1 > a0 else 0
    worst = [max(xs) / m for k in range(n) if (xs := intervals(gens, b0 + k * (a1 - a0), b0 + (k + 1) * (a1 - a0)))] \
        if m else []
    return {"control_stretches": len(worst), "control_stretches_over_2x": sum(w > 2 for w in worst),
            "control_slowest_over_median": max(worst) if worst else None}


def judge(gens: list[list[float]], fa: dict, ps: list[dict], tail: list[float], events: list | None = None) -> dict:
    """The figures: the first attach's after-effect, then the cost and the A/A floor over the pairs."""
    res: dict = {}
    if fa:
        before = intervals(gens, *fa["before"])
        during = intervals(gens, *fa["attach"]["t"])  # the tokens that ended while the attach ran
        after = intervals(gens, *fa["after"])
        m = med(before)
        # the after figure's own control: the before span's median against the stretch of its length before it,
        # nothing attached in either (the loop's drift over that time, which two A/A pairs cannot hold)
        b0, b1 = fa["before"]
        first_token = min((g[0] for g in gens if g), default=b0)
        pre_tokens = intervals(gens, b0 - (b1 - b0), b0)
        # only where the loop decoded through all of that stretch, and enough of it to take a median by
        pre = med(pre_tokens) if b0 - (b1 - b0) >= first_token and len(pre_tokens) >= 20 else None
        res["first"] = {"before_median_ms": m, "after_median_ms": med(after),
                        "after_change_pct": 100 * (med(after) / m - 1) if (m and after) else None,
                        "before_drift_pct": 100 * (m / pre - 1) if (m and pre) else None,
                        "tokens_before_drift": len(pre_tokens),
                        "slowest_ms": max(during) if during else None,
                        "slowest_over_median": max(during) / m if (m and during) else None,
                        # the loop's own slowest, nothing of decodemon running: the after period (the agent idle),
                        # and the before period cut into stretches as long as the attach, nothing attached yet
                        "after_slowest_over_median": max(after) / m if (m and after) else None,
                        **control(gens, fa, m),
                        "tokens_before": len(before), "tokens_during": len(during), "tokens_after": len(after),
                        "slow_tokens": slow_tokens(gens, fa["attach"]["t"][0], fa["after"][1], m, events or [])
                        if m else []}
    us = [p["u"] for p in ps] + [p["u2"] for p in ps] + ([tail] if tail else [])
    cost, aa, p99a, p99u = [], [], [], []
    for k, p in enumerate(ps):
        nxt = ps[k + 1]["u"] if k + 1 < len(ps) else tail
        ua = [med(intervals(gens, *p["u"])), med(intervals(gens, *p["u2"]))]
        uc = [med(intervals(gens, *p["u2"])), med(intervals(gens, *nxt)) if nxt else None]
        a, c = med(intervals(gens, *p["a"]["t"])), med(intervals(gens, *p["c"]))
        if a and all(ua):
            cost.append(a / statistics.mean(ua))
        if c and all(uc):
            aa.append(c / statistics.mean(uc))
        p99a.extend(intervals(gens, *p["a"]["t"]))
    for u in us:
        p99u.extend(intervals(gens, *u))
    cpu = [p["a"]["agent_cpu_ms_per_s"] for p in ps if p["a"]["agent_cpu_ms_per_s"] is not None]
    res["cost"] = {
        "n": len(cost), "cost_pcts": [round(100 * (x - 1), 2) for x in cost],
        "aa_pcts": [round(100 * (x - 1), 2) for x in aa],
        "median_cost_pct": round(100 * (med(cost) - 1), 2) if cost else None,
        "median_aa_pct": round(100 * (med(aa) - 1), 2) if aa else None,
        # the floor: how far an A/A phase strays from its neighbours, typically (the A/A ratios' spread)
        "aa_floor_pct": round(100 * statistics.pstdev(aa), 2) if len(aa) > 1 else None,
        "p99_attached_over_unobserved": (p99(p99a) / p99(p99u)) if (p99a and p99u) else None,
        "agent_cpu_ms_per_s_median": med(cpu)}
    return res


def run_engine(engine: str, out: Path, tiny: bool, a) -> dict:
    """Start one engine, measure it, stop it."""
    name = engine + (f"_{a.tag}" if a.tag else "")
    log = out / f"{name}.tokens"
    log.unlink(missing_ok=True)
    argv = engine_argv(engine, tiny, log)
    proc = start(argv, log, out, name, a.warm_s, a.run)
    res: dict = {"engine": engine, "tag": a.tag, "argv": argv[1:], "pid": proc.pid, "probe": a.probe, "run": a.run}
    fa: dict = {}
    tail: list[float] = []
    try:
        if a.before_s or a.after_s:
            first_attach(proc.pid, a.before_s, a.first_s, a.after_s, PROBE, fa)
        res.update(first_attach=fa)
        ps = pairs(proc.pid, a.pairs, a.phase_s, PROBE)
        t_tail = time.time()
        time.sleep(a.phase_s)
        tail = [t_tail, time.time()]
        res.update(pairs=ps)
    except Stopped:  # cut short: the first attach's figures stand on what was measured (the after span so far)
        res["cut_short"] = True
        if fa.get("after") and fa["after"][1] is None:
            fa["after"][1] = time.time()
        res.update(first_attach=fa if "attach" in fa else {})
    finally:
        stop(proc)
    res["alive_at_end"] = proc.returncode in (0, -15, None)
    res.update(judge(token_times(log), res.get("first_attach") or {}, res.get("pairs") or [], tail,
                     agent_events(out, name)))
    return res


PROBE: list[str] = []


def table(results: list[dict]) -> str:
    """One line per engine."""
    rows = ["engine | first attach: slowest/median during it, after vs before (before vs the stretch before it) | "
            "control: stretches of its length before it over 2x, slowest; after it, slowest | attached: median cost, "
            "A/A median, A/A floor,"
            " p99 ratio | agent CPU ms/s | pairs"]
    for r in results:
        if "error" in r:
            rows.append(f"{r['engine']} | error: {r['error'][-300:]}")
            continue
        f, p = r.get("first") or {}, r.get("cost") or {}

        def g(x, fmt="{:+.2f}%"):
            return "-" if x is None else fmt.format(x)
        rows.append(f"{r['engine']}{'/' + r['tag'] if r['tag'] else ''} | {g(f.get('slowest_over_median'), '{:.2f}x')}, "
                    f"{g(f.get('after_change_pct'))} ({g(f.get('before_drift_pct'))}) | "
                    f"{f.get('control_stretches_over_2x')} of "
                    f"{f.get('control_stretches')}, {g(f.get('control_slowest_over_median'), '{:.2f}x')}; "
                    f"{g(f.get('after_slowest_over_median'), '{:.2f}x')} | {g(p.get('median_cost_pct'))}, {g(p.get('median_aa_pct'))}, "
                    f"±{g(p.get('aa_floor_pct'), '{:.2f}%')}, {g(p.get('p99_attached_over_unobserved'), '{:.3f}x')} | "
                    f"{g(p.get('agent_cpu_ms_per_s_median'), '{:.1f}')} | {p.get('n')}")
    return "\n".join(rows)


def _stopped(signum, frame):
    raise Stopped()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--before-s", type=float, default=30.0)
    ap.add_argument("--first-s", type=float, default=3.0, help="seconds of the first attach")
    ap.add_argument("--after-s", type=float, default=30.0)
    ap.add_argument("--warm-s", type=float, default=10.0, help="seconds the engine decodes before anything")
    ap.add_argument("--tag", default="", help="a name for this variant (with --probe)")
    ap.add_argument("--probe", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--run", action="store_true",
                    help="start the engines as `decodemon run` does (the agent loaded from the start), not plain python")
    ap.add_argument("--tiny", action="store_true", help="the tiny CPU shapes (default with no GPU)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, _stopped)
    PROBE.extend(x for kv in a.probe for x in (["--probe", kv] if "=" in kv else [kv]))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny = a.tiny or not Path("/dev/nvidia0").exists()
    path = out / "cost.json"
    summary = json.loads(path.read_text()) if path.exists() else {"runs": []}
    summary.setdefault("runs", [])
    for engine in a.engines.split(","):
        try:
            r = run_engine(engine, out, tiny, a)
        except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as exc:
            r = {"engine": engine, "tag": a.tag, "error": str(exc)}
        r["utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        r["tiny"] = tiny
        summary["runs"].append(r)
        path.write_text(json.dumps(summary, indent=1))
        print(table([r]), flush=True)
    print(table(summary["runs"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
