"""A deliberately narrow kernel: a few blocks stream a large buffer, so the grid, not the bus, binds.

Used to make an OCCUPANCY-bound recording by construction (the first seed's
§4: "the KDA decode step running 12 blocks on 132 SMs").
"""

from __future__ import annotations

import torch


def make_narrow_op(blocks: int, megabytes: int, device: str):
    """Return a callable that reads `megabytes` of memory with a grid of `blocks` blocks."""
    import triton
    import triton.language as tl

    @triton.jit
    def _stream(src, dst, n_per_block, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        base = pid * n_per_block
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for off in range(0, n_per_block, BLOCK):
            acc += tl.load(src + base + off + tl.arange(0, BLOCK)).to(tl.float32)
        tl.store(dst + pid * BLOCK + tl.arange(0, BLOCK), acc)

    block = 1024
    n = megabytes * 1024 * 1024 // 2
    per = (n // blocks) // block * block
    src = torch.randn(per * blocks, device=device, dtype=torch.bfloat16)
    dst = torch.empty(blocks * block, device=device, dtype=torch.float32)

    def op():
        _stream[(blocks,)](src, dst, per, BLOCK=block)
        return dst

    return op
