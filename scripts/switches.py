"""The decode thread's voluntary context switches while attached, and what the tokens without one cost.

    python scripts/switches.py RUN.json TIMES.json [--mode eager] [--labels U,D,Dlong]

RUN.json is a benchmarks/overhead.py result (its `--mode` part; labels U, D, Dlong) or a scripts/h200_variant_ab.py
one (pass `--labels U,A,B`), TIMES.json the engine's token log beside it (`--cpu-clocks`, since the fourteenth
session's last runs). Per label (benchmarks/overhead.py switch_profile): switches per second, the share of tokens
that had any, and the median token without and with them. Per attach label (quiet_overhead): the median overhead
over all tokens and over the tokens without a switch, raw and at one core speed. For a benchmark run whose log has
the C canary (run 35 on): the default attaches at one core speed by that canary (c_canary_view). Prints JSON.
docs/benchmarks.md quotes it for the fifteenth and sixteenth sessions.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead import c_canary_view, logged_phases, quiet_overhead, switch_profile  # noqa: E402


def report(run: dict, times: dict, mode: str = "eager", labels: tuple[str, ...] = ("U", "D", "Dlong")) -> dict:
    phases = run["phases"] if "phases" in run else next(r for r in run["results"] if r["mode"] == mode)["phases"]
    if not times.get("nvcsw"):
        raise ValueError("the token log has no nvcsw (the engine ran without --cpu-clocks, or before they were logged)")
    out = {"switches": switch_profile(phases, times, labels)}
    for lab in labels:
        if lab not in ("U", "Dlong") and any(p["phase"] == lab for p in phases):
            out[f"overhead_{lab}"] = quiet_overhead(phases, times, lab)
    if times.get("canary_c_us"):  # one core speed by the C canary (logs since run 35), per attach label
        ends = times["end_unix_s"]  # this engine's phases only (a benchmark run lists torch.profiler's engine too)
        mine = logged_phases(phases, ends)
        for lab in labels:
            if lab not in ("U", "Dlong") and any(p["phase"] == lab for p in mine):
                out["core_c" if lab == "D" else f"core_c_{lab}"] = c_canary_view(mine, times, lab)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("times")
    ap.add_argument("--mode", default="eager")
    ap.add_argument("--labels", default="U,D,Dlong")
    a = ap.parse_args()
    try:
        run, times = json.loads(Path(a.run).read_text()), json.loads(Path(a.times).read_text())
        print(json.dumps(report(run, times, a.mode, tuple(a.labels.split(","))), indent=1))
    except (OSError, ValueError, KeyError, StopIteration) as exc:
        sys.exit(f"switches: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
