"""gpt-fast's decode loop: `decode_one_token` under `torch.compile(mode="reduce-overhead")` that never syncs per
token (the shape of transformers' "static cache + torch.compile" recipe), or eager (`--eager`), random weights.

    python benchmarks/loops/compiled_decode.py --shape llama-8b [--log tokens.jsonl] [--marks]
    python benchmarks/loops/compiled_decode.py --shape qwen3-0.6b --eager [--marks]
    python benchmarks/loops/compiled_decode.py --shape stories-110m --eager      (gpt-fast's 110M, eager)
    python benchmarks/loops/compiled_decode.py --shape tiny --device cpu --batches 2

Compiled, the host enqueues `--batch` tokens, then waits for the GPU once: it runs ~100 ms ahead of the GPU, as
fast engines do, and the log gets each batch's tokens at the moment the GPU finished them (evenly spread over
the batch: the loop's own wall-clock rate). Eager, the host is the slower side and each token is logged when its
step returns. `--marks` passes decodemon's `mark_token` as the per-token callback, as gpt-fast's
`generate(callback=...)` would: the only decodemon line, and one that marks at enqueue time. `--profile-steps N`
prints torch.profiler's kernels and kernel time per step.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TokenLog, add_loop_options, build, pick_device, profile_kernels, stop_on_term  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="llama-8b", choices=["qwen3-0.6b", "llama-8b", "stories-110m", "tiny"])
    ap.add_argument("--batch", type=int, default=200, help="tokens enqueued between two waits for the GPU")
    ap.add_argument("--max-len", type=int, default=1024)
    ap.add_argument("--batches", type=int, default=0, help="0: until SIGTERM")
    ap.add_argument("--eager", action="store_true", help="no torch.compile: the host-bound eager loop")
    ap.add_argument("--marks", action="store_true", help="decodemon's mark_token as the per-token callback")
    add_loop_options(ap)
    a = ap.parse_args()
    import torch
    from transformers import StaticCache

    device = pick_device(torch, a.device)
    model = build("llama" if a.shape in ("llama-8b", "stories-110m") else "qwen3", a.shape, device, a.max_len)
    cache = StaticCache(config=model.config, max_cache_len=a.max_len)
    pos = torch.zeros(1, dtype=torch.long, device=device)

    def decode_one_token(token, cache_position):
        logits = model(token, position_ids=cache_position[None], cache_position=cache_position,
                       past_key_values=cache, use_cache=True, return_dict=False)[0]
        return torch.argmax(logits[:, -1], dim=-1)[:, None]

    token = torch.zeros(1, 1, dtype=torch.long, device=device)
    with torch.no_grad():  # one eager step first: the static cache makes its tensors outside any CUDA graph
        decode_one_token(token, pos)
    compiled = device != "cpu" and not a.eager
    step = torch.compile(decode_one_token, mode="reduce-overhead", fullgraph=True) if compiled else decode_one_token
    callback = None
    if a.marks:
        from decodemon.engine_adapter import mark_token as callback
    each = [] if not compiled else None  # eager: each token's time as its step returns

    def run(n):
        nonlocal token
        with torch.no_grad():
            for _ in range(n):
                if int(pos_host[0]) >= a.max_len - 1:  # wrap the cache: host-side count, no sync
                    cache.reset()
                    pos.zero_()
                    pos_host[0] = 0
                if compiled:  # a new step of the CUDA-graph tree: the cache it writes in place is not an output
                    torch.compiler.cudagraph_mark_step_begin()
                token = step(token.clone(), pos)
                pos.add_(1)
                pos_host[0] += 1
                if callback is not None:
                    callback(pos_host[0])
                if each is not None:
                    each.append(time.time())

    pos_host = [0]
    for _ in range(3):  # compile, record, replay
        run(4)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    if each is not None:
        each.clear()
    if a.profile_steps:
        run(2 * a.profile_steps)
        print(profile_kernels(run, a.profile_steps, a.profile_out), flush=True)
        return 0
    print("decoding", flush=True)
    log, flag, done = TokenLog(a.log), stop_on_term(), 0
    while not flag["stop"] and (a.batches == 0 or done < a.batches):
        t0 = time.time()
        run(a.batch)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        t1 = time.time()
        if each is not None:
            log.times.extend(each)
            each.clear()
        else:
            log.times.extend(t0 + (t1 - t0) * (k + 1) / a.batch for k in range(a.batch))
        log.flush()
        done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
