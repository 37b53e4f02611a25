"""Does an attach change the canaries themselves? On CPU, no GPU needed.

    python scripts/canary_bias.py OUTDIR [--pairs 5] [--phase-s 6] [--rounds 40]

The eager overhead at one core speed scales each token by a canary timed on the decode thread right after the
token clock's hook (engine_adapter/demo.py: ~30 us of pure Python, then zlib.crc32 of 4 KB 16 times). On the H200
the Python canary ran 1-3% faster while attached (runs 37-39), the C canary moved both ways. Two checks:

1. `engine`: the tiny demo engine on this machine's CPU, unobserved phases and default attaches in turn (the
   benchmark's own engine_session, BENCH_CPU=1); per pair, each canary's median against its unobserved
   neighbours'. Here the core's speed is steady, so a canary that moves with the attach is biased by it.
2. `micro`: in one process, the Python canary timed after a dormant hook (one global read) and after a live one
   (a few lines of Python: a perf_counter_ns call and two list appends, as the agent's on_token does), in
   paired rounds. It says whether Python run just before the canary speeds the canary up.

Writes OUTDIR/canary_bias.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def pair_shifts(rows: list[dict], key: str) -> list[float]:
    """Each attached phase's `key` median against the mean of its unobserved neighbours', in percent."""
    out = []
    for i, r in enumerate(rows):
        if r["phase"] == "D" and 0 < i < len(rows) - 1:
            ref = (rows[i - 1][key] + rows[i + 1][key]) / 2
            out.append(round(100 * (r[key] / ref - 1), 3))
    return out


def engine(pairs: int, phase_s: float) -> dict:
    os.environ["BENCH_CPU"] = "1"
    import overhead

    work = Path(tempfile.mkdtemp(prefix="dm-canary-"))
    s = overhead.engine_session("eager", "cb", ["U", "D"] * pairs + ["U"], phase_s, work)
    rows = []
    for lab, t0, t1 in s["phases"]:
        idx = [k for k, e in enumerate(s["ends"]) if overhead.phase_of(e, t0, t1)]
        rows.append({"phase": lab, "tokens": len(idx), **{
            k: round(statistics.median(s[k][j] for j in idx), 4) for k in ("ms", "canary_us", "canary_c_us")}})
    return {"phases": rows, "python_pct": pair_shifts(rows, "canary_us"), "c_pct": pair_shifts(rows, "canary_c_us"),
            "ms_pct": pair_shifts(rows, "ms")}


class _Live:
    """The work the agent's on_token does on a token outside a window: a clock read and two appends."""

    def __init__(self):
        self.marks_t: list[int] = []
        self.marks_d: list[int] = []

    def on_token(self, depth: int) -> None:
        self.marks_t.append(time.perf_counter_ns())
        self.marks_d.append(depth)
        if len(self.marks_t) > 256:  # the agent drains them at its ticks
            self.marks_t, self.marks_d = [], []


_session = None


def _mark(depth: int) -> None:
    s = _session
    if s is None:
        return
    s.on_token(depth)


def _canaries(buf: bytes) -> tuple[float, float]:
    c0 = time.perf_counter_ns()
    x = 0
    for j in range(1000):
        x += j
    c1 = time.perf_counter_ns()
    for _ in range(16):
        zlib.crc32(buf)
    return (c1 - c0) / 1e3, (time.perf_counter_ns() - c1) / 1e3


def micro(rounds: int, tokens: int = 500) -> dict:
    global _session
    buf = bytes(range(256)) * 16
    med = {"dormant": [], "live": []}
    for r in range(rounds):
        for mode in (("dormant", "live") if r % 2 == 0 else ("live", "dormant")):  # neither always first
            _session = _Live() if mode == "live" else None
            py, c = [], []
            for i in range(tokens):
                y = 0
                for k in range(20000):  # the token's other Python, so the canary does not run back to back
                    y ^= k
                _mark(i)
                a, b = _canaries(buf)
                py.append(a)
                c.append(b)
            med[mode].append((statistics.median(py), statistics.median(c)))
    _session = None
    py = [100 * (lv[0] / dm[0] - 1) for dm, lv in zip(med["dormant"], med["live"])]
    c = [100 * (lv[1] / dm[1] - 1) for dm, lv in zip(med["dormant"], med["live"])]
    return {"rounds": rounds, "python_pct_median": round(statistics.median(py), 2),
            "python_faster_rounds": sum(x < 0 for x in py), "c_pct_median": round(statistics.median(c), 2),
            "c_faster_rounds": sum(x < 0 for x in c)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--phase-s", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--skip-engine", action="store_true")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": f"{os.cpu_count()} CPUs, no GPU",
           "micro": micro(a.rounds)}
    if not a.skip_engine:
        res["engine"] = engine(a.pairs, a.phase_s)
    (out / "canary_bias.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
