"""transformers' own continuous batching, as a serving engine runs it: a background generation thread and a
paged cache, kept at `--in-flight` requests of `--new-tokens` tokens each, random weights, no decodemon in it.

    python benchmarks/loops/hf_cb.py --shape qwen3-0.6b --in-flight 16 [--log tokens.jsonl]
    python benchmarks/loops/hf_cb.py --shape tiny --device cpu --in-flight 4 --requests 12

Every finished request's token times (unix s, from the engine's own `record_timestamps`) go to `--log`, one line
a request: the engine's own count of the tokens it made, and its time to first token (`ttft_s`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TokenLog, add_loop_options, build, pick_device, stop_on_term  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "llama-8b", "tiny"])
    ap.add_argument("--in-flight", type=int, default=16, help="requests kept in flight")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--requests", type=int, default=0, help="0: until SIGTERM")
    ap.add_argument("--num-blocks", type=int, default=0,
                    help="the paged cache's blocks of 32 tokens, and as many tokens a step at most (0: the "
                         "engine's own choice, from the device's memory)")
    add_loop_options(ap)
    a = ap.parse_args()
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    device = pick_device(torch, a.device)
    model = build("llama" if a.shape == "llama-8b" else "qwen3", a.shape, device)
    gen = GenerationConfig(max_new_tokens=a.new_tokens, do_sample=False, eos_token_id=-1)
    # a small cache sizes the step's buffers too (left to itself on a CPU, a step's took ~10x the time)
    small = {"num_blocks": a.num_blocks, "block_size": 32, "max_batch_tokens": 32 * a.num_blocks}
    cb = ContinuousBatchingConfig(**(small if a.num_blocks else {}))
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    offset = time.time() - time.perf_counter()  # the engine's timestamps are perf_counter's
    log, flag, added, done = TokenLog(a.log), stop_on_term(), 0, 0

    def add() -> None:
        nonlocal added
        manager.add_request([1 + (added + k) % 50 for k in range(16)], max_new_tokens=a.new_tokens,
                            record_timestamps=True)
        added += 1

    for _ in range(a.in_flight):
        add()
    print("decoding", flush=True)
    try:
        while not flag["stop"] and (a.requests == 0 or done < a.requests):
            out = manager.get_result(timeout=1.0)
            if out is None:
                continue
            done += 1
            stamps = out.timestamps or []
            log.times.extend(t + offset for t in stamps)
            # the engine's own time to first token: its first token's stamp after the request's arrival
            log.flush(**({"ttft_s": stamps[0] - out.created_time} if stamps else {}))
            if a.requests == 0 or added < a.requests:
                add()
    finally:
        manager.stop(block=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
