"""All-reduce latency at 1x, 8x and 64x a payload: the first seed's §2 lab.

    python -m decodemon.engine_adapter.collective_bench --payload-bytes 14336 --tp 2 [--device cpu|cuda]

Starts `--tp` processes (gloo on CPU, NCCL on CUDA with NVLink multicast off), times `--iters` all-reduces of
each size (CUDA events on GPU, the host clock on CPU) and reports µs per call. If 64x the bytes costs less than
2x the time, the collective is latency-bound: report µs/call and target the call count, not bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _worker(rank: int, world: int, payload: int, iters: int, device: str) -> dict:
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    out = {}
    for mult in (1, 8, 64):
        n = max(1, payload * mult // 4)
        t = torch.ones(n, dtype=torch.float32, device=f"cuda:{rank}" if device == "cuda" else "cpu")
        for _ in range(10):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            if device == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                dist.all_reduce(t)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1e3)
            else:
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(t)
                times.append((time.perf_counter() - t0) * 1e6)
        out[str(mult)] = {"bytes": n * 4, "us_per_call": statistics.median(times)}
    dist.destroy_process_group()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="decodemon allreduce")
    ap.add_argument("--payload-bytes", type=int, required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("decodemon allreduce: torch is not installed: pip install 'decodemon[engine]'", file=sys.stderr)
        return 2
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.device_count() < a.tp:
        print(f"decodemon allreduce: --tp {a.tp} needs {a.tp} GPUs; torch sees {torch.cuda.device_count()}",
              file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    children = []
    if a.rank == 0:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        args = list(sys.argv[1:] if argv is None else argv)
        for r in range(1, a.tp):
            children.append(subprocess.Popen([sys.executable, "-m", "decodemon.engine_adapter.collective_bench",
                                              *args, "--device", device, "--rank", str(r)],
                                             stdout=subprocess.DEVNULL))
    res = _worker(a.rank, a.tp, a.payload_bytes, a.iters, device)
    for c in children:
        c.wait()
    if a.rank:
        return 0
    base, top = res["1"]["us_per_call"], res["64"]["us_per_call"]
    report = {"device": device, "tp": a.tp, "sizes": res, "ratio_64x": round(top / base, 3),
              "regime": "latency-bound: report µs/call; the target is the number of calls" if top < 2 * base
              else "bandwidth matters at these sizes"}
    if a.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        for k, v in res.items():
            print(f"{k:>3}x  {v['bytes']:>10} B  {v['us_per_call']:10.1f} µs/call")
        print(f"64x the payload costs {report['ratio_64x']:.2f}x the time: {report['regime']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
