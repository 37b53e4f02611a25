"""The demo decode engine: eager or CUDA-graphed greedy decode of a random-weight transformer.

    python -m decodemon.engine_adapter.demo --mode eager|graph --tokens N [--device cuda|cpu] [--tiny]

Prints ms/token when it ends; `--tokens 0` decodes until killed. Each token
is brought to the host with `.item()`, as a sampling loop does, and marked on
the token clock. With DECODEMON_AGENT=1 in the environment (what `decodemon
run` sets) the probe agent is started, so a monitor can attach.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from typing import NoReturn

from decodemon.engine_adapter.clocks import GcClock, TokenClocks, TokenTimes  # noqa: F401 - GcClock: tests import it here


def _fail(msg: str) -> NoReturn:
    print(f"decodemon demo: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _measure_bandwidth_gbs(torch, device: str) -> float:
    """Device-to-device copy of 1 GiB, bytes read plus written, median of 5."""
    a = torch.empty(1 << 29, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * (1 << 30) / statistics.median(times) / 1e9


def is_copy_or_set(name: str) -> bool:
    """Is this CUDA event one of kineto's copy or set activities ("Memcpy DtoH (Device -> Pinned)", "Memset
    (Device)") rather than a kernel? Not every name with "memcpy" in it: a graph's memcpy node runs as the
    driver's kernel `memcpy32_post`, which CUPTI reports as a kernel and decodemon counts."""
    return name.startswith(("Memcpy", "Memset"))


class _Engine:
    """What the model was built as: its device, shape, the model and the extras around it."""

    def __init__(self, device: str, shape_name: str, model, narrow, bw: float, dtype, ranks: list) -> None:
        self.device, self.shape_name, self.model, self.narrow = device, shape_name, model, narrow
        self.bw, self.dtype, self.ranks = bw, dtype, ranks


def _toggle_profiler(torch, prof: dict, out_dir: str) -> None:
    """Start torch.profiler (CPU+CUDA), or stop it and write what it saw per token."""
    if prof["p"] is None:
        p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                               torch.profiler.ProfilerActivity.CUDA])
        p.__enter__()
        prof.update(p=p, tokens=0, t0=time.time())
        open(os.path.join(out_dir, f"profiler{prof['n']}.start"), "w").write(str(prof["t0"]))
        return
    p, tokens, t_end = prof["p"], prof["tokens"], time.time()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    p.__exit__(None, None, None)
    kernels, kernel_ns = 0, 0
    for e in p.profiler.kineto_results.events():
        if e.device_type() == torch.autograd.DeviceType.CUDA and not is_copy_or_set(e.name()):
            kernels += 1
            kernel_ns += e.duration_ns()
    res = {"start_unix_s": prof["t0"], "end_unix_s": t_end, "tokens": tokens,
           "kernels_per_token": kernels / max(tokens, 1), "kernel_ms_per_token": kernel_ns / 1e6 / max(tokens, 1)}
    with open(os.path.join(out_dir, f"profiler{prof['n']}.json"), "w") as fh:
        json.dump(res, fh)
    prof.update(p=None, n=prof["n"] + 1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_tp(a, argv, torch, device: str):
    """Rank 0 starts ranks 1..N-1 as child processes of the same command; every rank joins the group."""
    import subprocess

    import torch.distributed as dist

    from decodemon.probes.children import python_argv, same_flags  # a rank runs as rank 0 was started

    from decodemon.engine_adapter.adapter import timed_all_reduce

    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off in everything we launch
    children = []
    if a.rank == 0:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        args = list(sys.argv[1:] if argv is None else argv)
        for r in range(1, a.tp):
            children.append(subprocess.Popen(python_argv("decodemon.engine_adapter.demo", *args, "--rank", str(r),
                                                         flags=same_flags()), stdout=subprocess.DEVNULL))
    if device == "cuda":
        if torch.cuda.device_count() < a.tp:
            _fail(f"--tp {a.tp} needs {a.tp} GPUs; torch sees {torch.cuda.device_count()}")
        torch.cuda.set_device(a.rank)
        device = f"cuda:{a.rank}"
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=a.rank, world_size=a.tp)
    return timed_all_reduce(dist), children, device


def build_parser() -> argparse.ArgumentParser:
    """The demo engine's command line."""
    ap = argparse.ArgumentParser(prog="python -m decodemon.engine_adapter.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["eager", "graph"], default="eager")
    ap.add_argument("--tokens", type=int, default=200, help="tokens to decode; 0 = until killed")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available")
    ap.add_argument("--tiny", action="store_true", help="a few small layers that run on a CPU")
    ap.add_argument("--shape", default="qwen3-0.6b", help="qwen3-0.6b | llama-8b | tiny")
    ap.add_argument("--max-len", type=int, default=512, help="KV-cache length; decode wraps around at the end")
    ap.add_argument("--depth", type=int, default=0,
                    help="context depth to decode at: the cache holds this many positions before the first token, "
                         "and decoding wraps back to it (the cache is made --depth + 128 long unless --max-len is "
                         "longer); `decodemon sweep` sets it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=5, help="tokens before timing starts")
    ap.add_argument("--narrow-blocks", type=int, default=0,
                    help="add a streaming kernel with this many blocks per token (occupancy demo)")
    ap.add_argument("--narrow-mb", type=int, default=256, help="megabytes the narrow kernel reads per token")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (one process each; gloo on CPU, "
                    "NCCL with NVLink multicast off on CUDA)")
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--print-tokens", action="store_true", help="print the decoded token ids")
    ap.add_argument("--deterministic", action="store_true",
                    help="bit-reproducible GPU runs (deterministic algorithms, math attention): on the H200 two "
                         "default runs of the same seed parted after ~100 tokens")
    ap.add_argument("--nvtx", action="store_true",
                    help="push an NVTX range named decode_step around each token (torch.cuda.nvtx), for "
                         "`--token-range decode_step` and the timeline's NVTX lane")
    ap.add_argument("--no-marks", action="store_true",
                    help="never call mark_token: the monitor finds the tokens on the GPU's timeline")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    # the benchmarks' instruments, kept out of the user's --help. --times-file: at exit, every token's end time
    # (unix s) and ms to this .json. --cpu-clocks (with --times-file): also, per token, the decode thread's CPU ms,
    # the whole process's CPU ms, the decode thread's run-queue wait ms (/proc/thread-self/schedstat), its minor
    # page faults and voluntary and involuntary context switches (getrusage), a ~30 us canary of fixed pure Python
    # timed on the decode thread (the core's speed) and a canary of fixed C (zlib.crc32 of 4 KB, 16 times, the GIL
    # held: the core without the interpreter). --profiler-dir: SIGUSR1 toggles torch.profiler; each stop writes its
    # kernel counts here.
    ap.add_argument("--times-file", help=argparse.SUPPRESS)
    ap.add_argument("--cpu-clocks", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profiler-dir", help=argparse.SUPPRESS)
    ap.add_argument("--log-every", type=float, default=0.0,
                    help="every S seconds print a JSON line with the median ms/token since the last line")
    return ap


def _check_args(a: argparse.Namespace) -> None:
    """Refuse impossible options before torch loads; make the cache long enough for --depth."""
    if a.tokens < 0:
        _fail("--tokens must be 0 (run until killed) or positive")
    if a.max_len < 2 or a.max_len > 1 << 20:
        _fail("--max-len must be between 2 and 1048576")
    if a.depth < 0 or a.depth > (1 << 20) - 128:
        _fail("--depth must be between 0 and 1048448")
    a.max_len = max(a.max_len, a.depth + 128) if a.depth else a.max_len
    if a.tp < 1 or a.tp > 64:
        _fail("--tp must be between 1 and 64")


def _import_torch(a: argparse.Namespace):
    """torch, set up for --deterministic when asked."""
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts
    try:
        import torch
    except ImportError as exc:
        if getattr(exc, "name", None) == "torch":
            _fail("torch is not installed: pip install 'decodemon[engine]'")
        _fail(f"torch could not be imported: {exc}")
    if a.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    return torch


def _build_engine(a: argparse.Namespace, argv, torch) -> _Engine:
    """The device, the shape, the tensor-parallel group, the model, the narrow kernel and the measured bandwidth."""
    from decodemon.engine_adapter.model import SHAPES, DecodeModel

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda but torch sees no CUDA device")
    if a.mode == "graph" and device == "cpu":
        _fail("--mode graph needs a CUDA device (CUDA graphs do not exist on the CPU)")
    shape_name = "tiny" if a.tiny else a.shape
    if shape_name not in SHAPES:
        _fail(f"unknown --shape {shape_name!r}; choose one of {', '.join(SHAPES)}")
    all_reduce, ranks = None, []
    sh = SHAPES[shape_name]
    if a.tp > 1 and (sh.q_heads % a.tp or sh.kv_heads % a.tp or sh.ffn % a.tp):
        _fail(f"--tp {a.tp} does not divide {sh.q_heads} query heads, {sh.kv_heads} KV heads and FFN {sh.ffn}")
    if a.tp > 1:
        all_reduce, ranks, device = _init_tp(a, argv, torch, device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if device == "cpu":
        # one thread: a small CPU model gains nothing from more, and spinning OpenMP workers on a shared
        # 2-core machine slowed the loop 25x whenever another process (a monitor) took a core
        torch.set_num_threads(1)
    try:
        model = DecodeModel(sh, device, dtype, a.max_len, seed=a.seed, tp_rank=a.rank,
                            tp_size=a.tp, all_reduce=all_reduce)
    except ValueError as exc:
        _fail(str(exc))
    narrow = None
    if a.narrow_blocks:
        if device != "cuda":
            _fail("--narrow-blocks needs a CUDA device (it is a Triton kernel)")
        from decodemon.engine_adapter.narrow import make_narrow_op

        narrow = make_narrow_op(a.narrow_blocks, a.narrow_mb, device)
    bw = _measure_bandwidth_gbs(torch, device) if device.startswith("cuda") else 0.0
    return _Engine(device, shape_name, model, narrow, bw, dtype, ranks)


def _report_facts(a: argparse.Namespace, torch, eng: _Engine) -> None:
    """Tell the probe agent what the model is (weights, KV cache, TP, bandwidth, graphs), then start it."""
    from decodemon.engine_adapter.adapter import report_cuda_graphs, report_model
    from decodemon.probes.agent import start_from_env

    model, device, narrow = eng.model, eng.device, eng.narrow
    extra = a.narrow_mb * 1024 * 1024 if narrow else 0
    report_model(name=eng.shape_name + (f"+narrow{a.narrow_blocks}" if narrow else ""),
                 weight_bytes=model.weight_bytes() + extra, kv_bytes_per_position=model.kv_bytes_per_position(),
                 layers=model.shape.layers, dtype=str(eng.dtype).replace("torch.", ""), tp_degree=a.tp,
                 hidden=model.shape.hidden, measured_bandwidth_gbs=round(eng.bw, 1), tp_rank=a.rank,
                 collectives_per_token=model.collectives_per_token(), collective_bytes=model.collective_bytes(),
                 collective_backend=("nccl" if device.startswith("cuda") else "gloo") if a.tp > 1 else "")
    report_cuda_graphs(a.mode == "graph")
    if device.startswith("cuda"):
        os.environ.setdefault("DECODEMON_DEVICE", str(torch.cuda.current_device()))
    start_from_env()


def _make_step(a: argparse.Namespace, eng: _Engine):
    """One decode step (plus the narrow kernel), captured as a CUDA graph with --mode graph; the cache is reset
    to --depth."""
    from decodemon.engine_adapter.model import cuda_graph_step

    model, narrow = eng.model, eng.narrow

    def step():
        out = model.step()
        if narrow is not None:
            narrow()
        return out

    model.start_pos = a.depth
    model.reset()
    return cuda_graph_step(step, model.reset) if a.mode == "graph" else step


def _decode(a: argparse.Namespace, torch, model, run_step, stop: dict, tally: TokenTimes,
            clocks: TokenClocks | None) -> int | None:
    """The decode loop: --warmup tokens, then --tokens timed ones (0: until SIGTERM or Ctrl-C). Returns an exit
    code when a tensor-parallel peer went away, else None."""
    from decodemon.probes.agent import mark_token

    prof = {"p": None, "tokens": 0, "n": 0}
    n, i, pos = a.tokens, 0, a.depth
    marks = not a.no_marks
    nvtx = torch.cuda.nvtx if a.nvtx and torch.cuda.is_available() else None
    t_prev = t_prev_iter = time.perf_counter()
    try:
        while (n == 0 or i < n + a.warmup) and not stop["now"]:
            if pos >= a.max_len - 1:
                model.reset()
                pos = a.depth
            if nvtx is not None:
                nvtx.range_push("decode_step")
            tok = int(run_step().item())
            if nvtx is not None:
                nvtx.range_pop()
            # The token is on the host now: a server would stream it at this moment. A token's time is from the
            # previous token's moment to this one (inter-token latency), so what the token clock's hook below
            # adds shows up in the next token, the one a user waits longer for. The iteration clock is stamped
            # after the hook: the hook counts in the token that has just been emitted.
            t1 = time.perf_counter()
            pos += 1
            if marks:
                mark_token(pos)
            t1_iter = time.perf_counter()
            t0, t_prev = t_prev, t1
            t0_iter, t_prev_iter = t_prev_iter, t1_iter
            if prof["p"] is not None:
                prof["tokens"] += 1
            if stop["toggle"]:
                stop["toggle"] = False
                _toggle_profiler(torch, prof, a.profiler_dir)
                t_prev = t_prev_iter = time.perf_counter()  # the profiler's own start/stop work is not a token
            if clocks is not None:
                clocks.add(i)
            if i >= a.warmup:
                tally.add(tok, t1 - t0, t1_iter - t0_iter)
            i += 1
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a rank whose peer went away: the collective fails, the rank leaves quietly
        if a.tp > 1 and ("Connection" in str(exc) or "closed" in str(exc) or type(exc).__name__.startswith("Dist")):
            return 0 if a.rank else 1
        raise
    return None


def _write_times(path: str, tally: TokenTimes, clocks: TokenClocks | None) -> None:
    """Every timed token's end time (unix s), both clocks' ms and, with --cpu-clocks, its CPU clocks."""
    with open(path, "w") as fh:
        json.dump({**tally.as_json(), **(clocks.as_json(len(tally.end_times)) if clocks is not None else {})}, fh)


def _finish(a: argparse.Namespace, eng: _Engine, tally: TokenTimes, stop: dict) -> int:
    """Sum the run up (ms/token median, mean and p99, what the model is), end the other ranks, and print the
    summary as one JSON line (--json) or one line of text. Returns the exit code."""
    ms = sorted(t * 1e3 for t in tally.times)
    res = {
        "mode": a.mode, "device": eng.device, "shape": eng.shape_name, "tokens": len(tally.times),
        "ms_per_token_median": round(statistics.median(ms), 4) if ms else None,
        "ms_per_token_mean": round(statistics.fmean(ms), 4) if ms else None,
        "ms_per_token_p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 4) if ms else None,
        "weight_bytes": eng.model.weight_bytes(), "bandwidth_gbs_measured": round(eng.bw, 1),
    }
    if a.print_tokens:
        res["token_ids"] = tally.tokens
    for p in eng.ranks:  # rank 0 ends the group: a rank left waiting in a collective would wait forever
        if stop["now"]:
            p.terminate()
        try:
            p.wait(timeout=10)
        except Exception:
            p.kill()
    if a.rank:
        return 0  # rank 0 speaks for the group
    if a.tp > 1:
        res.update(tp=a.tp, collectives_per_token=eng.model.collectives_per_token(),
                   collective_bytes=eng.model.collective_bytes(),
                   rank_pids=[os.getpid()] + [p.pid for p in eng.ranks])
    if a.json:
        print(json.dumps(res))
    else:
        if a.print_tokens:
            print("tokens:", " ".join(map(str, tally.tokens)))
        print(f"{a.mode} {eng.shape_name} on {eng.device}: {res['ms_per_token_median']} ms/token median "
              f"over {len(tally.times)} tokens (mean {res['ms_per_token_mean']}, p99 {res['ms_per_token_p99']})")
    return 0


def main(argv=None) -> int:
    """Run the demo engine with the command line `argv` (default: sys.argv); returns the exit code."""
    a = build_parser().parse_args(argv)
    _check_args(a)
    torch = _import_torch(a)
    eng = _build_engine(a, argv, torch)
    _report_facts(a, torch, eng)
    run_step = _make_step(a, eng)
    stop = {"now": False, "toggle": False}  # SIGTERM ends the loop; SIGUSR1 toggles the profiler
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    if a.profiler_dir:
        os.makedirs(a.profiler_dir, exist_ok=True)
        signal.signal(signal.SIGUSR1, lambda *_: stop.__setitem__("toggle", True))
    tally = TokenTimes(a.times_file, a.log_every, a.print_tokens)
    print(f"decodemon demo: decoding ({a.mode}, {eng.shape_name}, pid {os.getpid()})", file=sys.stderr, flush=True)
    clocks = TokenClocks(a.warmup) if a.cpu_clocks and a.times_file else None
    rc = _decode(a, torch, eng.model, run_step, stop, tally, clocks)
    if rc is not None:
        return rc
    if a.times_file:
        _write_times(a.times_file, tally, clocks)
    return _finish(a, eng, tally, stop)


if __name__ == "__main__":
    sys.exit(main())
