"""Steps of known DRAM bytes, replayed as CUDA graphs: the calibration loops decodemon's bytes per token are held
against. Random bf16 data; the host waits for each step (as a decode loop's `.item()` does) and logs its time.

    python benchmarks/loops/known_bytes.py --gb 1.5 [--marks] [--log tokens.jsonl]
    python benchmarks/loops/known_bytes.py --kv 262144 [--marks]   # a Llama-1B-shaped step over a deep KV cache
    python benchmarks/loops/known_bytes.py --gb 0.01 --device cpu --steps 50  # the CPU shape the tests run

`--gb G`: each step reduces one G-GB tensor (every byte read once, a few KB written). `--kv P`: each step is a
decode step of a Llama-3.2-1B shape (16 layers, hidden 2048, 32 query and 8 KV heads of 64, FFN 8192, vocab
128,256): every weight read once, and attention over P cached positions in every layer, every key and value read
once. The bytes a step must move are printed first (`known_bytes_per_step`) and go to the log's first line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TokenLog, add_loop_options, pick_device, stop_on_term  # noqa: E402

LLAMA_1B = dict(layers=16, hidden=2048, q_heads=32, kv_heads=8, head_dim=64, ffn=8192, vocab=128256)


def reduction_step(torch, device: str, gb: float):
    """A step that reads `gb` GB once: a column sum of a (rows, 8192) tensor. (step, bytes it moves)."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    cols = 8192
    rows = max(1, int(gb * 1e9 / (cols * torch.finfo(dtype).bits // 8)))
    x = torch.randn(rows, cols, device=device, dtype=dtype)
    y = torch.empty(cols, device=device, dtype=dtype)

    def step():
        torch.sum(x, dim=0, out=y)
        return y

    return step, x.nbytes + y.nbytes


def kv_step(torch, device: str, positions: int, attn: str = "sdpa"):
    """One decode step of LLAMA_1B over `positions` cached keys and values per layer. (step, bytes it must move:
    the weights and the cache read once each, and with `attn="matmul"` the scores written and read back).

    `attn="sdpa"`: attention as transformers' Llama runs it, scaled_dot_product_attention with the 32 query heads
    grouped over the 8 KV heads (enable_gqa). `"matmul"`: scores = q·Kᵀ, softmax, ·V as three kernels, each
    KV head's 4 query heads as its queries: every key and value read once, the scores through DRAM."""
    import torch.nn.functional as F

    c = LLAMA_1B
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    h, hd, nq, nkv = c["hidden"], c["head_dim"], c["q_heads"], c["kv_heads"]
    g = torch.Generator(device=device).manual_seed(0)

    def w(*shape):
        return (torch.randn(*shape, device=device, dtype=dtype, generator=g) * shape[-1] ** -0.5)

    layers = [dict(qkv=w(h, (nq + 2 * nkv) * hd), o=w(nq * hd, h), up=w(h, 2 * c["ffn"]), down=w(c["ffn"], h),
                   n1=torch.ones(h, device=device, dtype=dtype), n2=torch.ones(h, device=device, dtype=dtype),
                   k=torch.randn(1, nkv, positions, hd, device=device, dtype=dtype, generator=g),
                   v=torch.randn(1, nkv, positions, hd, device=device, dtype=dtype, generator=g))
              for _ in range(c["layers"])]
    head = w(h, c["vocab"])
    x0 = torch.randn(1, h, device=device, dtype=dtype, generator=g)
    out = torch.empty((), device=device, dtype=torch.long)

    def rms(x, weight):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * weight

    def step():
        x = x0
        for L in layers:
            qkv = rms(x, L["n1"]) @ L["qkv"]
            if attn == "sdpa":
                q = qkv[:, :nq * hd].view(1, nq, 1, hd)
                a = F.scaled_dot_product_attention(q, L["k"], L["v"], enable_gqa=True)
            else:
                q = qkv[:, :nq * hd].view(1, nkv, nq // nkv, hd)  # each KV head's query heads as its queries
                a = torch.softmax(q @ L["k"].transpose(-1, -2) * hd ** -0.5, dim=-1) @ L["v"]
            x = x + a.reshape(1, nq * hd) @ L["o"]
            gate, up = (rms(x, L["n2"]) @ L["up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ L["down"]
        torch.argmax(x @ head, dim=-1, out=out.view(1))
        return out

    weights = sum(t.nbytes for L in layers for k, t in L.items() if k not in ("k", "v")) + head.nbytes
    kv = sum(L["k"].nbytes + L["v"].nbytes for L in layers)
    # matmul: the scores (1, 8, 4, P) written by q·Kᵀ, read and written by softmax, read by ·V
    scores = 4 * nq * positions * x0.element_size() * c["layers"] if attn == "matmul" else 0
    return step, weights + kv + scores, {"weights_bytes": weights, "kv_bytes": kv, "scores_bytes": scores,
                                         "attn": attn}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.5, help="GB a step reads (the reduction step)")
    ap.add_argument("--kv", type=int, default=0, help="a Llama-1B-shaped decode step over this many positions")
    ap.add_argument("--attn", choices=["sdpa", "matmul"], default="sdpa", help="attention of the --kv step")
    ap.add_argument("--marks", action="store_true", help="decodemon's mark_token() after each step")
    ap.add_argument("--eager", action="store_true", help="launch the step's kernels each time (no CUDA graph)")
    ap.add_argument("--steps", type=int, default=0, help="0: until SIGTERM")
    add_loop_options(ap)
    a = ap.parse_args()
    import torch

    device = pick_device(torch, a.device)
    parts: dict = {}
    if a.kv:
        step, known, parts = kv_step(torch, device, a.kv, a.attn)
    else:
        step, known = reduction_step(torch, device, a.gb)
    run = step
    if device.startswith("cuda") and not a.eager:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s), torch.no_grad():
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            step()
        run = lambda: graph.replay()  # noqa: E731 - looked up at each step, as an engine's own code does
    if a.profile_steps:  # torch.profiler's kernels and kernel time a step, then exit (no decodemon)
        from common import profile_kernels

        def steps(n):
            for _ in range(n):
                run()
                torch.cuda.synchronize()

        print(json.dumps(profile_kernels(steps, a.profile_steps, a.profile_out)), flush=True)
        return 0
    mark = None
    if a.marks:
        from decodemon.engine_adapter import mark_token as mark
    head = {"known_bytes_per_step": known, **parts, "graphed": run is not step, "device": device}
    print(json.dumps(head), flush=True)
    if a.log:
        with open(a.log, "a") as f:
            f.write(json.dumps(head) + "\n")
    log, flag, done = TokenLog(a.log), stop_on_term(), 0
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    last = time.monotonic()
    with torch.no_grad():
        while not flag["stop"] and (a.steps == 0 or done < a.steps):
            run()
            sync()  # the host waits for the step, as a decode loop that reads its token does
            log.put()
            if mark is not None:
                mark()
            done += 1
            if time.monotonic() - last >= 0.5:
                log.flush()
                last = time.monotonic()
    log.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
