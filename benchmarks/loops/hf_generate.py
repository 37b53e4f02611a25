"""transformers' own `generate()` in a loop, random weights, as a user runs it: no decodemon in it.

    python benchmarks/loops/hf_generate.py --shape qwen3-0.6b [--cache static] [--log tokens.jsonl]
    python benchmarks/loops/hf_generate.py --shape tiny --device cpu --generations 3

`--cache static` sets `generation_config.cache_implementation = "static"`, with which transformers compiles
its own forward (CUDA graphs, `CompileConfig(mode="reduce-overhead")`). Every token's host time goes to
`--log` through a streamer (the engine's own count). `--profile-steps N` instead prints torch.profiler's
kernels and kernel time per decode step and exits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TokenLog, add_loop_options, build, pick_device, profile_kernels, stop_on_term  # noqa: E402


class _Streamer:
    """generate()'s streamer: one put() per step, the prompt first. Reads no tensor, so it never syncs."""

    def __init__(self, log: TokenLog) -> None:
        self.log, self.prompt_seen = log, False

    def put(self, value) -> None:
        if self.prompt_seen:
            self.log.put()
        self.prompt_seen = True

    def end(self) -> None:
        self.prompt_seen = False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "llama-8b", "tiny"])
    ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--generations", type=int, default=0, help="0: until SIGTERM")
    add_loop_options(ap)
    a = ap.parse_args()
    import torch

    device = pick_device(torch, a.device)
    model = build("qwen3" if a.shape != "llama-8b" else "llama", a.shape, device, a.prompt + 2 * a.new_tokens + 8)
    if a.cache == "static":
        model.generation_config.cache_implementation = "static"
    ids = torch.randint(0, model.config.vocab_size, (1, a.prompt), device=device)
    log, flag = TokenLog(a.log), stop_on_term()

    def generate(n, streamer=None):
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0, streamer=streamer)

    generate(8)  # warm (and, with a static cache, compile)
    if a.profile_steps:
        generate(2 * a.profile_steps)
        print(profile_kernels(generate, a.profile_steps, a.profile_out), flush=True)
        return 0
    print("decoding", flush=True)
    done = 0
    while not flag["stop"] and (a.generations == 0 or done < a.generations):
        generate(a.new_tokens, _Streamer(log))
        log.flush()
        done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
