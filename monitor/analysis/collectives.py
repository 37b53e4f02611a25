"""The collectives of a tensor-parallel step: calls per token, each call's own latency, and the idle it adds.

An NCCL kernel starts when its rank arrives and ends once the last rank has:

    rank 0   [gemv]--[nccl ..................]--[gemv]    arrived first: its kernel includes the wait
    rank 1   [gemv.........]--[nccl ..]--[gemv]           arrived last: its kernel is the link's latency
                              ^^ collective_gap_us: idle beyond the step's usual kernel-to-kernel gap

The mean call adds waiting for a late peer, so a call's own latency is the median of the calls that did not
wait (no longer than twice the window's fastest). On two H200s, eager TP=2 with a window opened while the other
rank was traced: mean 229 µs, median 112 µs, calls that did not wait 4.9 µs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.monitor.analysis.gaps import IdleGaps
from decodemon.monitor.analysis.kernels import KernelRow
from decodemon.monitor.analysis.names import is_collective_kernel
from decodemon.monitor.analysis.records import TracedRecords


@dataclass(frozen=True)
class Collectives:
    """The window's collective kernels per token (zeros where it ran none)."""

    calls_per_token: float
    us_per_call: float  # mean kernel time per call, waiting for peers included
    ms_per_token: float
    us_unwaited: float  # a call's own latency: the calls that did not wait for a peer
    gap_us: float  # device idle a call adds around its kernel, median per call


def collective_gap_ns(gap: np.ndarray, coll: np.ndarray, device_side: np.ndarray) -> float:
    """Median device idle a collective kernel adds before and after itself, beyond the usual gap (ns).

    `gap[i]` is the idle before sorted kernel i+1; `coll` marks collective kernels in the same order. A gap counts
    only where `device_side[i]`: the kernel's launch call was traced and began before the GPU went idle (a
    graph's, or a queue's); an untraced launch is not counted, and gaps the host caused are LAUNCH's. Graphed on
    two H200s an NCCL kernel waited 1.4-2.2 µs to start where other kernels waited 0.1: a CUDA-event
    microbenchmark pays it too.
    """
    n = len(coll)
    if n < 3 or not coll.any():
        return 0.0
    g = np.maximum(gap, 0)
    plain = device_side & ~coll[1:] & ~coll[:-1]
    base = float(np.median(g[plain])) if plain.any() else 0.0
    added = []
    for k in np.flatnonzero(coll).tolist():
        a = 0.0
        if k >= 1 and device_side[k - 1]:
            a += max(0.0, g[k - 1] - base)
        if k < n - 1 and device_side[k]:
            a += max(0.0, g[k] - base)
        added.append(a)
    return float(np.median(added))


def _unwaited_ns(rec: TracedRecords, is_coll: np.ndarray) -> float:
    """Over every collective kernel name: its calls times the median of those that did not wait for a peer."""
    out = 0.0
    if not len(rec.start_ns):
        return out
    dur, idx = rec.duration_ns, rec.name_idx
    for k in np.flatnonzero(is_coll).tolist():
        d = dur[idx == k]
        if len(d):
            out += len(d) * float(np.median(d[d <= 2 * d.min()]))
    return out


def collectives(rec: TracedRecords, rows: tuple[KernelRow, ...], idle: IdleGaps | None) -> Collectives:
    """Collective calls, time and added idle per token from the kernel table and the idle gaps."""
    is_coll = np.array([is_collective_kernel(nm) for nm in rec.names], dtype=bool)
    coll = [r for r in rows if r.is_collective]
    calls = sum(r.calls_per_token for r in coll)
    ms = sum(r.us_per_token for r in coll) / 1e3
    gap_ns = 0.0
    if idle is not None:
        gap_ns = collective_gap_ns(idle.gap_ns, is_coll[rec.name_idx[idle.order]],
                                   idle.launch_known & ~idle.host_late)
    return Collectives(
        calls_per_token=calls, us_per_call=(ms * 1e3 / calls) if calls else 0.0, ms_per_token=ms,
        us_unwaited=_unwaited_ns(rec, is_coll) / 1e3 / rec.tokens / calls if calls else 0.0,
        gap_us=gap_ns / 1e3,
    )


def host_clock_times_collectives(model: object, gpu) -> bool:
    """Whether the engine's clock around a collective call is the collective's time.

    True for a synchronous backend (gloo). NCCL returns once the kernel is enqueued: on two H200s the eager demo's
    host spent 122-139 µs per call enqueuing a 5 µs kernel, and counting that as COMM gave a COMM
    verdict at 0.5% of the step. Engines that do not say their backend: synchronous only without a GPU.
    """
    backend = model.collective_backend if model is not None else ""
    return backend == "gloo" if backend else gpu is None


def comm_words(windows: int, with_calls: int, priced: int) -> str:
    """Where COMM's calls a token (over the span's `windows` traced windows), late peer's wait (over the
    `with_calls` that ran collectives) and µs a call (the lowest of `priced`) come from."""
    if windows <= 1:
        return "calls from the traced window; µs a call: its kernel + launch gap"
    def of(n):
        return "the window" if n == 1 else f"{n} windows"
    wait = ("a late peer's wait: the same windows' median" if with_calls == windows else
            f"a late peer's wait: the median of the {with_calls} with collectives" if with_calls > 1 else
            "a late peer's wait: the one window with collectives")
    return (f"calls: the median of {windows} traced windows; {wait}; µs a call: the lowest of {of(priced)}' kernel "
            "+ launch gap" if priced > 1 else
            f"calls: the median of {windows} traced windows; {wait}; µs a call: {of(priced)}'s kernel + launch gap")
