"""What the decode loops under benchmarks/loops share: model shapes, random weights, the loop's own token log,
and torch.profiler's count of one step. None of it imports decodemon: these are the engines it must read."""

from __future__ import annotations

import json
import os
import signal
import time

SHAPES = {  # transformers config fields of the shapes the method's figures use
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=128256, tie_word_embeddings=False),
    "stories-110m": dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                         num_key_value_heads=12, head_dim=64, vocab_size=32000, tie_word_embeddings=False),  # gpt-fast's
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=True),
}


def add_loop_options(ap) -> None:
    """The options every loop here takes: where it runs, its token log, and torch.profiler's count instead."""
    ap.add_argument("--device", default=None)
    ap.add_argument("--log")
    ap.add_argument("--profile-steps", type=int, default=0)
    ap.add_argument("--profile-out", default="profile.json")


def pick_device(torch, asked: str | None) -> str:
    """CUDA when there is one (or what was asked for); on the CPU, one thread (a tiny model gains nothing from
    more, and spinning workers on a shared 2-core machine slow everything beside it)."""
    device = asked or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)
    return device


def build(kind: str, shape: str, device: str, max_positions: int = 4096):
    """A transformers causal LM (Qwen3 or Llama architecture) with random weights, made on its device."""
    import torch
    import transformers

    cls, cfg_cls = ((transformers.Qwen3ForCausalLM, transformers.Qwen3Config) if kind == "qwen3"
                    else (transformers.LlamaForCausalLM, transformers.LlamaConfig))
    cfg = cfg_cls(**SHAPES[shape], max_position_embeddings=max_positions)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(cfg).to(dtype).eval()
    return model


class TokenLog:
    """The loop's own clock: every token's host time (unix s), appended to a JSON-lines file in batches."""

    def __init__(self, path: str | None) -> None:
        self.path, self.times = path, []

    def put(self, n: int = 1) -> None:
        now = time.time()
        self.times.extend([now] * n)

    def flush(self, **extra) -> None:
        """Append the batch's times (and `extra`, keys of the line beside "t")."""
        if self.path and self.times:
            with open(self.path, "a") as f:
                f.write(json.dumps({"t": self.times, **extra}) + "\n")
        self.times = []


def stop_on_term() -> dict:
    """SIGTERM ends the loop at the next batch, so the log is flushed."""
    flag = {"stop": False}
    signal.signal(signal.SIGTERM, lambda *_: flag.update(stop=True))
    return flag


def profile_kernels(run, steps: int, out: str) -> dict:
    """torch.profiler's CUDA kernels and kernel time per step: run(steps) and run(2*steps) differ by `steps`
    decode steps (whatever both share, a prefill or a warm-up, cancels)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    def count(n):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            run(n)
            torch.cuda.synchronize()
        ev = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        kernels = [e for e in ev if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
        return len(kernels), sum(e.device_time for e in kernels) / 1e3  # ms

    def wall_ms(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run(n)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    walls = [(wall_ms(2 * steps) - wall_ms(steps)) / steps for _ in range(3)]
    (k1, t1), (k2, t2) = count(steps), count(2 * steps)
    r = {"steps": steps, "kernels_per_step": (k2 - k1) / steps, "kernel_ms_per_step": (t2 - t1) / steps,
         "ms_per_step_unprofiled": sorted(walls)[1], "pid": os.getpid()}
    with open(out, "w") as f:
        json.dump(r, f)
    return r
