"""An attach's first seconds against the rest of it: where the eager median overhead of a short attach comes from.

    python scripts/attach_start.py RUN.json TIMES.json [--split-s 1.5] [--mode eager]
    python scripts/attach_start.py --profile RUN.json TIMES.json [RUN.json TIMES.json ...] [--bin-s 0.5]

RUN.json is a scripts/h200_variant_ab.py result (labels U, A, B) or a benchmarks/overhead.py one (its `--mode`
part; label D, the default attaches), TIMES.json the engine's token log beside it. For each attach after the
process's first: the median token of its first `--split-s` seconds and of the rest, each over the mean of the
median tokens of the unobserved phases on both sides of it, raw and at one core speed (benchmarks/overhead.py
core_speed); and the CPU the engine's other threads (the agent) used per second in each part. Per label, the
medians over its attaches. Also ("early") the tokens of every attach's first 0.3 s, before the agent has started,
against the unobserved ones: the decode thread's CPU time, its time off CPU, run-queue wait and canary. With
`--profile`, the default attaches' tokens of several runs pooled and binned by time since the attach started.
Prints JSON.
docs/benchmarks.md quotes it for the thirteenth session.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead import PHASE_SKIP_S, at_one_core_speed, time_profile  # noqa: E402


def phases_of(run: dict, mode: str) -> list[dict]:
    if "phases" in run:
        return run["phases"]
    return next(r for r in run["results"] if r["mode"] == mode)["phases"]


def split_ratios(phases: list[dict], times: dict, split_s: float = 1.5) -> dict:
    ends, ms = times["end_unix_s"], times["ms"]
    scaled = at_one_core_speed(phases, times)
    other = None
    if times.get("process_cpu_ms") and times.get("thread_cpu_ms"):
        other = [p - t for p, t in zip(times["process_cpu_ms"], times["thread_cpu_ms"])]

    def sel(t0: float, t1: float) -> list[int]:
        return [k for k, e in enumerate(ends) if t0 <= e < t1]

    def med(idx: list[int], vals) -> float | None:
        return statistics.median(vals[k] for k in idx) if idx else None

    first = next(i for i, p in enumerate(phases) if p["phase"] != "U")
    rows: dict[str, list] = {}
    for i, p in enumerate(phases):
        if p["phase"] == "U" or i <= first:
            continue
        nb = [q for q in (phases[i - 1], phases[i + 1] if i + 1 < len(phases) else None) if q and q["phase"] == "U"]
        if not nb:
            continue
        t0, t1 = p["t0_unix_s"], p["t1_unix_s"]
        start, rest = sel(t0 + PHASE_SKIP_S, t0 + split_s), sel(t0 + split_s, t1)
        if not start or not rest:
            continue
        row = {}
        for view, vals in (("raw", ms), ("core", scaled)):
            ref = statistics.mean(med(sel(q["t0_unix_s"] + PHASE_SKIP_S, q["t1_unix_s"]), vals) for q in nb)
            row[view] = (float(med(start, vals) / ref), float(med(rest, vals) / ref))
        if other is not None:
            row["other_cpu_ms_per_s"] = (sum(other[k] for k in start) / (split_s - PHASE_SKIP_S),
                                         sum(other[k] for k in rest) / (t1 - t0 - split_s))
        rows.setdefault(p["phase"], []).append(row)
    out = {"split_s": split_s}
    for lab, rs in sorted(rows.items()):
        d = {"attaches": len(rs)}
        for view in ("raw", "core"):
            d[view] = {"start_pct": round(100 * (statistics.median(r[view][0] for r in rs) - 1), 2),
                       "rest_pct": round(100 * (statistics.median(r[view][1] for r in rs) - 1), 2),
                       "start_above_rest": int(sum(bool(r[view][0] > r[view][1]) for r in rs))}
        if all("other_cpu_ms_per_s" in r for r in rs):
            d["other_cpu_ms_per_s"] = {"start": round(statistics.median(r["other_cpu_ms_per_s"][0] for r in rs), 1),
                                       "rest": round(statistics.median(r["other_cpu_ms_per_s"][1] for r in rs), 1)}
        out[lab] = d
    return out


def early_tokens(phases: list[dict], times: dict, early_s: float = 0.3) -> dict:
    """The tokens of each attach's first `early_s` (after the process's first attach; the agent has not started by
    0.3 s) against the unobserved tokens (each U phase less its first 0.5 s): median ms, the decode thread's CPU
    time in it, wall minus that CPU time, run-queue wait and the canary. Work that ran slower shows as CPU time
    equal to the wall time with no run-queue wait; waiting (the GIL, a lock, the scheduler) as wall over CPU."""
    ends = times["end_unix_s"]
    cols = {k: times.get(k) for k in ("ms", "thread_cpu_ms", "runq_wait_ms", "canary_us")}
    if any(v is None for v in cols.values()):
        return {}
    first = next(i for i, p in enumerate(phases) if p["phase"] != "U")
    picked: dict[str, list[int]] = {"early": [], "unobserved": []}
    for i, p in enumerate(phases):
        if i <= first:
            continue
        if p["phase"] == "U":
            lo, hi, key = p["t0_unix_s"] + 0.5, p["t1_unix_s"], "unobserved"
        else:
            lo, hi, key = p["t0_unix_s"] + PHASE_SKIP_S, p["t0_unix_s"] + early_s, "early"
        picked[key] += [k for k, e in enumerate(ends) if lo <= e < hi]
    out = {"early_s": early_s}
    for key, idx in picked.items():
        if not idx:
            continue
        med = lambda vals: round(statistics.median(vals), 3)  # noqa: E731
        out[key] = {"tokens": len(idx), "ms": med([cols["ms"][k] for k in idx]),
                    "thread_cpu_ms": med([cols["thread_cpu_ms"][k] for k in idx]),
                    "off_cpu_ms": med([cols["ms"][k] - cols["thread_cpu_ms"][k] for k in idx]),
                    "runq_wait_ms": med([cols["runq_wait_ms"][k] for k in idx]),
                    "canary_us": med([cols["canary_us"][k] for k in idx])}
        for k in ("minflt", "nivcsw"):  # token logs since the fourteenth session: the decode thread's own
            if times.get(k):
                out[key][f"{k}_mean"] = round(statistics.fmean(times[k][j] for j in idx), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+", metavar="RUN.json TIMES.json",
                    help="a run and its token log; with --profile, any number of such pairs, pooled")
    ap.add_argument("--split-s", type=float, default=1.5)
    ap.add_argument("--mode", default="eager")
    ap.add_argument("--profile", action="store_true", help="the default attaches' tokens binned by time since the "
                    "attach started (time_profile), pooled over the pairs given")
    ap.add_argument("--bin-s", type=float, default=0.5)
    a = ap.parse_args()
    if len(a.files) % 2 or (len(a.files) > 2 and not a.profile):
        sys.exit("attach_start: give RUN.json TIMES.json (pairs of them with --profile)")
    try:
        pairs = [(phases_of(json.loads(Path(r).read_text()), a.mode), json.loads(Path(t).read_text()))
                 for r, t in zip(a.files[::2], a.files[1::2])]
    except (OSError, ValueError, StopIteration, KeyError) as exc:
        sys.exit(f"attach_start: cannot read the run or its tokens: {exc}")
    if a.profile:
        print(json.dumps(time_profile(pairs, bin_s=a.bin_s), indent=1))
        return
    phases, times = pairs[0]
    out = split_ratios(phases, times, a.split_s)
    out["early"] = early_tokens(phases, times)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
