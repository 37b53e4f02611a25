"""All-reduce latency at 1x, 8x and 64x a payload: the first seed's §2 lab.

    python -m decodemon.engine_adapter.collective_bench --payload-bytes 14336 --tp 2 [--device cpu|cuda]

Starts `--tp` processes (gloo on CPU, NCCL on CUDA with NVLink multicast off) and reports µs per call at each size.

On CUDA the figure is device time, the quantity decodemon reads from a traced window (an NCCL kernel that did not
wait for a peer, plus the launch gap it adds): what one call adds to a CUDA graph in which calls sit between the
GEMVs whose outputs a decode reduces (`--spacer-in`), timed by CUDA events around graph replays (see `_cuda_times`;
median of `--iters` // 20 trials, each after a barrier). Nothing of the host is in it. Two other ways are reported
beside it, because each measures something else: calls back to back in a graph (each waits for the peer to finish
the last one: 11 µs per call against a 5 µs kernel on two H200s), and calls enqueued from Python (an eager loop's
price, 38-77 µs there). Timing one call between two events measured the host's
enqueue and whichever rank arrived last: 65-70 µs (two H200s, 2026-11-29).
On CPU (gloo) the call is synchronous and the host clock times it.
If 64x the bytes costs less than 2x the time, the collective is latency-bound: report µs/call and target the call
count, not bandwidth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


SPACING_CYCLES = 40_000  # a spin kernel between calls, ~20 µs at the H200's 1.98 GHz
SPACER_MAX_HIDDEN = 16384  # or a GEMV between calls, [1, H] x [H, H] with H the 1x payload's elements (capped):
# the projection whose output a decode reduces (o_proj or down_proj, H = hidden)


def _graph(torch, body, calls: int):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            body()
    return graph


def _timed_us(dist, torch, work) -> float:
    """`work()` between two CUDA events, both ranks released together (µs)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    torch.cuda.synchronize()
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3


def _profiled_kernels(torch, graph, replays: int = 5) -> dict:
    """The NCCL kernels of `replays` replays of `graph`, read by torch.profiler (CUPTI): median duration, and the
    median idle between the kernel before each and it (the launch gap decodemon adds to a call's price), µs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    ks = sorted(((e.time_range.start, e.time_range.end, "nccl" in e.name.lower(), e.name) for e in prof.events()
                 if str(e.device_type).endswith("CUDA")), key=lambda k: k[0])  # kernels, GPU time (µs)
    durs = [k[1] - k[0] for k in ks if k[2]]
    gaps = [max(0.0, ks[i][0] - ks[i - 1][1]) for i in range(1, len(ks)) if ks[i][2]]
    before = [ks[i - 1][3] for i in range(1, len(ks)) if ks[i][2] and not ks[i - 1][2]]
    return {"kernel_us_profiler": statistics.median(durs) if durs else None,
            "gap_before_us_profiler": statistics.median(gaps) if gaps else None,
            "kernel_before": max(set(before), key=before.count)[:60] if before else None}


def _cuda_times(dist, torch, t, calls: int, trials: int, spacer: str, profile_kernels: bool, hidden: int,
                spacer_in: int) -> dict:
    """µs per all-reduce three ways, medians of `trials` (CUDA events throughout).

    us_per_call: what one call adds to a graph where calls sit apart (as between a decode's layers): a graph of
    `calls` × [spacer, all-reduce] against one of `calls` × [spacer], the difference ÷ calls. The spacer is the
    GEMV a decode reduces the output of (`gemv`, [1, spacer_in] x [spacer_in, hidden]: o_proj or down_proj of one
    rank's shard) or a spin kernel (`spin`). This is the figure a traced window's NCCL kernel should
    match. back_to_back_us_per_call: a graph of `calls` consecutive all-reduces ÷ calls (each waits for the peer to
    finish the last: 11 µs against a 5 µs kernel on two H200s). host_issued_us_per_call: the same calls enqueued
    from Python (what an eager loop pays per call). With `profile_kernels`, torch.profiler also reads the NCCL
    kernels of the spaced graph (kernel_us_profiler, gap_before_us_profiler): the CUPTI view of the same calls.
    """
    import torch.nn.functional as F

    # laid out as the model computes it, F.linear(x, W) with W [out, in], so cuBLAS picks the decode's kernel; and
    # as many weights as it takes to read twice the L2 between reuses (a decode never rereads a layer's weights:
    # one 58 MiB matrix reused from L2 ran faster than once read, and the difference came out of the all-reduce)
    x = torch.ones(1, spacer_in or hidden, dtype=torch.bfloat16, device=t.device)
    w_bytes = hidden * (spacer_in or hidden) * 2
    l2 = getattr(torch.cuda.get_device_properties(t.device), "L2_cache_size", 50 << 20) or (50 << 20)
    ws = [torch.full((hidden, spacer_in or hidden), 1e-3, dtype=torch.bfloat16, device=t.device)
          for _ in range(max(1, min(calls, -(-2 * l2 // w_bytes))))] if spacer != "spin" else []
    turn = [0]

    def space():
        if spacer == "spin":
            torch.cuda._sleep(SPACING_CYCLES)
        else:
            F.linear(x, ws[turn[0] % len(ws)])
            turn[0] += 1

    def spaced():
        space()
        dist.all_reduce(t)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # NCCL's first calls set up communicators and buffers outside the capture
            spaced()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = {"spaced": _graph(torch, spaced, calls), "spacer": _graph(torch, space, calls),
              "back_to_back": _graph(torch, lambda: dist.all_reduce(t), calls)}
    for g in graphs.values():
        _timed_us(dist, torch, g.replay)  # the first replay uploads the graph

    def host_issued():
        for _ in range(calls):
            dist.all_reduce(t)

    res = {k: [] for k in ("us_per_call", "back_to_back_us_per_call", "host_issued_us_per_call", "spacer_us")}
    for _ in range(trials):
        spaced_us = _timed_us(dist, torch, graphs["spaced"].replay)
        spacer_us = _timed_us(dist, torch, graphs["spacer"].replay)
        res["us_per_call"].append((spaced_us - spacer_us) / calls)
        res["spacer_us"].append(spacer_us / calls)
        res["back_to_back_us_per_call"].append(_timed_us(dist, torch, graphs["back_to_back"].replay) / calls)
        res["host_issued_us_per_call"].append(_timed_us(dist, torch, host_issued) / calls)
    out = {k: statistics.median(v) for k, v in res.items()}
    if profile_kernels:
        dist.barrier()
        out.update(_profiled_kernels(torch, graphs["spaced"]))
    del graphs
    return out


def _worker(rank: int, world: int, payload: int, iters: int, device: str, dtype: str, calls: int,
            spacer: str = "gemv", profile_kernels: bool = False, spacer_in: tuple[int, ...] = (0,)) -> dict:
    import torch
    import torch.distributed as dist

    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=rank, world_size=world)
    dt = getattr(torch, dtype)
    size = torch.empty((), dtype=dt).element_size()
    out = {}
    hidden = max(64, min(payload // size, SPACER_MAX_HIDDEN))
    for mult in (1, 8, 64):
        n = max(1, payload * mult // size)
        # zeros: summed thousands of times over, ones would overflow to inf in bf16
        t = torch.zeros(n, dtype=dt, device=f"cuda:{rank}" if device == "cuda" else "cpu")
        if device == "cuda":
            # one figure per spacer width (a decode has one reduce after o_proj and one after down_proj per
            # layer): us_per_call is their mean, the calls' average price in the step
            each = {str(k): _cuda_times(dist, torch, t, calls, max(3, iters // 20), spacer, profile_kernels, hidden, k)
                    for k in spacer_in}
            row = {"bytes": n * size}
            for key in next(iter(each.values())):
                vals = [v[key] for v in each.values() if isinstance(v.get(key), float)]
                row[key] = statistics.fmean(vals) if vals else None
            if len(each) > 1:
                row["by_spacer_in"] = each
            out[str(mult)] = row
            continue
        for _ in range(10):
            dist.all_reduce(t)
        times = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append((time.perf_counter() - t0) * 1e6)
        out[str(mult)] = {"bytes": n * size, "us_per_call": statistics.median(times)}
    dist.destroy_process_group()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="decodemon allreduce")
    ap.add_argument("--payload-bytes", type=int, required=True)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                    help="bfloat16 on CUDA (the demo engine's), float32 on CPU")
    ap.add_argument("--calls", type=int, default=50, help="all-reduces per captured graph (CUDA)")
    ap.add_argument("--spacer", choices=["gemv", "spin"], default="gemv",
                    help="what sits between the timed calls (CUDA): the GEMV whose output a decode reduces, "
                         "or a ~20 µs spin")
    ap.add_argument("--spacer-in", default="0",
                    help="the GEMV's input width, or several comma-separated (default: the payload's elements): a "
                         "decode's o_proj and down_proj shards, e.g. 2048,7168 for Llama-8B at TP=2")
    ap.add_argument("--profile-kernels", action="store_true",
                    help="also read the NCCL kernels' durations with torch.profiler (CUDA)")
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
    a.dtype = a.dtype or ("bfloat16" if device == "cuda" else "float32")
    try:
        spacer_in = tuple(int(x) for x in a.spacer_in.split(","))
        if any(x < 0 or x > 1 << 16 for x in spacer_in):
            raise ValueError
    except ValueError:
        print(f"decodemon allreduce: --spacer-in takes widths 0..65536, comma-separated; got {a.spacer_in!r}",
              file=sys.stderr)
        return 2
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    children = []
    if a.rank == 0:
        import socket

        from decodemon.probes.children import python_argv, same_flags

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ.setdefault("MASTER_PORT", str(s.getsockname()[1]))
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        args = list(sys.argv[1:] if argv is None else argv)
        for r in range(1, a.tp):
            argv = python_argv("decodemon.engine_adapter.collective_bench", *args, "--device", device, "--dtype",
                               a.dtype, "--rank", str(r), flags=same_flags())  # a rank runs as rank 0 was started
            children.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL))
    res = _worker(a.rank, a.tp, a.payload_bytes, a.iters, device, a.dtype, a.calls, a.spacer, a.profile_kernels,
                  spacer_in)
    for c in children:
        c.wait()
    if a.rank:
        return 0
    base, top = res["1"]["us_per_call"], res["64"]["us_per_call"]
    method = (f"CUDA events around graphs of {a.calls} x [all-reduce, {a.spacer}] minus {a.calls} x [{a.spacer}], "
              "per call" if device == "cuda"
              else "host clock around each synchronous gloo call")
    report = {"device": device, "tp": a.tp, "dtype": a.dtype, "method": method, "sizes": res,
              "ratio_64x": round(top / base, 3),
              "regime": "latency-bound: report µs/call; the target is the number of calls" if top < 2 * base
              else "bandwidth matters at these sizes"}
    if a.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        for k, v in res.items():
            host, b2b = v.get("host_issued_us_per_call"), v.get("back_to_back_us_per_call")
            print(f"{k:>3}x  {v['bytes']:>10} B  {v['us_per_call']:10.2f} µs/call"
                  + (f"   (back to back {b2b:.1f}, issued from the host {host:.1f} µs/call)" if host else ""))
        print(f"64x the payload costs {report['ratio_64x']:.2f}x the time: {report['regime']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
