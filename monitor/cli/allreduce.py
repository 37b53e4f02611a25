"""`decodemon allreduce --payload-bytes B`: all-reduce latency at 1x, 8x and 64x a payload on this machine."""

from __future__ import annotations

import os
import subprocess
import sys

from decodemon.monitor.cli._common import UsageError, bounded


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("allreduce", help="all-reduce latency at 1x, 8x and 64x a payload (torch)",
                       description="Time all-reduces of a decode's payload and 8x and 64x it across --tp ranks, "
                                   "to tell a latency-bound collective from a bandwidth-bound one.")
    p.add_argument("--payload-bytes", type=bounded("--payload-bytes", 0, 1 << 34, True), required=True, metavar="B",
                   help="bytes one all-reduce carries in the decode (hidden size x batch x element size)")
    p.add_argument("--tp", type=bounded("--tp", 1, 64, True), default=2, help="ranks (default 2)")
    p.add_argument("--iters", type=bounded("--iters", 0, 1e6, True), default=200, help="timed replays (default 200)")
    p.add_argument("--calls", type=bounded("--calls", 0, 10_000, True), default=50,
                   help="all-reduces per CUDA graph, timed by CUDA events around replays (default 50)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="where the ranks run (default: cuda if any)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="element type (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--spacer-in", default=None, metavar="W,W",
                   help="CUDA: input widths of GEMVs placed before each timed call (the decode's o_proj and "
                        "down_proj shards, e.g. 1024,1536)")
    p.add_argument("--profile-kernels", action="store_true",
                   help="CUDA: also read the NCCL kernels' own durations with torch.profiler")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=run)


ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _dtype_of(a) -> tuple[str, str]:
    """The element type the benchmark will use, and why: --dtype, or its default for the device (bfloat16 on
    CUDA, float32 on CPU; with no --device, CUDA where the machine has an NVIDIA device node)."""
    if a.dtype:
        return a.dtype, f"--dtype {a.dtype}"
    device = a.device or ("cuda" if os.path.exists("/dev/nvidia0") else "cpu")
    dtype = "bfloat16" if device == "cuda" else "float32"
    return dtype, f"{dtype}, the default on {device.upper() if device == 'cpu' else 'CUDA'}; --dtype picks another"


def run(a) -> int:
    """Run the benchmark in its own process (torch stays out of the monitor)."""
    dtype, why = _dtype_of(a)
    size = ELEMENT_BYTES[dtype]
    if a.payload_bytes % size:  # the benchmark would round it down and time another payload than the one asked
        raise UsageError(f"decodemon allreduce: --payload-bytes {a.payload_bytes} is not a whole number of "
                         f"{size}-byte elements ({why}); give a multiple of {size}")
    cmd = [sys.executable, "-m", "decodemon.engine_adapter.collective_bench", "--payload-bytes",
           str(a.payload_bytes), "--tp", str(a.tp), "--iters", str(a.iters), "--calls", str(a.calls)]
    cmd += ["--device", a.device] if a.device else []
    cmd += ["--dtype", a.dtype] if a.dtype else []
    cmd += ["--spacer-in", a.spacer_in] if a.spacer_in else []
    cmd += ["--profile-kernels"] if a.profile_kernels else []
    cmd += ["--json"] if a.json else []
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    return subprocess.run(cmd, env=env).returncode
