"""Are the demo engine's tokens the same with and without the probe on the GPU — and without it, twice?

    bash scripts/h200.sh scripts/h200_determinism.py OUTDIR

Per mode: two unobserved runs and one run with a monitor attached (dense windows) for most of it, same seed.
Writes OUTDIR/determinism.json: token counts, whether each pair is identical, and where the first
difference falls, so a probe effect can be told from the engine's own run-to-run variation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from decodemon.monitor.demo import spawn_engine

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
OUT.mkdir(parents=True, exist_ok=True)
DM = [sys.executable, "-m", "decodemon.monitor.cli"]
DENSE = ["--window-period", "0.1", "--window-tokens", "16", "--window-min-tokens", "0"]


def ids(text):
    return json.loads(text.strip().splitlines()[-1])["token_ids"]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


EXTRA = sys.argv[2:]  # e.g. --deterministic


def main():
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "bash scripts/h200.sh scripts/h200_determinism.py OUT " + " ".join(EXTRA), "engine_args": EXTRA}
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ")
    res["gpu"], res["driver"] = (q + ["?", "?"])[:2]
    for mode, n, attach_s in (("graph", 2000, 5), ("eager", 300, 4)):
        args = ["--mode", mode, "--tokens", str(n), "--print-tokens", "--json", *EXTRA]
        cmd = [sys.executable, "-m", "decodemon.engine_adapter.demo", *args]
        plain = [ids(subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout) for _ in range(2)]
        out = open(OUT / f"watched_{mode}.out", "w+")
        proc, pid = spawn_engine(args, stdout=out)
        r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", str(attach_s), *DENSE],
                           capture_output=True, text=True, timeout=120)
        proc.wait(timeout=300)
        out.seek(0)
        watched = ids(out.read())
        d = json.loads(r.stdout) if r.returncode == 0 else {}
        res[mode] = {"tokens": len(plain[0]), "windows_while_watched": d.get("windows"),
                     "plain_vs_plain_identical": plain[0] == plain[1],
                     "plain_vs_plain_first_diff": first_diff(*plain),
                     "watched_vs_plain_identical": [watched == p for p in plain],
                     "watched_vs_plain_first_diff": [first_diff(watched, p) for p in plain],
                     "head": plain[0][:12]}
        print(mode, json.dumps(res[mode]), flush=True)
        (OUT / "determinism.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
