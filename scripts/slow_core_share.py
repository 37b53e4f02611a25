"""How many of each phase kind's tokens ran on a slow core, in a scripts/h200_variant_ab.py run.

    python scripts/slow_core_share.py VARIANT_AB.json TIMES.json [--factor 1.3]

A token is on a slow core when its canary (a fixed ~30 µs of pure Python timed on the decode thread, see
benchmarks/overhead.py core_speed) took over `--factor` times the median canary of the fastest unobserved phase.
Phases after the process's first attach only. Per label (U, A, B): the share of its tokens on a slow core, and how
many of its phases had a median canary over the line. Prints JSON. docs/benchmarks.md quotes it for the twelfth
session's call 5 (the monitor pinned off the engine's CPUs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def shares(run: dict, times: dict, factor: float = 1.3) -> dict:
    ends, can = times["end_unix_s"], times["canary_us"]
    phases = run["phases"]
    first = next(i for i, p in enumerate(phases) if p["phase"] != "U")
    rows = []
    for i, p in enumerate(phases):
        c = [x for e, x in zip(ends, can) if p["t0_unix_s"] <= e < p["t1_unix_s"] and x is not None]
        if c:
            rows.append((i, p["phase"], statistics.median(c), c))
    line = factor * min(m for _, lab, m, _ in rows if lab == "U")
    out = {"line_us": round(line, 1)}
    for lab in sorted({lab for _, lab, _, _ in rows}):
        mine = [(m, c) for i, l_, m, c in rows if l_ == lab and i > first]
        toks = [x for _, c in mine for x in c]
        out[lab] = {"tokens": len(toks), "slow_pct": round(100.0 * sum(x > line for x in toks) / len(toks), 1),
                    "phases": len(mine), "slow_phases": sum(m > line for m, _ in mine)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("times")
    ap.add_argument("--factor", type=float, default=1.3)
    a = ap.parse_args()
    try:
        run, times = json.loads(Path(a.run).read_text()), json.loads(Path(a.times).read_text())
        print(json.dumps(shares(run, times, a.factor), indent=1))
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        print(f"slow_core_share.py: cannot read a variant_ab run with its phases and a canary times file: {exc}",
              file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
