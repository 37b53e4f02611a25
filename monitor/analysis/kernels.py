"""The kernel table: per kernel name, its time per token, its grid against the SMs and its occupancy.

    SMs   |0|1|2|3|4|5|6|7|8|9|...|131|
    grid   ############                     12 blocks on 132 SMs: coverage 9.1%,
           ^ busy       ^ idle for the whole kernel   idle SM time = time x 120/132

A hot kernel whose grid covers under a quarter of the SMs leaves most of the GPU idle however fast its blocks
run: the table sorts by time, and `idle_sm_us_per_token` ranks what widening the grid would win.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from decodemon.monitor.analysis.names import NAME_WHOLE, is_collective_kernel, kernel_tags, short_kernel_name, tagged
from decodemon.monitor.analysis.records import TracedRecords

SMALL_GRID_FRACTION = 0.25  # a hot kernel whose grid covers under 25% of the SMs
# what a kernel row's occupancy_pct is, said beside the rows in --json
KERNELS_NOTE = ("occupancy_pct is the warp occupancy a kernel's block size, registers and shared memory allow an SM: a "
                "limit, with blocks enough to fill it; a grid with fewer blocks than SMs keeps one block on each SM "
                "it reaches, fewer warps than that (grid_coverage_pct: the share of SMs it reaches)")


@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits that bound how many blocks can be resident."""

    max_warps: int = 64
    max_blocks: int = 32
    regs: int = 65536
    smem_bytes: int = 233472


def sm_limits(cc: str) -> SmLimits:
    """Limits for a compute capability ('9.0', '8.0', ...); Hopper's when unknown."""
    if cc.startswith("8.") and cc != "8.0":
        return SmLimits(48, 16 if cc == "8.6" else 24, 65536, 102400)
    if cc == "8.0":
        return SmLimits(64, 32, 65536, 167936)
    return SmLimits()


def blocks_per_sm(block_threads: int, regs: int, smem: int, lim: SmLimits) -> int:
    """How many blocks of this shape fit on one SM at once (the occupancy calculator's arithmetic)."""
    warps = max(1, -(-block_threads // 32))
    by_warps = lim.max_warps // warps
    by_regs = lim.max_blocks
    if regs > 0:
        regs_per_warp = -(-regs * 32 // 256) * 256
        by_regs = lim.regs // (regs_per_warp * warps)
    by_smem = lim.smem_bytes // (smem + 1024)
    return max(0, min(lim.max_blocks, by_warps, by_regs, by_smem))


@dataclass(frozen=True)
class KernelRow:
    """One kernel name's figures within a window."""

    name: str
    short_name: str
    calls_per_token: float
    us_mean: float
    us_per_token: float
    share_pct: float  # of the kernel time
    grid_blocks: int
    block_threads: int
    regs: int
    smem_bytes: int
    grid_coverage_pct: float  # min(blocks, SMs) / SMs
    waves: float
    occupancy_pct: float  # theoretical, from block size, registers and shared memory
    idle_sm_us_per_token: float  # time x idle SMs: what a wider grid could win
    is_collective: bool
    # the short name with what tells it from another row of that name (`native::elementwise_kernel<direct_copy,
    # BFloat16>`): the name the screen, --json and DIAGNOSIS give the row
    label: str = ""


def _group_medians(v: np.ndarray, idx: np.ndarray, firsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """np.median of `v` over each value of `idx` (sorted; `firsts` and `counts` of np.unique over it), at once."""
    s = v[np.lexsort((v, idx))].astype(np.float64)
    return (s[firsts + (counts - 1) // 2] + s[firsts + counts // 2]) / 2


def _group_modes(v: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The most frequent value of `v` (the smallest of a tie, as np.bincount(...).argmax()) over each value of `idx`,
    in the order of the sorted values of `idx`."""
    o = np.lexsort((v, idx))
    iv, vv = idx[o], v[o]
    starts = np.flatnonzero(np.r_[True, (iv[1:] != iv[:-1]) | (vv[1:] != vv[:-1])])
    runs = np.diff(np.r_[starts, len(o)])
    ri, rv = iv[starts], vv[starts]
    best = np.lexsort((rv, -runs, ri))  # per name: the longest run first, the smallest value on a tie
    first = np.r_[True, ri[best][1:] != ri[best][:-1]]
    return rv[best][first]


def kernel_table(rec: TracedRecords, sm_count: int, cc: str = "9.0") -> tuple[KernelRow, ...]:
    """One row per kernel name over the analysed tokens, the most time per token first."""
    idx = rec.name_idx
    if not len(rec.start_ns):
        return ()
    cols, names, tokens = rec.kernels, rec.names, rec.tokens
    dur = rec.duration_ns
    kernel_sum = int(dur.sum())
    lim, sms = sm_limits(cc), max(sm_count, 1)
    grid = cols["grid_x"] * cols["grid_y"] * cols["grid_z"]
    block = cols["block_x"] * cols["block_y"] * cols["block_z"]
    smem = cols["smem_static"] + cols["smem_dynamic"]
    rows = []
    # each name's kernels as one slice of the kernels sorted by name: one sort, not a pass over all per name; the
    # medians and the grid's mode of every name at once (a numpy call per name and figure was most of a window)
    order = np.argsort(idx, kind="stable")
    keys, firsts, counts = np.unique(idx[order], return_index=True, return_counts=True)
    wide = np.maximum.reduceat(grid[order], firsts) >= 1 << 20
    grids = np.where(wide, _group_medians(grid, idx, firsts, counts), _group_modes(grid, idx))
    blocks, regs = _group_medians(block, idx, firsts, counts), _group_medians(cols["regs"], idx, firsts, counts)
    smems = _group_medians(smem, idx, firsts, counts)
    ends = [*firsts[1:].tolist(), len(order)]
    for j, (k, lo, hi) in enumerate(zip(keys.tolist(), firsts.tolist(), ends)):
        m = order[lo:hi]
        d = dur[m]
        g, b, r, sm_b = int(grids[j]), int(blocks[j]), int(regs[j]), int(smems[j])
        bps = blocks_per_sm(b, r, sm_b, lim)
        cov = min(g, sms) / sms
        tot_us = d.sum() / 1e3
        nm = names[k] if k < len(names) else "?"
        rows.append(KernelRow(
            # whole: the report, --json and the verdict name it as it is; the screen cuts it to its column
            name=nm, short_name=short_kernel_name(nm, NAME_WHOLE), calls_per_token=len(m) / tokens,
            us_mean=float(d.mean() / 1e3), us_per_token=tot_us / tokens,
            share_pct=100.0 * d.sum() / max(kernel_sum, 1), grid_blocks=g, block_threads=b, regs=r,
            smem_bytes=sm_b, grid_coverage_pct=100.0 * cov,
            waves=g / (sms * bps) if bps else float("inf"),
            occupancy_pct=100.0 * bps * max(1, -(-b // 32)) / lim.max_warps,
            idle_sm_us_per_token=tot_us / tokens * (1 - cov),
            is_collective=is_collective_kernel(nm) if k < len(names) else False,
        ))
    rows.sort(key=lambda r: -r.us_per_token)
    tags = kernel_tags([(r.name, r.short_name, r.grid_blocks) for r in rows])
    return tuple(replace(r, label=tagged(r.short_name, t, r.name)) for r, t in zip(rows, tags))


def small_grid_share_pct(rows: tuple[KernelRow, ...]) -> float:
    """The share (%) of the kernel time spent in kernels whose grid covers under a quarter of the SMs. Collectives
    are left out: their grid is the link's (COMM prices them), and a collective waiting for a late peer would
    otherwise fill the share with its one-block spin."""
    rows = tuple(r for r in rows if not r.is_collective)
    if not rows:
        return 0.0
    small = sum(r.us_per_token for r in rows if r.grid_coverage_pct < 100 * SMALL_GRID_FRACTION)
    return 100.0 * small / max(sum(r.us_per_token for r in rows), 1e-9)
