"""The demo decode engine: eager or CUDA-graphed greedy decode of a random-weight transformer.

    python -m decodemon.engine_adapter.demo --mode eager|graph --tokens N [--device cuda|cpu] [--tiny]

Prints ms/token when it ends; `--tokens 0` decodes until killed. Each token
is brought to the host with `.item()`, as a sampling loop does, and marked on
the token clock. With DECODEMON_AGENT=1 in the environment (what `decodemon
run` sets) the probe agent is started, so a monitor can attach.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import sys
import threading
import time


def _fail(msg: str) -> None:
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


class GcClock:
    """A gc.callbacks entry that sums the cyclic collector's time: `ms` and `n` (collections) on the thread
    `decode_ident`, `other_ms` on any other thread."""

    def __init__(self, decode_ident: int) -> None:
        self.decode_ident = decode_ident
        self.ms, self.n, self.other_ms = 0.0, 0, 0.0
        self._started: dict[int, int] = {}

    def __call__(self, phase: str, info: dict) -> None:
        me = threading.get_ident()
        if phase == "start":
            self._started[me] = time.perf_counter_ns()
            return
        t0 = self._started.pop(me, None)
        if t0 is None:
            return
        took = (time.perf_counter_ns() - t0) / 1e6
        if me == self.decode_ident:
            self.ms += took
            self.n += 1
        else:
            self.other_ms += took


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

    from decodemon.engine_adapter.adapter import timed_all_reduce

    os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off in everything we launch
    children = []
    if a.rank == 0:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        args = list(sys.argv[1:] if argv is None else argv)
        for r in range(1, a.tp):
            children.append(subprocess.Popen([sys.executable, "-m", "decodemon.engine_adapter.demo", *args,
                                              "--rank", str(r)], stdout=subprocess.DEVNULL))
    if device == "cuda":
        if torch.cuda.device_count() < a.tp:
            _fail(f"--tp {a.tp} needs {a.tp} GPUs; torch sees {torch.cuda.device_count()}")
        torch.cuda.set_device(a.rank)
        device = f"cuda:{a.rank}"
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank=a.rank, world_size=a.tp)
    return timed_all_reduce(dist), children, device


def build_parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--no-marks", action="store_true",
                    help="never call mark_token: the monitor finds the tokens on the GPU's timeline")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--times-file", help="at exit, write every token's end time (unix s) and ms to this .json")
    ap.add_argument("--cpu-clocks", action="store_true",
                    help="with --times-file: also write, per token, the decode thread's CPU ms, the whole process's "
                         "CPU ms, the decode thread's run-queue wait ms (/proc/thread-self/schedstat), its minor "
                         "page faults and voluntary and involuntary context switches (getrusage) and a ~30 us "
                         "canary of fixed pure Python timed on the decode thread (the core's speed), and a canary of "
                         "fixed C (zlib.crc32 of 4 KB, 16 times, the GIL held: the core without the interpreter)")
    ap.add_argument("--profiler-dir", help="SIGUSR1 toggles torch.profiler; each stop writes its kernel counts here")
    ap.add_argument("--log-every", type=float, default=0.0,
                    help="every S seconds print a JSON line with the median ms/token since the last line")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.tokens < 0:
        _fail("--tokens must be 0 (run until killed) or positive")
    if a.max_len < 2 or a.max_len > 1 << 20:
        _fail("--max-len must be between 2 and 1048576")
    if a.depth < 0 or a.depth > (1 << 20) - 128:
        _fail("--depth must be between 0 and 1048448")
    a.max_len = max(a.max_len, a.depth + 128) if a.depth else a.max_len
    if a.tp < 1 or a.tp > 64:
        _fail("--tp must be between 1 and 64")
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts
    try:
        import torch
    except ImportError:
        _fail("torch is not installed: pip install 'decodemon[engine]'")
    if a.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    from decodemon.engine_adapter.adapter import report_cuda_graphs, report_model
    from decodemon.engine_adapter.model import SHAPES, DecodeModel, cuda_graph_step
    from decodemon.probes.agent import mark_token, start_from_env

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        _fail("--device cuda but torch sees no CUDA device")
    if a.mode == "graph" and device == "cpu":
        _fail("--mode graph needs a CUDA device (CUDA graphs do not exist on the CPU)")
    shape_name = "tiny" if a.tiny else a.shape
    if shape_name not in SHAPES:
        _fail(f"unknown --shape {shape_name!r}; choose one of {', '.join(SHAPES)}")
    all_reduce, ranks = None, []
    sh = SHAPES.get("tiny" if a.tiny else a.shape)
    if a.tp > 1 and sh is not None and (sh.q_heads % a.tp or sh.kv_heads % a.tp or sh.ffn % a.tp):
        _fail(f"--tp {a.tp} does not divide {sh.q_heads} query heads, {sh.kv_heads} KV heads and FFN {sh.ffn}")
    if a.tp > 1:
        all_reduce, ranks, device = _init_tp(a, argv, torch, device)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if device == "cpu":
        # one thread: a small CPU model gains nothing from more, and spinning OpenMP workers on a shared
        # 2-core machine slowed the loop 25x whenever another process (a monitor) took a core
        torch.set_num_threads(1)
    try:
        model = DecodeModel(SHAPES[shape_name], device, dtype, a.max_len, seed=a.seed, tp_rank=a.rank,
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
    extra = a.narrow_mb * 1024 * 1024 if narrow else 0
    report_model(name=shape_name + (f"+narrow{a.narrow_blocks}" if narrow else ""),
                 weight_bytes=model.weight_bytes() + extra, kv_bytes_per_position=model.kv_bytes_per_position(),
                 layers=model.shape.layers, dtype=str(dtype).replace("torch.", ""), tp_degree=a.tp,
                 hidden=model.shape.hidden, measured_bandwidth_gbs=round(bw, 1), tp_rank=a.rank,
                 collectives_per_token=model.collectives_per_token(), collective_bytes=model.collective_bytes(),
                 collective_backend=("nccl" if device.startswith("cuda") else "gloo") if a.tp > 1 else "")
    report_cuda_graphs(a.mode == "graph")
    if device.startswith("cuda"):
        os.environ.setdefault("DECODEMON_DEVICE", str(torch.cuda.current_device()))
    start_from_env()

    def step():
        out = model.step()
        if narrow is not None:
            narrow()
        return out

    model.start_pos = a.depth
    model.reset()
    run_step = cuda_graph_step(step, model.reset) if a.mode == "graph" else step

    stop = {"now": False, "toggle": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    if a.profiler_dir:
        os.makedirs(a.profiler_dir, exist_ok=True)
        signal.signal(signal.SIGUSR1, lambda *_: stop.__setitem__("toggle", True))
    prof = {"p": None, "tokens": 0, "n": 0}
    end_times: list[float] = []
    tokens: list[int] = []
    times: collections.deque = collections.deque(maxlen=200_000)  # flat memory when run until killed
    iter_times: collections.deque = collections.deque(maxlen=200_000)
    log_times: list[float] = []
    next_log = time.monotonic() + a.log_every if a.log_every > 0 else float("inf")
    print(f"decodemon demo: decoding ({a.mode}, {shape_name}, pid {os.getpid()})", file=sys.stderr, flush=True)
    n = a.tokens
    i = 0
    pos = a.depth
    # --cpu-clocks: where a slow token's time went. Thread CPU up with wall time: the decode thread worked longer
    # (or its core ran slower); process CPU up without it: another thread of this process was busy (GIL);
    # run-queue wait up: the scheduler kept the thread off a core. `canary_us` times a fixed bit of pure Python
    # on the decode thread itself each token (~30 us): up with the token's time, the core itself ran slower.
    # The decode thread's own page faults and context switches (getrusage, RUSAGE_THREAD) say whether a slow
    # token waited on the kernel's memory work (minor faults, e.g. pages being migrated or compacted) or was
    # switched out (involuntary switches) while its CPU time still ran.
    # `gc_ms` / `gc_n`: the cyclic garbage collector's time and collections on the decode thread in the token,
    # `gc_other_ms` its time on other threads (the agent's): an attached process allocates more, so the collector
    # may run more often, on whichever thread crosses its threshold (gc.callbacks; the sixteenth session's
    # question: what slows the tokens the agent never touched?)
    clocks: dict[str, list[float]] = {"thread_cpu_ms": [], "process_cpu_ms": [], "runq_wait_ms": [],
                                      "minflt": [], "nvcsw": [], "nivcsw": [], "gc_ms": [], "gc_n": [],
                                      "gc_other_ms": [], "canary_us": [], "canary_c_us": []}
    deltas = list(clocks)[:9]  # read_clocks()' first nine, kept as per-token differences
    want_clocks = bool(a.cpu_clocks and a.times_file)
    import resource

    import zlib

    who = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)
    # the C canary's buffer: under zlib's 5 KB, so crc32 keeps the GIL (nothing else runs in its time); the
    # Python canary ran 1-2% faster while decodemon was attached in five of six A/B labels on the H200
    # (fifteenth session), so the core's speed gets a yardstick that runs no bytecode
    crc_buf = bytes(range(256)) * 16
    gc_clock = GcClock(threading.get_ident())
    if want_clocks:
        import gc

        gc.callbacks.append(gc_clock)

    def read_clocks() -> tuple[float, ...]:
        try:
            with open("/proc/thread-self/schedstat") as fh:
                wait = int(fh.read().split()[1]) / 1e6
        except (OSError, ValueError, IndexError):
            wait = 0.0
        ru = resource.getrusage(who)
        c0 = time.perf_counter_ns()
        x = 0
        for j in range(1000):
            x += j
        canary = (time.perf_counter_ns() - c0) / 1e3
        c1 = time.perf_counter_ns()
        for _ in range(16):
            zlib.crc32(crc_buf)
        canary_c = (time.perf_counter_ns() - c1) / 1e3
        return (time.thread_time() * 1e3, time.process_time() * 1e3, wait, ru.ru_minflt, ru.ru_nvcsw, ru.ru_nivcsw,
                gc_clock.ms, gc_clock.n, gc_clock.other_ms, canary, canary_c)

    marks = not a.no_marks
    c_prev = read_clocks() if want_clocks else None
    t_prev = t_prev_iter = time.perf_counter()
    try:
        while (n == 0 or i < n + a.warmup) and not stop["now"]:
            if pos >= a.max_len - 1:
                model.reset()
                pos = a.depth
            tok = int(run_step().item())
            # The token is on the host now: a server would stream it at this moment. A token's time is from the
            # previous token's moment to this one (inter-token latency), so what the token clock's hook below
            # adds shows up in the next token, the one a user waits longer for. `iter_times` keeps the other
            # clock (stamped after the hook: the hook counts in the token that has just been emitted).
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
            if want_clocks:
                c_now = read_clocks()
                if i >= a.warmup:
                    for k, x, y in zip(deltas, c_now, c_prev):
                        clocks[k].append(round(x - y, 4))
                    clocks["canary_us"].append(round(c_now[9], 3))
                    clocks["canary_c_us"].append(round(c_now[10], 3))
                c_prev = c_now
            if i >= a.warmup:
                if a.times_file:
                    end_times.append(time.time())
                times.append(t1 - t0)
                iter_times.append(t1_iter - t0_iter)
                if a.log_every > 0:
                    log_times.append(t1 - t0)
                if a.print_tokens and len(tokens) < 100000:
                    tokens.append(tok)
                if time.monotonic() >= next_log:
                    print(json.dumps({"t": round(time.time(), 3), "n": len(log_times),
                                      "ms_median": round(statistics.median(log_times) * 1e3, 4)}), flush=True)
                    log_times = []
                    next_log = time.monotonic() + a.log_every
            i += 1
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # a rank whose peer went away: the collective fails, the rank leaves quietly
        if a.tp > 1 and ("Connection" in str(exc) or "closed" in str(exc) or type(exc).__name__.startswith("Dist")):
            return 0 if a.rank else 1
        raise
    if a.times_file:
        with open(a.times_file, "w") as fh:
            json.dump({"end_unix_s": end_times, "ms": [round(t * 1e3, 5) for t in list(times)[-len(end_times):]],
                       "ms_iter": [round(t * 1e3, 5) for t in list(iter_times)[-len(end_times):]],
                       **({k: v[-len(end_times):] for k, v in clocks.items()} if want_clocks else {})}, fh)
    ms = sorted(t * 1e3 for t in times)
    res = {
        "mode": a.mode, "device": device, "shape": shape_name, "tokens": len(times),
        "ms_per_token_median": round(statistics.median(ms), 4) if ms else None,
        "ms_per_token_mean": round(statistics.fmean(ms), 4) if ms else None,
        "ms_per_token_p99": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 4) if ms else None,
        "weight_bytes": model.weight_bytes(), "bandwidth_gbs_measured": round(bw, 1),
    }
    if a.print_tokens:
        res["token_ids"] = tokens
    for p in ranks:  # rank 0 ends the group: a rank left waiting in a collective would wait forever
        if stop["now"]:
            p.terminate()
        try:
            p.wait(timeout=10)
        except Exception:
            p.kill()
    if a.rank:
        return 0  # rank 0 speaks for the group
    if a.tp > 1:
        res.update(tp=a.tp, collectives_per_token=model.collectives_per_token(),
                   collective_bytes=model.collective_bytes(), rank_pids=[os.getpid()] + [p.pid for p in ranks])
    if a.json:
        print(json.dumps(res))
    else:
        if a.print_tokens:
            print("tokens:", " ".join(map(str, tokens)))
        print(f"{a.mode} {shape_name} on {device}: {res['ms_per_token_median']} ms/token median "
              f"over {len(times)} tokens (mean {res['ms_per_token_mean']}, p99 {res['ms_per_token_p99']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
