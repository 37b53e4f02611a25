"""Does a traced window leak memory in the decode process, and whose is it: CUPTI's or ours?

    bash scripts/h200.sh scripts/h200_cupti_cycles.py OUTDIR [--cycles 400]

The 10-minute live soak grew the graphed engine's RSS by 33 MB (docs/reliability.md), about 180 KB per traced
window. Here the graphed demo model (Qwen3-0.6B shape) runs window cycles exactly as the agent drives them, each
variant in a fresh process: `tokens` (no CUPTI: the baseline), `full` (open, 2 tokens, close, flush, finalize,
collect — the agent's sequence), `no_finalize` (the same without cuptiFinalize until the end), `no_collect`
(full without packing the records into columns). RSS (VmRSS) and Python's own heap (tracemalloc) every 50
cycles. Writes OUTDIR/cupti_cycles.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path


def rss_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def child(variant: str, cycles: int) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from h200_busy_metrics import build
    from decodemon.probes.tracer import WindowTracer

    model, run = build("graph")
    for _ in range(50):
        run().item()
    tr = WindowTracer() if variant != "tokens" else None
    pts = []
    tracemalloc.start()
    t0 = time.time()
    for c in range(cycles + 1):
        if c % 50 == 0:
            cur, peak = tracemalloc.get_traced_memory()
            pts.append({"cycle": c, "rss_kb": rss_kb(), "py_heap_kb": cur // 1024, "t_s": round(time.time() - t0, 2)})
        if c == cycles:
            break
        if tr is None:
            run().item()
            run().item()
            continue
        tr.open()
        run().item()
        tr.boundary()
        run().item()
        tr.close()
        tr.flush()
        if variant != "no_finalize":
            tr.detach()
        if variant != "no_collect":
            tr.collect(c, 1)
        else:
            tr._reset()
        for _ in range(3):  # untraced tokens between windows
            run().item()
    if tr is not None and tr.initialised:
        tr.detach()
    torch.cuda.synchronize()
    first, last = pts[1] if len(pts) > 1 else pts[0], pts[-1]  # from cycle 50: past one-off start-up
    span = max(last["cycle"] - first["cycle"], 1)
    return {"variant": variant, "cycles": cycles, "points": pts,
            "rss_kb_per_cycle_after_50": (last["rss_kb"] - first["rss_kb"]) / span,
            "py_heap_kb_per_cycle_after_50": (last["py_heap_kb"] - first["py_heap_kb"]) / span}


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]))))
        return
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    cycles = int(sys.argv[sys.argv.index("--cycles") + 1]) if "--cycles" in sys.argv else 400
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": q[0], "driver": q[-1],
           "command": f"bash scripts/h200.sh scripts/h200_cupti_cycles.py OUT --cycles {cycles}", "variants": {}}
    for v in ("tokens", "full", "no_finalize", "no_collect"):
        r = subprocess.run([sys.executable, __file__, "--child", v, str(cycles)], capture_output=True, text=True,
                           timeout=240)
        try:
            res["variants"][v] = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            res["variants"][v] = {"error": (r.stderr or r.stdout)[-1500:]}
        (out / "cupti_cycles.json").write_text(json.dumps(res, indent=1))
        print(v, json.dumps({k: x for k, x in res["variants"][v].items() if k != "points"}), flush=True)


if __name__ == "__main__":
    main()
