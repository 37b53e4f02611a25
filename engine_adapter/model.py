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

    def __init__(self, shape: Shape, device: str, dtype: torch.dtype, max_len: int, seed: int = 0) -> None:
        self.shape, self.device, self.dtype, self.max_len = shape, device, dtype, max_len
        g = torch.Generator(device=device).manual_seed(seed)
        s = shape

        def w(*dims, scale=None):
            scale = scale if scale is not None else dims[-1] ** -0.5
            return (torch.randn(*dims, generator=g, device=device) * scale).to(dtype=dtype)

        self.embed = w(s.vocab, s.hidden, scale=0.02)
        self.lm_head = self.embed if s.tied else w(s.vocab, s.hidden)
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.layers = []
        for _ in range(s.layers):
            self.layers.append(dict(
                ln1=torch.ones(s.hidden, device=device, dtype=dtype),
                ln2=torch.ones(s.hidden, device=device, dtype=dtype),
                q=w(s.q_heads * s.head_dim, s.hidden), k=w(s.kv_heads * s.head_dim, s.hidden),
                v=w(s.kv_heads * s.head_dim, s.hidden), o=w(s.hidden, s.q_heads * s.head_dim),
                qn=torch.ones(s.head_dim, device=device, dtype=dtype),
                kn=torch.ones(s.head_dim, device=device, dtype=dtype),
                gate=w(s.ffn, s.hidden), up=w(s.ffn, s.hidden), down=w(s.hidden, s.ffn),
            ))
        self.k_cache = torch.zeros(s.layers, 1, s.kv_heads, max_len, s.head_dim, device=device, dtype=dtype)
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
        return 2 * s.layers * s.kv_heads * s.head_dim * self.k_cache.element_size()

    def reset(self, first_token: int = 1) -> None:
        """Empty the cache and start again from one token at position 0."""
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.token.fill_(first_token)
        self.pos.zero_()

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
            q = F.linear(h, L["q"]).view(1, s.q_heads, 1, s.head_dim)
            k = F.linear(h, L["k"]).view(1, s.kv_heads, 1, s.head_dim)
            v = F.linear(h, L["v"]).view(1, s.kv_heads, 1, s.head_dim)
            q = self._rope(self._rms(q, L["qn"]), cos, sin)
            k = self._rope(self._rms(k, L["kn"]), cos, sin)
            self.k_cache[i].index_copy_(2, self.pos, k)
            self.v_cache[i].index_copy_(2, self.pos, v)
            a = F.scaled_dot_product_attention(q, self.k_cache[i], self.v_cache[i], attn_mask=mask,
                                               enable_gqa=True)
            x = x + F.linear(a.reshape(1, -1), L["o"])
            h = self._rms(x, L["ln2"])
            x = x + F.linear(F.silu(F.linear(h, L["gate"])) * F.linear(h, L["up"]), L["down"])
        logits = F.linear(self._rms(x, self.final_norm), self.lm_head)
        nxt = torch.argmax(logits, dim=-1)
        self.token.copy_(nxt)
        self.pos.add_(1)
        return nxt
