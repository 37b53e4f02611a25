"""What torch.profiler counts as a kernel per token, by name — to settle the one-kernel gap in graph mode.

    bash scripts/h200.sh scripts/h200_profiler_names.py OUTDIR

decodemon counted 1,864 kernels per graphed token and torch.profiler 1,863 in the benchmark; the committed
H200 recording shows the 1,864th is the driver's `memcpy32_post` (a memcpy node of the graph run as a kernel),
and the benchmark's count dropped every CUDA event with "memcpy" in its name. Here torch.profiler records 50
tokens of the demo model per mode; every CUDA event name is counted, and the kernel count is taken both ways:
dropping names that contain memcpy/memset (the old filter) and dropping only kineto's copy and set activities
("Memcpy ..." / "Memset ..."). Writes OUTDIR/profiler_names.json.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from h200_busy_metrics import build, tokens  # noqa: E402

from decodemon.engine_adapter.demo import is_copy_or_set  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": q[0], "driver": q[-1],
           "torch": torch.__version__, "command": "bash scripts/h200.sh scripts/h200_profiler_names.py OUT"}
    n = 50
    for mode in ("graph", "eager"):
        model, run = build(mode)
        tokens(run, 20)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
            tokens(run, n)
            torch.cuda.synchronize()
        names = collections.Counter(e.name() for e in p.profiler.kineto_results.events()
                                    if e.device_type() == torch.autograd.DeviceType.CUDA)
        old = sum(k for nm, k in names.items() if "memcpy" not in nm.lower() and "memset" not in nm.lower())
        new = sum(k for nm, k in names.items() if not is_copy_or_set(nm))
        res[mode] = {"tokens": n, "kernels_per_token_old_filter": old / n, "kernels_per_token_new_filter": new / n,
                     "names_with_copy_or_set": {nm: k / n for nm, k in names.items()
                                                if "memcpy" in nm.lower() or "memset" in nm.lower()}}
        (out / "profiler_names.json").write_text(json.dumps(res, indent=1))
        del model, run
        torch.cuda.empty_cache()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
