"""A decoder-only transformer with random weights, for demos and measurements.

Qwen3-0.6B's shape by default (hidden 1024, FFN 3072, 28 layers, 16 query
heads, 8 KV heads, head_dim 128, vocab 151936, tied embeddings, RMSNorm with
per-head q/k norms, rotary), a static KV cache, batch 1, greedy. One step is
written so it can be captured as a CUDA graph: every input it reads (the
token, the position) lives in a device buffer the step itself updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """Model dimensions."""

    name: str
    hidden: int
    ffn: int
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True


SHAPES = {
    "qwen3-0.6b": Shape("qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, True),
    # Llama-3-8B's shape: weight reads dominate the token, so graphed decode sits near the floor.
    "llama-8b": Shape("llama-8b", 4096, 14336, 32, 32, 8, 128, 128256, False),
    "tiny": Shape("tiny", 64, 128, 2, 4, 2, 16, 512, True),
}


class DecodeModel:
    """Weights, KV cache and one greedy decode step, all on one device."""

    def __init__(self, shape: Shape, device: str, dtype: torch.dtype, max_len: int, seed: int = 0,
                 tp_rank: int = 0, tp_size: int = 1, all_reduce=None) -> None:
        """`tp_size` > 1 shards Megatron-style: attention heads and the FFN split across ranks, each layer's
        attention output and MLP output summed by `all_reduce` (2 per layer); embeddings and head replicated."""
        self.shape, self.device, self.dtype, self.max_len = shape, device, dtype, max_len
        self.start_pos = 0  # the context depth decoding starts (and wraps back) at
        s = shape
        if tp_size > 1 and (s.q_heads % tp_size or s.kv_heads % tp_size or s.ffn % tp_size):
            raise ValueError(f"tp {tp_size} does not divide {s.q_heads} q heads, {s.kv_heads} kv heads, ffn {s.ffn}")
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.all_reduce = all_reduce if tp_size > 1 else (lambda t: t)
        self.q_local, self.kv_local, self.ffn_local = s.q_heads // tp_size, s.kv_heads // tp_size, s.ffn // tp_size
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*dims, scale=None):
            scale = scale if scale is not None else dims[-1] ** -0.5
            return (torch.randn(*dims, generator=g, device=device) * scale).to(dtype=dtype)

        self.embed = w(s.vocab, s.hidden, scale=0.02)
        self.lm_head = self.embed if s.tied else w(s.vocab, s.hidden)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        r, hd = tp_rank, s.head_dim
        qs = slice(r * self.q_local * hd, (r + 1) * self.q_local * hd)
        ks = slice(r * self.kv_local * hd, (r + 1) * self.kv_local * hd)
        fs = slice(r * self.ffn_local, (r + 1) * self.ffn_local)
        self.layers = []
        for _ in range(s.layers):
            # every rank draws the full weights from the same seed, then keeps its shard: same model at any tp
            full = dict(q=w(s.q_heads * hd, s.hidden), k=w(s.kv_heads * hd, s.hidden), v=w(s.kv_heads * hd, s.hidden),
                        o=w(s.hidden, s.q_heads * hd), gate=w(s.ffn, s.hidden), up=w(s.ffn, s.hidden),
                        down=w(s.hidden, s.ffn))
            self.layers.append(dict(
                ln1=torch.ones(s.hidden, device=device, dtype=dtype),
                ln2=torch.ones(s.hidden, device=device, dtype=dtype),
                q=full["q"][qs].contiguous(), k=full["k"][ks].contiguous(), v=full["v"][ks].contiguous(),
                o=full["o"][:, qs].contiguous(),
                qn=torch.ones(hd, device=device, dtype=dtype), kn=torch.ones(hd, device=device, dtype=dtype),
                gate=full["gate"][fs].contiguous(), up=full["up"][fs].contiguous(), down=full["down"][:, fs].contiguous(),
            ))
            del full
        self.k_cache = torch.zeros(s.layers, 1, self.kv_local, max_len, s.head_dim, device=device, dtype=dtype)
        self.v_cache = torch.zeros_like(self.k_cache)
        inv = 1.0 / (10000 ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        ang = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)
        self.cos = ang.cos().to(device=device, dtype=dtype)
        self.sin = ang.sin().to(device=device, dtype=dtype)
        self.positions = torch.arange(max_len, device=device)
        self.token = torch.zeros(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)

    def weight_bytes(self) -> int:
        """Bytes of weights read per token (the tied head counted once)."""
        ts = [self.embed, self.final_norm] + ([] if self.shape.tied else [self.lm_head])
        for L in self.layers:
            ts += list(L.values())
        return sum(t.numel() * t.element_size() for t in ts)

    def kv_bytes_per_position(self) -> int:
        """KV-cache bytes one position adds across all layers."""
        s = self.shape
        return 2 * s.layers * self.kv_local * s.head_dim * self.k_cache.element_size()

    def collectives_per_token(self) -> int:
        """All-reduces one token makes, counted from `step` below: attention output and MLP output, per layer."""
        return 2 * self.shape.layers if self.tp_size > 1 else 0

    def collective_bytes(self) -> int:
        """Payload of one all-reduce: the residual stream of one token."""
        return self.shape.hidden * self.k_cache.element_size()

    def reset(self, first_token: int = 1) -> None:
        """Empty the cache and start again from one token at `start_pos` (0 unless a context depth is set: the
        positions before it stand for a prompt already in the cache, and attention reads them)."""
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.token.fill_(first_token)
        self.pos.fill_(self.start_pos)

    @staticmethod
    def _rms(x, w, eps=1e-6):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def _rope(self, x, cos, sin):
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def step(self) -> torch.Tensor:
        """Decode one token from self.token at self.pos; writes the next token and position back."""
        s = self.shape
        x = F.embedding(self.token, self.embed)  # [1, hidden]
        cos = self.cos.index_select(0, self.pos)  # [1, hd/2]
        sin = self.sin.index_select(0, self.pos)
        mask = (self.positions <= self.pos).view(1, 1, 1, -1)
        for i, L in enumerate(self.layers):
            h = self._rms(x, L["ln1"])
            q = F.linear(h, L["q"]).view(1, self.q_local, 1, s.head_dim)
            k = F.linear(h, L["k"]).view(1, self.kv_local, 1, s.head_dim)
            v = F.linear(h, L["v"]).view(1, self.kv_local, 1, s.head_dim)
            q = self._rope(self._rms(q, L["qn"]), cos, sin)
            k = self._rope(self._rms(k, L["kn"]), cos, sin)
            self.k_cache[i].index_copy_(2, self.pos, k)
            self.v_cache[i].index_copy_(2, self.pos, v)
            a = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask,
                                               enable_gqa=True)
            x = x + self.all_reduce(F.linear(a.reshape(1, -1), L["o"]))
            h = self._rms(x, L["ln2"])
            x = x + self.all_reduce(F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"]))
        logits = F.linear(self._rms(x, self.final_norm), self.lm_head)
        nxt = torch.argmax(logits, dim=-1)
        self.token.copy_(nxt)
        self.pos.add_(1)
        return nxt


def cuda_graph_step(step, reset):
    """One decode step captured as a CUDA graph: three warm-up steps on a side stream (allocations and autotuning
    stay outside the capture), the capture, then `reset()`. Returns `replay() -> the step's output buffer`."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    reset()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    reset()

    def replay():
        graph.replay()
        return out
    replay.graph = graph  # kept alive with the function
    return replay
