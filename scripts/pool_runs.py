"""Several benchmark runs of one protocol, their default attaches' pairs pooled: median overhead, p99 ratio and
noise floor over all the pairs, raw and at one core speed by each canary, with a bootstrap interval of the median.

    python scripts/pool_runs.py RUN.json:TIMES.json [RUN.json:TIMES.json ...] [--mode eager]

RUN.json is a benchmarks/overhead.py result, TIMES.json the token log of its decodemon engine for `--mode`
(OUT/times/times_eager_dm.json; committed as docs/h200/overhead_*_times_eager_dm_*.json). One run's eight pairs
cannot tell a 1% overhead from the eager loop's own wander (its noise floor, the same arithmetic on unobserved
phases, was ±1.7% to ±21% at one core speed or raw on the H200); three runs of the same command give 24. Each
pair is the run's own arithmetic (pair_stats on the run's phases), so the pooled figures are the runs' figures,
not new ones. The bootstrap resamples pairs (seeded, 4,000 draws): the interval is of the median of pairs drawn
from these runs, not of the loop at large. Prints JSON; docs/benchmarks.md quotes it for the seventeenth session.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead import at_one_core_speed, logged_phases, pair_stats, phase_rows, pct  # noqa: E402

VIEWS = {"raw": None, "core": "canary_us", "core_c": "canary_c_us"}


def engine_phases(run: dict, times: dict, mode: str = "eager") -> tuple[list[dict], list[tuple]]:
    """The `mode` phases of the engine whose tokens `times` holds (a run lists torch.profiler's engine's too), as
    dicts and as (label, t0, t1) spans."""
    phases = next(r for r in run["results"] if r["mode"] == mode)["phases"]
    mine = logged_phases(phases, times["end_unix_s"])
    return mine, [(p["phase"], p["t0_unix_s"], p["t1_unix_s"]) for p in mine]


def run_pairs(run: dict, times: dict, mode: str = "eager", label: str = "D") -> dict:
    """{view: pair_stats} for one run's `label` attaches: raw and at one core speed by each canary the log has."""
    mine, spans = engine_phases(run, times, mode)
    ends = times["end_unix_s"]
    out = {}
    for view, col in VIEWS.items():
        if col is not None and not times.get(col):
            continue
        vals = times["ms"] if col is None else at_one_core_speed(mine, times, col)
        out[view] = pair_stats(phase_rows(spans, ends, vals), label)
    return out


def bootstrap_median(xs: list[float], draws: int = 4000, seed: int = 17) -> tuple[float, float]:
    """The 5th and 95th percentiles of the median of `xs` resampled with replacement."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws))
    return meds[int(0.05 * draws)], meds[int(0.95 * draws) - 1]


def pool(per_run: list[dict]) -> dict:
    """Pooled figures per view over the runs' pair_stats (run_pairs): all pairs, and each run's after its first."""
    out = {}
    for view in VIEWS:
        sts = [r[view] for r in per_run if view in r]
        if len(sts) != len(per_run):
            continue
        xs = [x for st in sts for x in st["overhead_pcts"]]
        later = [x for st in sts for x in st["overhead_pcts"][1:]]
        null = [x for st in sts for x in st["bracketed_null_pct"]]
        p99 = [x for st in sts for x in st["p99_ratios"]]
        p99_later = [x for st in sts for x in st["p99_ratios"][1:]]
        lo, hi = bootstrap_median(xs)
        out[view] = {"runs": len(sts), "pairs": len(xs),
                     "overhead_pct_median": round(statistics.median(xs), 3),
                     "overhead_pct_interval_90": [round(lo, 3), round(hi, 3)],
                     "overhead_pct_median_after_first": round(statistics.median(later), 3),
                     "noise_floor_bracketed_pct": round(statistics.median(abs(x) for x in null), 3),
                     "p99_ratio_median": round(statistics.median(p99), 3),
                     "p99_ratio_median_after_first": round(statistics.median(p99_later), 3),
                     "per_run_overhead_pct_median": [round(st["overhead_pct_median"], 3) for st in sts]}
    return out


def pooled_p99(run: dict, times: dict, mode: str = "eager") -> float | None:
    """All default attaches' tokens after the first attach against all unobserved tokens after it: p99 ratio."""
    _, spans = engine_phases(run, times, mode)
    per = phase_rows(spans, times["end_unix_s"], times["ms"])
    first = next((i for i, p in enumerate(per) if p["phase"] != "U"), len(per))
    u = [m for i, p in enumerate(per) if p["phase"] == "U" and i > first for m in p["ms"]]
    d = [m for i, p in enumerate(per) if p["phase"] == "D" and i > first for m in p["ms"]]
    return round(pct(d, 99) / pct(u, 99), 3) if u and d else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", metavar="RUN.json:TIMES.json")
    ap.add_argument("--mode", default="eager")
    a = ap.parse_args()
    try:
        per_run, p99s = [], []
        for spec in a.runs:
            run_path, sep, times_path = spec.partition(":")
            if not sep:
                raise ValueError(f"{spec}: expected RUN.json:TIMES.json")
            run, times = json.loads(Path(run_path).read_text()), json.loads(Path(times_path).read_text())
            per_run.append(run_pairs(run, times, a.mode))
            p99s.append(pooled_p99(run, times, a.mode))
        print(json.dumps({"mode": a.mode, "pooled": pool(per_run), "pooled_p99_ratio_per_run": p99s}, indent=1))
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        sys.exit(f"pool_runs: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
