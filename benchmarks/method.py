"""The rest of the method on a GPU: depth sweeps and a ledger round trip, run as a user runs them.

    python benchmarks/method.py OUTDIR [--parts sweep_demo_eager,sweep_demo_graph,sweep_hf_generate,ledger]

- `sweep_*`: `decodemon sweep CMD --depths 64,512,2048,8192 -o OUTDIR/NAME` on the demo engine (eager and
  CUDA-graphed) and on transformers' own `generate()` (benchmarks/loops/hf_generate.py, the prompt as long as the
  depth); each leaves sweep.json, sweep.md, the plots and one recording per depth.
- `ledger`: the demo engine eager under `decodemon run`, `decodemon predict PID --change "capture a graph"
  --expect=-60% --ceiling launch --then occupancy`; then the same engine CUDA-graphed, `decodemon grade PID`.
  The ledger and both JSON answers land in OUTDIR/ledger/.
On a machine with no GPU every part runs the tiny CPU shapes (`--tiny`) at short depths.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unmodified import DM, LOOPS, PY, child_pid, start, stop  # noqa: E402

DEMO = f"{PY} -m decodemon.engine_adapter.demo --tokens 0"


def sweep_command(name: str, tiny: bool) -> str:
    """The decode command of a sweep part, {depth} where the depth goes."""
    cpu = " --tiny --device cpu" if tiny else ""
    if name == "sweep_demo_eager":
        return f"{DEMO} --mode eager --depth {{depth}}{cpu}"
    if name == "sweep_demo_graph":
        return f"{DEMO} --mode graph --depth {{depth}}{cpu}"
    if name == "sweep_hf_generate":
        shape = "tiny --device cpu" if tiny else "qwen3-0.6b"
        return f"{PY} {LOOPS / 'hf_generate.py'} --shape {shape} --prompt {{depth}} --new-tokens 64 --generations 0"
    raise ValueError(name)


def run_sweep(name: str, out: Path, tiny: bool, depths: str, seconds: float) -> dict:
    r = subprocess.run([*DM, "sweep", sweep_command(name, tiny), "--depths", depths, "--seconds", str(seconds),
                        "-o", str(out / name), "--json"], capture_output=True, text=True, timeout=900)
    try:
        return {"part": name, **json.loads(r.stdout)}
    except ValueError:
        return {"part": name, "error": (r.stderr or r.stdout)[-2000:]}


def _cli(*args, timeout: float = 180) -> dict:
    r = subprocess.run([*DM, *map(str, args), "--json"], capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"error": (r.stderr or r.stdout).strip()[-1500:], "rc": r.returncode}


def ledger_round_trip(out: Path, tiny: bool, seconds: float) -> dict:
    """Predict on the eager demo engine, switch it to CUDA graphs, grade."""
    d = out / "ledger"
    d.mkdir(parents=True, exist_ok=True)
    ledger = d / "decodemon.ledger.jsonl"
    ledger.unlink(missing_ok=True)
    cpu = ["--tiny", "--device", "cpu"] if tiny else []
    res: dict = {"part": "ledger"}
    for step, mode in (("predict", "eager"), ("grade", "graph")):
        argv = [PY, "-m", "decodemon.engine_adapter.demo", "--tokens", "0", "--mode", mode, *cpu]
        proc = start(argv, None, 600, engine_log=d / f"{mode}.engine.log")
        try:
            pid = child_pid(proc)
            extra = (["--change", "capture a graph", "--expect=-60%", "--ceiling", "launch", "--then",
                      "occupancy"] if step == "predict" else [])
            res[step] = _cli(step, pid, "--label", "demo", "--ledger", ledger, "--seconds", seconds, *extra)
        finally:
            stop(proc)
    res["ledger_lines"] = ledger.read_text().splitlines() if ledger.exists() else []
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--parts", default="sweep_demo_eager,sweep_demo_graph,sweep_hf_generate,ledger")
    ap.add_argument("--depths", default=None, help="default 64,512,2048,8192 (64,128,256,512 with --tiny)")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds attached at each depth and each ledger step")
    ap.add_argument("--tiny", action="store_true", help="the tiny CPU shapes (default with no GPU)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny = a.tiny or not Path("/dev/nvidia0").exists()
    depths = a.depths or ("64,128,256,512" if tiny else "64,512,2048,8192")
    summary: dict = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "tiny": tiny, "parts": []}
    for part in a.parts.split(","):
        try:
            got = (ledger_round_trip(out, tiny, a.seconds) if part == "ledger"
                   else run_sweep(part, out, tiny, depths, a.seconds))
        except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as exc:
            got = {"part": part, "error": str(exc)[-2000:]}
        summary["parts"].append(got)
        print(json.dumps(got)[:3000], flush=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
