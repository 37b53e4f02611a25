"""A hand-written transformers decode loop, eager: a DynamicCache, `.item()` on every token, and decodemon's
`mark_token()` after each one (`--no-marks` leaves it out). Random weights.

    python benchmarks/loops/manual_decode.py --shape qwen3-0.6b [--log tokens.jsonl] [--no-marks]
    python benchmarks/loops/manual_decode.py --shape tiny --device cpu --generations 2

Each generation decodes `--new-tokens` tokens after a short prompt, then starts again with a fresh cache; every
token's host time goes to `--log` (one line a generation: the loop's own clock).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TokenLog, add_loop_options, build, pick_device, stop_on_term  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "llama-8b", "tiny"])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--generations", type=int, default=0, help="0: until SIGTERM")
    ap.add_argument("--no-marks", action="store_true", help="no mark_token() call")
    add_loop_options(ap)
    a = ap.parse_args()
    import torch
    from transformers import DynamicCache

    device = pick_device(torch, a.device)
    model = build("llama" if a.shape == "llama-8b" else "qwen3", a.shape, device)
    mark = None
    if not a.no_marks:
        from decodemon.engine_adapter import mark_token as mark
    prompt = torch.arange(1, 17, device=device)[None]
    log, flag, done = TokenLog(a.log), stop_on_term(), 0
    print("decoding", flush=True)
    with torch.no_grad():
        while not flag["stop"] and (a.generations == 0 or done < a.generations):
            cache = DynamicCache(config=model.config)
            out = model(prompt, past_key_values=cache, use_cache=True)
            token = int(out.logits[0, -1].argmax().item())
            for k in range(a.new_tokens):
                out = model(torch.tensor([[token]], device=device), past_key_values=cache, use_cache=True)
                token = int(out.logits[0, -1].argmax().item())
                log.put()
                if mark is not None:
                    mark(depth=prompt.shape[1] + k + 1)
                if flag["stop"]:
                    break
            log.flush()
            done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
