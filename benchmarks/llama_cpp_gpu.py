"""llama.cpp on one GPU, started plainly and watched as a new user would, each figure held against the engine's own.

    bash benchmarks/llama_cpp.sh OUTDIR setup    # call 1: wheels, llama.cpp's CUDA build and the GGUFs, detached
    bash benchmarks/llama_cpp.sh OUTDIR run      # call 2: the cases below, in order, as far as ~9 minutes go
    python benchmarks/llama_cpp_gpu.py OUTDIR [--cases a,b] [--cpu-smoke]

Each case starts its engine with nothing of decodemon in it (llama-cpp-python's own loop,
benchmarks/loops/llama_cpp_decode.py, or llama-server with clients that loop `/completion`), waits until it decodes
steadily, then: `decodemon attach PID --json --seconds 1` where the engine is Python (the agent is loaded), a
reference PM reading (below), `decodemon record PID -o CASE.dmon --seconds 6` and `decodemon replay CASE.dmon
--json`. Against what:

- ms/token and tokens/s: the engine's own clock over the seconds the recording spans (its `span_end_unix_s` and
  `span_s`): the loop's per-token log, or llama-server's `timings` of each `/completion` reply (`predicted_ms` over
  `predicted_n`, the server's own figure; tokens counted as spread evenly over each reply's decode time).
- bytes/token measured (PM's DRAM bytes, inside decodemon): a reference PM reader in a process of its own (the logic
  of shared/repro/pm-second-process/pm2.py: torch's context, cupti-python's `pm_sampling` on the 13.4 `libcupti`
  carried in .whl/) reads DRAM bytes read+write for REF_S seconds; its bytes/token is its GB/s times the engine's
  own ms/token over the same seconds (the mean: those seconds over the tokens made in them). PM is one reader at
  a time on a GPU (a second arm was refused with ERROR_HARDWARE_BUSY on the H200), so the reference reads the
  seconds just before the record's, not the same ones, each against the engine's clock over its own seconds; where
  it is refused there, it reads the seconds just after the record.
- bytes/token of the model: `bytes_per_token_model` and the recording's model facts (weight_bytes,
  weight_bytes_total, kv_dtype) against the shapes' own arithmetic (`shape_bytes`).
- tokens/step of a batched server: the slots decoding (its clients); throughput: the sum of the clients' own rates.

The verdict, every candidate's state and value, launches per token, GPU busy and the replay's JSON go to
OUTDIR/CASE.json; every case's row to OUTDIR/llama_cpp.json and the table to OUTDIR/llama_cpp.md (and stdout).

Cases, in priority order (a case's failure is its row; a case that would not finish inside the budget is skipped):

    lcpp1b_graphs      llama-cpp-python, llama-1b f16, every layer on the GPU, ggml's CUDA graphs on
    lcpp1b_nographs    the same with GGML_CUDA_DISABLE_GRAPHS=1; then `decodemon compare` of the two (--json)
    server8b           llama-server, llama-8b, one client; watched from outside (/slots and PM, no agent)
    server8b_injected  the same under `decodemon run -- llama-server ...`: CUPTI's traced windows from its start
    server1b_np4       llama-server, llama-1b, -np 4, four clients at once: tokens/step and throughput
    server1b_kvq8      llama-server, llama-1b, -ctk q8_0 -ctv q8_0 -fa on, one client at a depth where the KV is a
                       third of the bytes a token reads
    lcpp8b_graphs      llama-cpp-python, llama-8b, graphs on; lcpp8b_nographs off; then their compare

`--cpu-smoke` runs the same code on this CPU machine: the tiny shape, the CPU build of `llama_cpp_build.sh once`
(~/.cache/decodemon-ci/llama-cpp-0.3.36), short seconds and no PM reference: the plumbing, not the figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "benchmarks" / "loops"
sys.path.insert(0, str(LOOPS))
from llama_cpp_decode import SHAPES, vocab  # noqa: E402

from harness.pythons import DM, tools_env  # noqa: E402
from harness.pythons import ENGINE_PY as PY  # noqa: E402
WORK = Path("/tmp/dm_llama")  # the GPU machine's build (WORK/cuda/bin), GGUFs and their markers (llama_cpp.sh)
CPU_BUILD = Path.home() / ".cache/decodemon-ci/llama-cpp-0.3.36"  # `llama_cpp_build.sh once`'s OUTDIR
CASES = ("lcpp1b_graphs", "lcpp1b_nographs", "server8b", "server8b_injected", "server1b_np4", "server1b_kvq8",
         "lcpp8b_graphs", "lcpp8b_nographs")
# seconds each case takes on the GPU, its engine's start to its stop (the budget skips what would not fit)
COST_S = {"lcpp1b": 45, "lcpp8b": 60, "server8b": 60, "server1b": 45}
BUDGET_S = 520.0  # the run stage's python, its build wait included (llama_cpp.sh gives it 545 s)
NEW_TOKENS = 128  # a generation's tokens (the loop's)
REQUEST_TOKENS = 512  # a request's (llama-server's /slots is read every 50 ms: a request must outlast a few reads)
# the smoke's shape: tiny, with heads of 32 (q8_0's block) for the quantized KV cache
SHAPES["tiny-hd32"] = dict(embd=64, layers=2, ff=128, heads=2, heads_kv=1, extra_vocab=253)


class Setup:
    """Where things are and how long things last: the GPU's, or the CPU smoke's."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.bin = (CPU_BUILD if smoke else WORK / "cuda") / "bin"
        self.record_s, self.ref_s, self.warm_s = (3.0, 0.0, 2.0) if smoke else (6.0, 5.0, 4.0)
        self.new_tokens, self.request_tokens = (32, 2048) if smoke else (NEW_TOKENS, REQUEST_TOKENS)

    def gguf(self, shape: str) -> Path:
        return WORK / ("tiny-hd32.gguf" if self.smoke else f"{shape}.gguf")

    def shape(self, shape: str) -> str:
        return "tiny-hd32" if self.smoke else shape

    def ready(self, shape: str) -> str:
        """'' when the build and the shape's GGUF are there; else what is missing (or what failed)."""
        for what, marker, done in (("build", WORK / "build.rc", self.bin / "llama-server"),
                                   (shape, WORK / f"{shape}.rc", self.gguf(shape))):
            if done.exists():
                continue
            if self.smoke:
                return f"{done} missing"
            rc = marker.read_text().split()[0] if marker.exists() else None
            return f"{what} failed (rc {rc}, see build.log)" if rc not in (None, "0") else f"{what}: not yet"
        return ""


# --- the engines' own clocks -----------------------------------------------------------------------------------

def loop_times(log: Path) -> list[float]:
    """Every token's host time (unix s) the llama-cpp-python loop logged."""
    out: list[float] = []
    for line in log.read_text().splitlines() if log.exists() else ():
        try:
            out.extend(json.loads(line)["t"])
        except (ValueError, KeyError):
            continue
    return sorted(out)


def loop_own(log: Path, t0: float, t1: float) -> dict:
    """The loop's own figures over [t0, t1]: tokens, the median gap and the mean (the span over the tokens)."""
    t = [x for x in loop_times(log) if t0 <= x <= t1]
    gaps = [1e3 * (b - a) for a, b in zip(t, t[1:])]
    return {"tokens": len(t), "ms_per_token": round(statistics.median(gaps), 4) if gaps else None,
            "ms_per_token_mean": round(1e3 * (t1 - t0) / len(t), 4) if t else None,
            "tokens_per_s": round(len(t) / (t1 - t0), 2) if t1 > t0 else None}


class Client(threading.Thread):
    """One client of llama-server: `/completion` again and again (the same prompt, cached), each reply's end
    time and the server's own timings of it kept."""

    def __init__(self, port: int, prompt: list[int], new_tokens: int, slot: int = -1) -> None:
        super().__init__(daemon=True)
        self.url, self.stop, self.replies, self.error = f"http://127.0.0.1:{port}/completion", False, [], ""
        self.body = json.dumps({"prompt": prompt, "n_predict": new_tokens, "ignore_eos": True, "temperature": 0.0,
                                "cache_prompt": True, "id_slot": slot}).encode()

    def run(self) -> None:
        while not self.stop:
            req = urllib.request.Request(self.url, self.body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=300) as r:
                    tm = json.loads(r.read())["timings"]
            except Exception as exc:  # noqa: BLE001 - the server went away: the case's own error says why
                self.error = f"{type(exc).__name__}: {exc}"[:300]
                return
            self.replies.append({"t_end": time.time(), **{k: tm.get(k) for k in (
                "predicted_n", "predicted_ms", "predicted_per_token_ms", "prompt_n", "prompt_ms")}})


def server_own(clients: list[Client], t0: float, t1: float) -> dict:
    """The server's own figures over [t0, t1] from its clients' replies: each reply's tokens spread evenly over its
    decode time (its end less `predicted_ms`); ms/token is the server's `predicted_ms` over `predicted_n` of the
    replies decoding in the span; tokens/s each client's tokens in the span over the span, summed."""
    per_client, ms, n = [], 0.0, 0
    for c in clients:
        tokens = 0.0
        for r in list(c.replies):
            if not r["predicted_n"] or not r["predicted_ms"]:
                continue
            b = r["t_end"]
            a = b - r["predicted_ms"] / 1e3
            inside = max(0.0, min(b, t1) - max(a, t0)) / (b - a)
            if inside > 0:
                tokens += r["predicted_n"] * inside
                ms += r["predicted_ms"]
                n += r["predicted_n"]
        per_client.append(tokens / (t1 - t0) if t1 > t0 else 0.0)
    total = sum(per_client) * (t1 - t0)
    return {"tokens": round(total, 1), "ms_per_token": round(ms / n, 4) if n else None,
            "ms_per_token_mean": round(1e3 * (t1 - t0) / total * len(clients), 4) if total else None,
            "tokens_per_s": round(sum(per_client), 2), "client_tokens_per_s": [round(x, 2) for x in per_client],
            "replies": sum(len(c.replies) for c in clients)}


# --- the engines ---------------------------------------------------------------------------------------------

def stop(proc: subprocess.Popen | None, grace_s: float = 20) -> None:
    """SIGTERM to the engine's process group, SIGKILL after grace_s; quiet if it already ended. (llama-server, on
    SIGTERM, waits for the request in flight: its grace is short.)"""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass


def engine_env(s: Setup, graphs: bool = True) -> dict:
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(s.bin))
    if not graphs:
        env["GGML_CUDA_DISABLE_GRAPHS"] = "1"
    return env


def popen(argv: list[str], sink: Path, env: dict) -> subprocess.Popen:
    with open(sink, "w") as f:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)


def wait_for(proc: subprocess.Popen, sink: Path, ok, timeout_s: float, what: str) -> None:
    """Until ok() is true; RuntimeError (with the engine's last words) if it exits or takes over timeout_s."""
    t0 = time.time()
    while not ok():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}: {sink.read_text()[-600:]}")
        if time.time() - t0 > timeout_s:
            raise RuntimeError(f"{what} not ready within {timeout_s:.0f} s: {sink.read_text()[-300:]}")
        time.sleep(0.25)


def start_loop(s: Setup, shape: str, graphs: bool, log: Path, sink: Path) -> subprocess.Popen:
    """llama-cpp-python's loop, plain python; returns once it has logged tokens."""
    argv = [PY, str(LOOPS / "llama_cpp_decode.py"), "--shape", shape, "--gguf", str(s.gguf(shape)),  # it exists
            "--n-gpu-layers", "0" if s.smoke else "-1", "--new-tokens", str(s.new_tokens), "--log", str(log)]
    proc = popen(argv, sink, engine_env(s, graphs))
    wait_for(proc, sink, lambda: log.exists() and log.stat().st_size > 0, 180, "the loop")
    return proc


def server_argv(s: Setup, shape: str, port: int, slots: int, ctx: int, extra: list[str]) -> list[str]:
    return [str(s.bin / "llama-server"), "-m", str(s.gguf(shape)), "--host", "127.0.0.1", "--port", str(port),
            "-c", str(ctx * slots), "-np", str(slots), "-ngl", "0" if s.smoke else "999", "-t", "1" if s.smoke else "4",
            "--no-webui", *extra]


def health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


# --- the reference -------------------------------------------------------------------------------------------

PM_METRICS = ["gr__cycles_active.avg", "gr__cycles_elapsed.max", "dram__bytes_read.sum", "dram__bytes_write.sum",
              "dram__throughput.avg.pct_of_peak_sustained_elapsed"]


def pm_reader() -> int:
    """The reference PM reader's own process (`--pm-reader`): the 13.4 libcupti loaded before anything else, a CUDA
    context (torch), then one line on stdin starts REF seconds of pm_sampling; one JSON line out (pm2.py)."""
    import ctypes
    import importlib.metadata

    lib = importlib.metadata.distribution("nvidia-cuda-cupti").locate_file("nvidia/cu13/lib/libcupti.so.13")
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)  # the soname is then this one for torch and cupti alike
    import numpy as np
    import torch

    torch.zeros(1, device="cuda")
    from cupti import pm_sampling

    print(json.dumps({"ready": True}), flush=True)
    secs = float(sys.stdin.readline())
    res: dict = {}
    try:
        c = pm_sampling.Collector(0)
        c.enable()
        try:
            c.configure(metrics=PM_METRICS, sampling_interval=2_000_000, hardware_buffer_size=256 * 1024 * 1024)
            c.start()
            t0 = time.time()
            time.sleep(secs)
            c.stop()
            t1 = time.time()
            a = np.array([x.metric_values for x in c.decode(max_samples=20000)])
        finally:
            c.disable()
        m, tot = dict(zip(PM_METRICS, a.mean(0).tolist())), a.sum(0)
        res = {"t0": t0, "t1": t1, "samples": len(a), "busy_pct": round(100 * m[PM_METRICS[0]] / m[PM_METRICS[1]], 2),
               "dram_pct": round(m[PM_METRICS[4]], 2), "read_bytes": float(tot[2]), "write_bytes": float(tot[3]),
               "gbs": round((tot[2] + tot[3]) / (t1 - t0) / 1e9, 2)}
    except Exception as exc:  # noqa: BLE001 - the reading's failure is the reading
        res = {"error": f"{type(exc).__name__}: {exc}"[:400]}
    res["libcupti"] = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "cupti" in ln and ".so" in ln})
    print(json.dumps(res), flush=True)
    return 0


class Reference:
    """A reference reader started ahead (its torch import and context while the engine warms), read when asked."""

    def __init__(self, s: Setup, sink: Path) -> None:
        self.s, self.proc = s, None
        if not s.smoke:
            self.proc = subprocess.Popen([PY, __file__, "--pm-reader"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=tools_env(),
                                         stderr=open(sink, "a"), text=True, start_new_session=True)

    def read(self) -> dict:
        if self.proc is None:
            return {"error": "none: cpu smoke"}
        try:
            for wait_s in (120, self.s.ref_s + 60):  # its start (torch, a context), then its reading
                if not select.select([self.proc.stdout], [], [], wait_s)[0]:
                    return {"error": f"the reader said nothing within {wait_s:.0f} s"}
                line = self.proc.stdout.readline()
                if not line.strip():
                    return {"error": f"the reader exited ({self.proc.wait(5)}), see CASE.reference.log"}
                if "ready" in line:
                    self.proc.stdin.write(f"{self.s.ref_s}\n")
                    self.proc.stdin.flush()
            return json.loads(line)
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            stop(self.proc)


def reference_against(ref: dict, own: dict) -> dict:
    """The reference's GB/s times the engine's own ms/token over the same seconds (the mean: those seconds over
    the tokens one sequence made in them, a step of a batched engine): bytes a token (a step)."""
    ms = own.get("ms_per_token_mean")
    if ref.get("gbs") is not None and ms:
        ref["bytes_per_token"] = round(ref["gbs"] * 1e9 * ms / 1e3)
    ref["own"] = own
    return ref


# --- decodemon -----------------------------------------------------------------------------------------------

def dm(*args, timeout: float = 150) -> tuple[dict | None, str, float, float]:
    """`decodemon ARGS`: (its JSON, or None; stderr's tail; wall start; wall end)."""
    t0 = time.time()
    try:
        r = subprocess.run([*DM, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"decodemon {args[0]} timed out after {timeout:.0f} s", t0, time.time()
    t1 = time.time()
    try:
        return json.loads(r.stdout), r.stderr.strip()[-400:], t0, t1
    except ValueError:
        return None, f"rc {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}", t0, t1


def model_facts(rec: Path) -> dict:
    """The model facts in the recording's Hello (the last one that has any)."""
    import msgspec

    from decodemon.probes import wire

    facts = None
    try:
        for _, f in wire.read_recording(rec):
            if isinstance(f, wire.Hello) and f.model is not None:
                facts = f.model
    except (OSError, wire.WireError) as exc:
        return {"error": str(exc)}
    return msgspec.structs.asdict(facts) if facts is not None else {}


def shape_bytes(shape: str, kv_bytes_per_elem: float = 2.0) -> dict:
    """What a token of the shape reads by construction: f16 weights (one row of the embedding table, all of the
    output matrix), and the KV cache's bytes a position (K and V, every layer)."""
    x = SHAPES[shape]
    d, ff, hd = x["embd"], x["ff"], x["embd"] // x["heads"]
    kv, n_vocab = x["heads_kv"] * hd, len(vocab(x["extra_vocab"])[0])
    layer = 2 * (2 * d * d + 2 * kv * d + 3 * ff * d) + 4 * 2 * d
    return {"weights_read": x["layers"] * layer + 2 * n_vocab * d + 2 * d + 4 * d,
            "weights_total": x["layers"] * layer + 2 * 2 * n_vocab * d + 4 * d,
            "kv_per_position": round(x["layers"] * x["heads_kv"] * hd * 2 * kv_bytes_per_elem)}


def kv_third_depth(shape: str) -> int:
    """The depth at which q8_0 KV (34 bytes a 32 elements) is a third of what a token reads: KV = weights / 2."""
    b = shape_bytes(shape, 34 / 32)
    return 256 * math.ceil(b["weights_read"] / 2 / b["kv_per_position"] / 256)


KEEP = ("tokens", "span_s", "span_end_unix_s", "ms_per_token", "ms_per_token_p90", "tokens_per_s", "token_clock",
        "tokens_per_step", "throughput_tokens_per_s", "kernels_per_token", "graph_launches_per_token",
        "kernel_sum_ms_per_token", "gpu_busy_pct", "gpu_busy_source", "sm_active_pct", "dram_gbs", "dram_pct",
        "bytes_per_token_measured", "bytes_per_token_model", "bytes_per_token_note", "bandwidth_gbs",
        "bandwidth_floor_ms", "windows", "verdict", "ceiling", "verdict_pending", "ended", "errors")


def watch(case: str, s: Setup, out: Path, pid: int, python: bool, own, ref: Reference) -> dict:
    """Attach (Python engines), the reference, record, replay; each against the engine's own clock."""
    res: dict = {}
    if python:  # the first attach loads the agent
        j, err, a0, a1 = dm("attach", pid, "--json", "--seconds", 1)
        res["attach"] = {"s": round(a1 - a0, 2), **({k: j.get(k) for k in ("tokens", "ms_per_token", "verdict")}
                                                     if j else {"error": err})}
    res["reference"] = r = ref.read()
    rec = out / f"{case}.dmon"
    after = Reference(s, out / f"{case}.reference.log") if "error" in r and not s.smoke else None
    _, err, r0, r1 = dm("record", pid, "-o", rec, "--seconds", s.record_s, timeout=s.record_s + 150)
    res["record_s"] = round(r1 - r0, 2)
    if after is not None:  # refused before: the seconds just after the record
        res["reference_after"] = after.read()
    time.sleep(1.0)  # the engine's own log of the last seconds is written (a generation, a reply)
    for key in ("reference", "reference_after"):
        if "t0" in res.get(key, {}):
            reference_against(res[key], own(res[key]["t0"], res[key]["t1"]))
    if not rec.exists():
        res["error"] = f"no recording: {err}"
        return res
    j, err, *_ = dm("replay", rec, "--json")
    if j is None:
        res["error"] = f"replay: {err}"
        return res
    (out / f"{case}.json").write_text(json.dumps(j, indent=1))
    res["dm"] = {k: j.get(k) for k in KEEP}
    res["dm"]["probe"] = j.get("probe")
    res["candidates"] = {k: {"state": v.get("state"), "value": v.get("value"), "unit": v.get("unit")}
                         for k, v in (j.get("candidates") or {}).items()}
    res["headline"] = (j.get("verdict") or "none").upper()
    res["kernels_headline"] = "kernel" in str(j.get("verdict") or "").lower()
    res["model"] = model_facts(rec)
    end, span = j.get("span_end_unix_s"), j.get("span_s")
    if end and span:
        res["own"] = own(end - span, end)
    return res


# --- the cases -----------------------------------------------------------------------------------------------

def run_loop(case: str, s: Setup, out: Path) -> dict:
    shape = "llama-8b" if case.startswith("lcpp8b") else "llama-1b"
    log, sink = out / f"{case}.tokens.jsonl", out / f"{case}.engine.log"
    log.unlink(missing_ok=True)
    ref = Reference(s, out / f"{case}.reference.log")
    proc = None
    try:
        proc = start_loop(s, shape, not case.endswith("nographs"), log, sink)
        time.sleep(s.warm_s)
        res = watch(case, s, out, proc.pid, True, lambda a, b: loop_own(log, a, b), ref)
    finally:
        stop(proc)
        stop(ref.proc)
    res.update(shape=s.shape(shape), shape_bytes=shape_bytes(s.shape(shape)))
    return res


def run_server(case: str, s: Setup, out: Path, port: int) -> dict:
    shape = "llama-8b" if case.startswith("server8b") else "llama-1b"
    sink = out / f"{case}.engine.log"
    slots, extra, prompt_len = 1, [], 8
    if case == "server1b_np4":
        slots = 4
    if case == "server1b_kvq8":
        extra = ["-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]
        prompt_len = kv_third_depth(s.shape(shape))
    ctx = 256 * math.ceil((prompt_len + s.request_tokens + 64) / 256)
    argv = server_argv(s, shape, port, slots, ctx, extra)
    pid_file = out / f"{case}.pid"
    if case.endswith("injected"):
        argv = [*DM, "run", "--pid-file", str(pid_file), "--", *argv]
    ref = Reference(s, out / f"{case}.reference.log")
    prompt = [1] + [300 + (i * 7) % 200 for i in range(prompt_len - 1)]
    clients = [Client(port, prompt, s.request_tokens, slot=k if slots > 1 else -1) for k in range(slots)]
    proc = None
    try:
        proc = popen(argv, sink, engine_env(s))
        wait_for(proc, sink, lambda: health(port), 300, "llama-server")
        pid = int(pid_file.read_text().split()[0]) if case.endswith("injected") else proc.pid
        for c in clients:
            c.start()
        wait_for(proc, sink, lambda: all(c.replies or c.error for c in clients), 300, "the first replies")
        errs = [c.error for c in clients if c.error]
        if errs:
            raise RuntimeError(f"client: {errs[0]}")
        time.sleep(s.warm_s)
        res = watch(case, s, out, pid, False, lambda a, b: server_own(clients, a, b), ref)
        res["client_errors"] = [c.error for c in clients if c.error]  # before the stop (which ends them all)
    finally:
        for c in clients:
            c.stop = True
        stop(proc, grace_s=3)
        stop(ref.proc)
    b = shape_bytes(s.shape(shape), 34 / 32 if "kvq8" in case else 2.0)
    res.update(shape=s.shape(shape), slots=slots, prompt_tokens=prompt_len, ctx=ctx, shape_bytes=b)
    if "kvq8" in case:  # the KV's share of the bytes a token reads, at the live depths of the record
        lo, hi = prompt_len, prompt_len + s.request_tokens
        res["kv_share"] = [round(b["kv_per_position"] * d / (b["weights_read"] + b["kv_per_position"] * d), 3)
                           for d in (lo, hi)]
    return res


def compare(out: Path, a: str, b: str) -> dict:
    """`decodemon compare A.dmon B.dmon --json`, kept as OUTDIR/compare_A_B.json; its ratios here."""
    ra, rb = out / f"{a}.dmon", out / f"{b}.dmon"
    if not (ra.exists() and rb.exists()):
        return {"error": "a recording is missing"}
    j, err, *_ = dm("compare", ra, rb, "--json")
    if j is None:
        return {"error": err}
    (out / f"compare_{a}_{b}.json").write_text(json.dumps(j, indent=1))
    return {"b_over_a": j.get("b_over_a"), "verdicts": j.get("verdicts")}


def run_case(case: str, s: Setup, out: Path, port: int) -> dict:
    res = run_loop(case, s, out) if case.startswith("lcpp") else run_server(case, s, out, port)
    if case.endswith("nographs"):
        res["compare"] = compare(out, case.replace("nographs", "graphs"), case)
    return res


def needs(case: str) -> tuple[str, int]:
    """The shape whose GGUF a case loads, and its seconds (COST_S)."""
    shape = "llama-8b" if "8b" in case else "llama-1b"
    return shape, COST_S[case.split("_")[0]]


# --- the table -----------------------------------------------------------------------------------------------

def _g(x, scale=1.0, nd=3):
    return "-" if x is None else f"{x / scale:.{nd}f}"


def table(results: list[dict]) -> str:
    """One line a case: decodemon's figures with the engine's own (and the reference's) beside them."""
    lines = ["| case | own ms/tok | dm ms/tok | GB/tok dm | GB/tok ref (GB/s) | GB/tok model | launches/tok | "
             "busy % | tok/step / slots | tok/s dm (own) | verdict | candidates |", "|" + "---|" * 12]
    for r in results:
        if "skipped" in r or ("error" in r and "dm" not in r):
            lines.append(f"| {r['case']} | {r.get('skipped') or 'error: ' + str(r.get('error'))[:160]} |")
            continue
        d, own = r.get("dm") or {}, r.get("own") or {}
        ref = r.get("reference") or {}
        if "bytes_per_token" not in ref and "bytes_per_token" in (r.get("reference_after") or {}):
            ref = r["reference_after"]
        cand = " ".join(f"{k[:4]}:{v['state'][:4] if v['state'] else '-'}"
                        f"{'' if v['value'] is None else '=' + format(v['value'], '.3g')}"
                        for k, v in (r.get("candidates") or {}).items())
        refcol = (f"{_g(ref.get('bytes_per_token'), 1e9)} ({ref.get('gbs')})" if ref.get("bytes_per_token")
                  else (ref.get("error") or "-")[:40])
        own_tps = own.get("tokens_per_s")
        lines.append(" | ".join(str(x) for x in (
            f"| {r['case']}", _g(own.get("ms_per_token")), _g(d.get("ms_per_token")),
            _g(d.get("bytes_per_token_measured"), 1e9), refcol, _g(d.get("bytes_per_token_model"), 1e9),
            _g(d.get("kernels_per_token"), nd=1), d.get("gpu_busy_pct"),
            f"{d.get('tokens_per_step')}" + (f" / {r['slots']}" if "slots" in r else ""),
            f"{d.get('throughput_tokens_per_s') or d.get('tokens_per_s')} ({own_tps})",
            r.get("headline"), cand)) + " |")
        if r.get("error"):
            lines.append(f"| {r['case']} | error: {str(r['error'])[:200]} |")
        if r.get("compare") and "error" not in r["compare"]:
            lines.append(f"| {r['case']} | compare (B/A): {json.dumps(r['compare'])[:300]} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--cpu-smoke", action="store_true", help="the tiny shape on the CPU build (no GPU, no PM)")
    ap.add_argument("--pm-reader", action="store_true", help="(this file as the reference reader's own process)")
    a = ap.parse_args()
    if a.pm_reader:
        return pm_reader()
    if not a.out:
        ap.error("OUTDIR is needed")
    t_start = time.time()
    s, out = Setup(a.cpu_smoke), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if s.smoke and not s.gguf("llama-1b").exists():
        from llama_cpp_decode import write_gguf

        WORK.mkdir(exist_ok=True)
        write_gguf(s.gguf("llama-1b"), s.shape("llama-1b"))
    budget = BUDGET_S / (4 if s.smoke else 1)
    results: list[dict] = []
    for k, case in enumerate(a.cases.split(",")):
        shape, cost = needs(case)
        cost /= 4 if s.smoke else 1
        t = time.time()
        while (why := s.ready(shape)) and why.endswith("not yet") and time.time() + cost < t_start + budget:
            time.sleep(2)  # the build or the GGUF (llama_cpp.sh setup) is still under way
        if why:
            results.append({"case": case, "skipped": why})
        elif time.time() + cost > t_start + budget:
            results.append({"case": case, "skipped": f"time: {t_start + budget - time.time():.0f} s left, "
                                                     f"the case takes ~{cost:.0f}"})
        else:
            try:
                results.append({"case": case, **run_case(case, s, out, 8200 + k)})
            except Exception as exc:  # noqa: BLE001 - one case's failure is its row, the others still run
                results.append({"case": case, "error": f"{type(exc).__name__}: {exc}"[:800]})
        results[-1]["seconds"] = round(time.time() - t, 1)
        print(f"[{time.time() - t_start:5.1f}s] {case}: {json.dumps(results[-1])[:600]}", flush=True)
        (out / "llama_cpp.json").write_text(json.dumps(results, indent=1))
    tab = table(results)
    (out / "llama_cpp.md").write_text(tab + "\n")
    print(tab, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
