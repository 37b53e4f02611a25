"""An NVTX range as the token clock, against mark_token, on one process: do they read the same ms/token?

    python benchmarks/nvtx_clock.py OUTDIR [--mode graph] [--pairs 2] [--seconds 6]

Starts the demo engine with `--nvtx` (a torch.cuda.nvtx range named decode_step around each token, and its own
mark_token calls) under `decodemon run`, then records it alternately with the engine's marks and with
`--token-range decode_step` (OUTDIR/marks_N.dmon, OUTDIR/range_N.dmon), and exports the last range recording as
a trace (OUTDIR/range.trace.json) to count the NVTX ranges on its timeline. OUTDIR/summary.json holds each
recording's replayed figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unmodified import DM, PY, child_pid, cli_json, start, stop  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--mode", default="graph", choices=["eager", "graph"])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=6.0)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny = [] if Path("/dev/nvidia0").exists() else ["--tiny", "--device", "cpu"]
    argv = [PY, "-m", "decodemon.engine_adapter.demo", "--tokens", "0", "--mode", a.mode, "--nvtx", *tiny]
    proc = start(argv, None, 600, engine_log=out / "engine.log")
    summary: dict = {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "argv": argv[1:], "runs": []}
    try:
        pid = child_pid(proc)
        for i in range(a.pairs):
            for clock, extra in (("marks", []), ("range", ["--token-range", "decode_step"])):
                rec = out / f"{clock}_{i}.dmon"
                r = subprocess.run([*DM, "record", str(pid), "-o", str(rec), "--seconds", str(a.seconds), *extra],
                                   capture_output=True, text=True, timeout=a.seconds + 120)
                j, err = cli_json("replay", rec) if rec.exists() else (None, r.stderr.strip()[-800:])
                keep = ("tokens", "ms_per_token", "token_clock", "kernels_per_token", "verdict", "windows",
                        "nvtx_ranges")
                summary["runs"].append({"clock": clock, "recording": rec.name, "error": err if j is None else "",
                                        **{k: (j or {}).get(k) for k in keep}})
                print(json.dumps(summary["runs"][-1])[:1500], flush=True)
        last = out / f"range_{a.pairs - 1}.dmon"
        trace = out / "range.trace.json"
        subprocess.run([*DM, "export", str(last), "-o", str(trace)], capture_output=True, text=True, timeout=300)
        if trace.exists():
            ev = json.loads(trace.read_text())
            ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
            summary["trace_nvtx_events"] = sum(1 for e in ev if e.get("cat") == "nvtx")
    finally:
        stop(proc)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
