"""Two attach settings against each other in one interleaved run on one engine: which design should be the default?

    bash scripts/h200.sh scripts/h200_variant_ab.py [--mode eager] [--pairs 8] [--phase-s 4] \
        [--b-args="--prepare-lead 2"]

One demo engine (benchmarks/overhead.py's engine_session) runs U, A, U, B, U, A, ... : U unobserved, A an attach
with default settings, B an attach with `--b-args`. Each attach is judged as the benchmark judges its D phases
(pair_stats: its median and p99 against the U phases on both sides of it, and the noise floor), raw and at one
core speed (core_speed), and all its tokens are pooled against all U tokens after the first attach; the process's
first attach (one A) is left out of the pooled figures. Per attach, the tokens over 1.1x the pooled U p99 and when
they came (seconds into the attach), and the attach's own report (observer cost, PM pump CPU).

`--a-screen --b-screen --a-args="--refresh 0.25" --b-args="--refresh 0.5"` sets the live screen (in a
pseudo-terminal, 160x50) at two refresh rates against each other; `--b-screen --b-args=""` the screen against
`--json` (what the benchmark attaches with). `--engine-cpus 0-3 --b-monitor-cpus 8-15 --b-args=""` asks whether the monitor process slows the decode thread's
core (the header records the CPUs' SMT siblings). `--b-args=""` makes B the defaults too: with `--phase-s 20`, long default attaches each between two unobserved
phases of the same length, a long attach's p99 judged against its own neighbours (eleventh session, call 5).

Writes OUTDIR/variant_ab.json (figures, every phase's span, each attach's report) and the engine's tokens under
OUTDIR/times. A dry run on CPU:
BENCH_CPU=1 python scripts/h200_variant_ab.py OUT --pairs 1 --phase-s 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _child import device_header  # noqa: E402
from overhead import (PROC_KEYS, core_speed, engine_session, pair_stats, pct, phase_labels, phase_of,  # noqa: E402
                      phase_rows)


def pooled(per: list[dict], label: str, u_p99: float, first_attach: int) -> dict:
    """All tokens of `label`'s attaches (the process's first attach left out) against the U tokens' p99."""
    xs = [m for i, p in enumerate(per) if p["phase"] == label and i != first_attach for m in p["ms"]]
    if not xs:
        return {}
    return {"tokens": len(xs), "median_ms": round(statistics.median(xs), 3), "p99_ms": round(pct(xs, 99), 3),
            "p99_ratio": round(pct(xs, 99) / u_p99, 3), "over_1.1x_u_p99": int(sum(m > 1.1 * u_p99 for m in xs))}


def cpu_list(text: str) -> set[int]:
    """'0-7,9' -> {0, ..., 7, 9} (argparse type)."""
    out: set[int] = set()
    try:
        for part in filter(None, text.split(",")):
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list like 0-7,9: {text!r}") from None
    if not out or not out <= set(range(os.cpu_count() or 1)):
        raise argparse.ArgumentTypeError(f"CPUs {text!r} are not all on this machine (0-{(os.cpu_count() or 1) - 1})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--mode", default="eager", choices=("eager", "graph"))
    ap.add_argument("--pairs", type=int, default=8, help="attaches of each setting")
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--b-args", default="--prepare-lead 2", help="extra `decodemon attach` arguments for B")
    ap.add_argument("--a-args", default="", help="extra `decodemon attach` arguments for A (default: none)")
    ap.add_argument("--a-screen", action="store_true", help="A attaches with the live screen in a pseudo-terminal "
                    "(benchmarks/overhead.py run_screen), not --json")
    ap.add_argument("--b-screen", action="store_true", help="B likewise")
    ap.add_argument("--engine-cpus", type=cpu_list, help="keep the engine (and its agent's NVML sidecar) on these "
                                                        "CPUs, e.g. 0-3")
    ap.add_argument("--b-monitor-cpus", type=cpu_list, help="keep B's monitor process on these CPUs, e.g. 8-15: "
                                                            "does the monitor slow the decode thread's core?")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    b_args, a_args = shlex.split(a.b_args), shlex.split(a.a_args)
    screens = {lab for lab, on in (("A", a.a_screen), ("B", a.b_screen)) if on}
    head = device_header("bash scripts/h200.sh scripts/h200_variant_ab.py " + " ".join(shlex.quote(x)
                                                                                       for x in sys.argv[2:]))
    work = Path(tempfile.mkdtemp(prefix="dm-ab-"))
    plan = ["U"]
    for _ in range(a.pairs):
        plan += ["A", "U", "B", "U"]
    sess = engine_session(a.mode, "ab", plan, a.phase_s, work, attach_args={"A": a_args, "B": b_args},
                          engine_cpus=a.engine_cpus, attach_cpus={"B": a.b_monitor_cpus}, screens=screens)
    (out / "times").mkdir(exist_ok=True)
    for f in work.glob("times_*.json"):
        shutil.copy(f, out / "times" / f.name)
    ends, ms = sess["ends"], sess["ms"]
    res = {**head, "mode": a.mode, "a_args": a_args, "b_args": b_args, "screens": sorted(screens),
           "phase_s": a.phase_s, "pairs": a.pairs,
           "engine_cpus": sorted(a.engine_cpus or []), "b_monitor_cpus": sorted(a.b_monitor_cpus or []),
           "attach": [{"phase": lab, **x} for lab, x in sess["attach"]],
           # every phase's span (unix s), so the tokens under OUT/times can be re-read by phase
           # and its machine's and processes' counters per second (overhead.vm_counters, proc_counters)
           "phases": [{"phase": lab, "t0_unix_s": round(t0, 3), "t1_unix_s": round(t1, 3), **host}
                      for (lab, t0, t1), host in zip(sess["phases"], sess["hosts"])]}
    views = {"raw": phase_rows(sess["phases"], ends, ms)}
    vals = {"raw": ms}
    where = phase_labels(sess["phases"], ends)
    for view, key in (("one_core_speed", "canary_us"), ("one_core_speed_c", "canary_c_us")):
        # by the Python canary, and by the C one (no bytecode; overhead.c_canary_view says why both)
        cs = core_speed(ms, sess.get(key), [w == "U" for w in where])
        if cs is not None:
            views[view] = phase_rows(sess["phases"], ends, cs["ms"])
            vals[view] = cs["ms"]
    first_attach = next(i for i, p in enumerate(plan) if p != "U")
    for name, per in views.items():
        u = [m for i, p in enumerate(per) if p["phase"] == "U" and i > first_attach for m in p["ms"]]
        u_p99 = pct(u, 99)
        v = {"u_after_first_attach": {"tokens": len(u), "median_ms": round(statistics.median(u), 3),
                                      "p99_ms": round(u_p99, 3)}}
        for label in ("A", "B"):
            st = pair_stats(per, label)
            v[label] = {k: (round(x, 3) if isinstance(x, float) else x) for k, x in st.items()
                        if k in ("pairs", "overhead_pct_median", "overhead_pct_min", "overhead_pct_max",
                                 "overhead_mean_pct_median", "p99_ratio_median", "noise_floor_pct",
                                 "noise_floor_bracketed_pct", "p99_noise_floor_bracketed_pct", "p99_ratios")}
            v[label]["pooled"] = pooled(per, label, u_p99, first_attach)
            # each attach's tokens over 1.1x the pooled U p99: how far into the attach (s) and how slow (ms)
            v[label]["slow_tokens"] = [
                [[round(e - t0, 2), round(float(x), 1)] for e, x in zip(ends, vals[name])
                 if phase_of(e, t0, t1) and x > 1.1 * u_p99]
                for lab, t0, t1 in sess["phases"] if lab == label]
        res[name] = v
    (out / "variant_ab.json").write_text(json.dumps(res, indent=1, default=lambda o: o.item()))
    procs = {lab: {k: statistics.median(xs) for k in PROC_KEYS
                   if (xs := [p["vm_per_s"][k] for p in res["phases"][1:]
                              if p["phase"] == lab and k in p.get("vm_per_s", {})])}
             for lab in ("U", "A", "B")}
    print("per second, median of each label's phases (engine_*: the engine's own; monitor_cpu_ms: the attaches' "
          "monitor processes):", json.dumps(procs))
    for name in views:  # the log: each setting's figures, without the slow tokens' list
        print(name, json.dumps({k: {x: y for x, y in v.items() if x != "slow_tokens"} if isinstance(v, dict) else v
                                for k, v in res[name].items()}, default=lambda o: o.item()))


if __name__ == "__main__":
    main()
