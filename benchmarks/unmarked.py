"""Eager loops that mark nothing, attached by pid as a new user would: does decodemon's clock hold against the
loop's own per-token clock, and what does counting the steps cost?

    source benchmarks/device_setup.sh && python benchmarks/unmarked.py OUTDIR [--cases a,b] [--records 3]
    python benchmarks/unmarked.py OUTDIR --tiny          (the tiny CPU shapes: how the tests run this file)

Each case starts with plain `python3`, no line of decodemon in it, and decodes past its warm-up; then `decodemon
record PID -o OUTDIR/CASE_K.dmon --seconds RECORD_S`, K = 1..records, each replayed with `decodemon replay --json`.
Every figure is held against the loop's own token log over the seconds the clock covers (`clock_span_s` up to
`span_end_unix_s`): its median ms a token, from the tokens that ended there within one generation. The count's cost
is decodemon's own accounting (`observer_cost.step_count_pct`, and the whole `share_of_loop_pct`).

Cases: gptfast110m (gpt-fast's decode loop at its 110M shape, eager), demo (the demo engine, eager, `--no-marks`),
manual (a hand-written transformers loop, Qwen3-0.6B shape, eager, `--no-marks`). Everything lands in
OUTDIR/unmarked.json, with a table on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost import PY, LOOPS, cli_json, intervals, start, stop, token_times  # noqa: E402

CASES = ("gptfast110m", "demo", "manual")
RECORD_ARGS: list[str] = []  # given to every record (--no-trace)
WARM_S = {"gptfast110m": 15.0, "demo": 15.0, "manual": 40.0}  # the manual loop runs slow for its first ~25 s


def case_argv(case: str, tiny: bool, log: Path) -> list[str]:
    """The loop's command line: plain python, no decodemon line in it, timing each of its own tokens."""
    dev = ["--device", "cpu"] if tiny else []
    if case == "gptfast110m":
        return [PY, str(LOOPS / "compiled_decode.py"), "--eager", "--shape", "tiny" if tiny else "stories-110m",
                "--log", str(log), *dev, *(["--batch", "20", "--max-len", "64"] if tiny else ["--batch", "50"])]
    if case == "manual":
        return [PY, str(LOOPS / "manual_decode.py"), "--no-marks", "--shape", "tiny" if tiny else "qwen3-0.6b",
                "--log", str(log), *dev]
    if case == "demo":
        return [PY, "-m", "decodemon.engine_adapter.demo", "--mode", "eager", "--tokens", "0", "--no-marks",
                "--times-file", str(log), *(["--tiny", "--device", "cpu"] if tiny else [])]
    raise ValueError(f"no case {case!r}; one of {', '.join(CASES)}")


def held(j: dict, gens: list[list[float]]) -> dict:
    """A record's figures against the loop's own tokens over the seconds its clock covers."""
    end = j.get("clock_end_unix_s") or j.get("span_end_unix_s")
    span = j.get("clock_span_s") or j.get("span_s")
    own = intervals(gens, end - span, end) if end and span else []
    own_ms = statistics.median(own) if own else None
    dm = j.get("ms_per_token")
    oc = j.get("observer_cost") or {}
    return {"ms_per_token": dm, "own_ms_per_token": own_ms, "own_tokens": len(own),
            "error_pct": round(100.0 * (dm / own_ms - 1), 2) if dm and own_ms else None,
            "token_clock": j.get("token_clock"), "clock_steps": j.get("clock_steps"),
            "clock_span_s": j.get("clock_span_s"), "clock_provisional": j.get("clock_provisional"),
            "p90": j.get("ms_per_token_p90"), "p99": j.get("ms_per_token_p99"),
            "step_count_pct": oc.get("step_count_pct"), "share_of_loop_pct": oc.get("share_of_loop_pct"),
            "agent_cpu_ms_per_s": oc.get("agent_cpu_ms_per_s"), "verdict": j.get("verdict"),
            "windows": j.get("windows")}


def run_case(case: str, out: Path, tiny: bool, records: int, record_s: float) -> dict:
    """Start one loop with plain python, record it `records` times, stop it, and hold each record against its log."""
    log = out / f"{case}.tokens.{'json' if case == 'demo' else 'jsonl'}"
    proc = start(case_argv(case, tiny, log), log, out, case, 3.0 if tiny else WARM_S[case])
    res: dict = {"case": case, "records": []}
    summaries = []
    try:
        for k in range(1, records + 1):
            rec = out / f"{case}_{k}.dmon"
            j, err = cli_json("record", proc.pid, "-o", rec, "--seconds", record_s, *RECORD_ARGS,
                              timeout=record_s + 120)
            j, err = cli_json("replay", rec, timeout=120) if rec.exists() else (None, err)
            summaries.append(j or {"error": err[-400:] or "no summary"})
            time.sleep(1.0)
        res["ended_by_itself"] = proc.poll()  # a loop that ended under decodemon: its exit status (-N: signal N)
    finally:
        stop(proc)  # the demo writes its own token times as it ends
    gens = token_times(log)
    for j in summaries:
        res["records"].append(held(j, gens) if "error" not in j else j)
    return res


def table(results: list[dict]) -> str:
    lines = ["case #k | own ms (tokens) | decodemon ms | error % | clock, steps over s | p90 / p99 | count % | "
             "observer % | verdict"]
    for r in results:
        for k, x in enumerate(r.get("records") or (), 1):
            lines.append(f"{r['case']} #{k} | {x.get('own_ms_per_token')} ({x.get('own_tokens')}) | "
                         f"{x.get('ms_per_token')} | {x.get('error_pct')} | {x.get('token_clock')}, "
                         f"{x.get('clock_steps')} over {x.get('clock_span_s')} | {x.get('p90')} / {x.get('p99')} | "
                         f"{x.get('step_count_pct')} | {x.get('share_of_loop_pct')} | {x.get('verdict')}")
        if r.get("error"):
            lines.append(f"{r['case']}: {r['error']}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--records", type=int, default=3)
    ap.add_argument("--record-s", type=float, default=12.0)
    ap.add_argument("--tiny", action="store_true", help="the tiny CPU shapes")
    ap.add_argument("--no-trace", action="store_true", help="records without traced windows")
    a = ap.parse_args()
    if a.no_trace:
        RECORD_ARGS.append("--no-trace")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in a.cases.split(","):
        t = time.time()
        try:
            results.append(run_case(case, out, a.tiny, a.records, a.record_s))
        except Exception as exc:  # noqa: BLE001 - one case's failure is its row, the others still run
            results.append({"case": case, "error": f"{type(exc).__name__}: {exc}"})
        print(f"[{time.time() - t:5.1f}s] {case}: {json.dumps(results[-1])[:1200]}", flush=True)
        (out / "unmarked.json").write_text(json.dumps(results, indent=1))
    print(table(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
