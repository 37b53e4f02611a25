"""What watching costs the loop: interleaved unobserved and observed phases on one running demo engine per mode.

    python benchmarks/overhead.py OUTDIR [--phase-s 4] [--pairs 5] [--long-s 20] [--modes eager,graph]
    python benchmarks/overhead.py OUTDIR --cpu-dry-run --modes eager --pairs 1 --phase-s 1 ...

One engine per mode decodes until told to stop, logging every token's time. On that same process, unobserved
phases (U) alternate with `decodemon attach PID --json` at default settings (D), then with dense attaches, and
one long attach ends the plan. torch.profiler alternates with U phases in a second engine process of the same
mode. Each phase's ms/token (median, p99) comes from the engine's own clock, each observed phase is judged
against the unobserved phases on both sides of it (harness/judge.py), and the limits are printed as met or not
(harness/limits.py). Accuracy is checked in the same run: decodemon's launches and kernel time per token against
torch.profiler's, and PM's GPU busy against the traced kernels'.

Writes OUTDIR/overhead.json (every figure), OUTDIR/times/ (every token) and OUTDIR/benchmarks.md (the tables,
headed by the device, driver, versions, date, commit and this command). `--probe KEY=VALUE` sets a probe setting
(a decodemon.probes.wire.Attach field) for every attach of the run, to compare settings run against run.
`--cpu-dry-run` runs the same plan on the tiny CPU engine, without a GPU.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.machine import thp_settings  # noqa: E402
from harness.phases import DENSE, engine_session, probe_args  # noqa: E402
from harness.report import markdown  # noqa: E402
from harness.summary import summarize  # noqa: E402


def plans(pairs: int, dense_pairs: int, screen_pairs: int, profiler_pairs: int, long_s: float):
    """The decodemon engine's plan and torch.profiler's (None for no profiler phases)."""
    a = ["U", "D"] * pairs + ["U", "Ddense"] * dense_pairs + ["U", "S"] * screen_pairs + ["U", ("Dlong", long_s), "U"]
    b = ["U", "P"] * profiler_pairs + ["U"] if profiler_pairs else None
    return a, b


def run_mode(mode: str, a: argparse.Namespace, work: Path) -> dict:
    """Both engine sessions of one mode, judged."""
    # decodemon and torch.profiler each bring a libcupti; once kineto has initialised CUPTI it stays attached,
    # and after decodemon's CUPTI has loaded kineto records no GPU events: separate processes, same mode and seed
    pairs = a.eager_pairs if mode == "eager" and a.eager_pairs else a.pairs
    phase_s = a.eager_phase_s if mode == "eager" and a.eager_phase_s else a.phase_s
    plan_a, plan_b = plans(pairs, a.dense_pairs, a.screen_pairs, a.profiler_pairs, a.long_s)
    probe = probe_args(a.probe)
    args = {"D": probe, "Dlong": probe, "S": probe, "Ddense": probe_args({**a.probe, **DENSE})}
    sa = engine_session(mode, "dm", plan_a, phase_s, work, attach_args=args, tiny=a.cpu_dry_run)
    sb = (engine_session(mode, "prof", plan_b, phase_s, work, a.profiler_phase_s, tiny=a.cpu_dry_run)
          if plan_b else None)
    return summarize(mode, sa, sb, phase_s, a.long_s)


def environment(a: argparse.Namespace) -> dict:
    """The device, driver and versions the run ran on, the date and the commit."""
    env = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "thp": thp_settings(), "probe": a.probe}
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).parent)
    env["commit"] = a.commit or (git.stdout.strip() if git.returncode == 0 else "unknown")
    if a.cpu_dry_run:
        return {**env, "gpu": "none (CPU dry run)", "driver": "-"}
    try:
        import importlib.metadata as md

        import torch

        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip().splitlines()[0].split(", ")
        env.update(gpu=q[0], driver=q[1], cupti=md.version("cupti-python"), torch=torch.__version__)
    except Exception as exc:  # a figure the run cannot read is said so in its header, never fatal
        env["error"] = f"{type(exc).__name__}: {exc}"
    return env


def _setting(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"--probe wants KEY=VALUE, got {text!r}")
    return key, value


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"overhead.py: {message} (see --help)\n")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = _Parser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="out", help="output folder (default ./out)")
    ap.add_argument("--phase-s", type=float, default=4.0, help="seconds per phase (default 4)")
    ap.add_argument("--pairs", type=int, default=5, help="unobserved/default-attach pairs (default 5)")
    ap.add_argument("--modes", default="graph,eager", help="demo engine modes, in order (default graph,eager)")
    ap.add_argument("--eager-pairs", type=int, default=None,
                    help="pairs in eager mode (default: --pairs); its loop is noisier than the graphed one")
    ap.add_argument("--eager-phase-s", type=float, default=None,
                    help="seconds per phase in eager mode (default: --phase-s): longer phases average out a core "
                         "whose speed wanders for seconds at a time")
    ap.add_argument("--long-s", type=float, default=20.0, help="one long attach at defaults: steady p99 (default 20)")
    ap.add_argument("--dense-pairs", type=int, default=2, help="pairs traced densely, 2 tokens a second (default 2)")
    ap.add_argument("--screen-pairs", type=int, default=0, help="pairs with the live screen in a pty (default 0)")
    ap.add_argument("--profiler-pairs", type=int, default=2,
                    help="torch.profiler pairs in a second engine (default 2; 0: no profiler engine)")
    ap.add_argument("--profiler-phase-s", type=float, default=3.0,
                    help="seconds per torch.profiler phase (its trace of an eager loop takes long to process)")
    ap.add_argument("--probe", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                    help="a probe setting for every attach (a decodemon.probes.wire.Attach field), repeatable")
    ap.add_argument("--commit", default=None, help="the commit to name in the header (default: git's HEAD here; name it where "
                         "the tree is a copy, as on a lent GPU machine)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="the tiny CPU engine: the plan without a GPU")
    a = ap.parse_args(argv)
    a.probe = dict(a.probe)
    return a


def main(argv: list[str] | None = None) -> None:
    """Run every mode, write OUTDIR's files and print the markdown."""
    a = parse(argv)
    out = Path(a.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "times").mkdir(exist_ok=True)
    except OSError as exc:
        sys.exit(f"overhead.py: cannot write to {out}: {exc.strerror}")
    work = Path(tempfile.mkdtemp(prefix="dm-bench-"))
    env = environment(a)
    env["command"] = "python benchmarks/overhead.py " + " ".join(sys.argv[1:] if argv is None else argv)
    results = []
    for mode in filter(None, a.modes.split(",")):
        results.append(run_mode(mode, a, work))
        (out / "overhead.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
        for f in work.glob(f"times_{mode}_*.json"):
            shutil.copy(f, out / "times" / f.name)
        r = results[-1]
        print(json.dumps({k: r.get(k) for k in ("mode", "D", "P", "Ddense", "U_all", "D_all", "Dlong", "accuracy")}),
              flush=True)
    text = markdown(results, env, env["command"])
    (out / "benchmarks.md").write_text(text)
    print(text, end="")
    errors = [e for r in results for e in r["attach_errors"]]
    if errors:  # a phase whose attach failed measured nothing: the run does not stand
        sys.exit(f"overhead.py: {len(errors)} attaches failed, the first: {errors[0].splitlines()[0]}")


if __name__ == "__main__":
    main()
