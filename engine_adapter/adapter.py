"""Model facts and a context-manager form of the token clock."""

from __future__ import annotations

from decodemon.probes import agent
from decodemon.probes.frames import ModelFacts


def report_model(name: str, weight_bytes: int, kv_bytes_per_position: int = 0, layers: int = 0,
                 dtype: str = "", tp_degree: int = 1, hidden: int = 0,
                 measured_bandwidth_gbs: float = 0.0, tp_rank: int = 0, collectives_per_token: int = 0,
                 collective_bytes: int = 0, collective_backend: str = "") -> ModelFacts:
    """Tell an attached (or later) monitor what is being decoded; returns the facts sent."""
    facts = ModelFacts(name=name, weight_bytes=int(weight_bytes), kv_bytes_per_position=int(kv_bytes_per_position),
                       layers=int(layers), dtype=dtype, tp_degree=int(tp_degree), hidden=int(hidden),
                       measured_bandwidth_gbs=float(measured_bandwidth_gbs), tp_rank=int(tp_rank),
                       collectives_per_token=int(collectives_per_token), collective_bytes=int(collective_bytes),
                       collective_backend=collective_backend)
    agent.set_model_facts(facts)
    return facts


def report_cuda_graphs(replays: bool) -> None:
    """Say whether this engine replays CUDA graphs. An engine that says it never does (an eager loop) saves one
    slow token per attach: the first traced window needs no guard token, which graph replays do. Say it again
    if that changes (a loop that starts capturing graphs must call this with True first)."""
    agent.set_cuda_graphs(replays)


class TokenClock:
    """`with clock.token(depth): ...` marks the boundary when the block ends."""

    def __init__(self) -> None:
        self._depth = 0

    def token(self, depth: int = 0) -> "TokenClock":
        self._depth = depth
        return self

    def __enter__(self) -> "TokenClock":
        return self

    def __exit__(self, *exc) -> None:
        agent.mark_token(self._depth)


def timed_all_reduce(dist, group=None):
    """An all-reduce that tells the token clock about itself while a monitor is attached.

    The host-side duration is what a synchronous backend (gloo) spends in the call; with NCCL the call only
    enqueues, and the monitor takes µs per call from the NCCL kernels of a traced window instead.
    """
    import time

    def all_reduce(t):
        if agent._session is None:
            dist.all_reduce(t, group=group)
            return t
        t0 = time.perf_counter_ns()
        dist.all_reduce(t, group=group)
        agent.note_collective(time.perf_counter_ns() - t0, t.numel() * t.element_size())
        return t

    return all_reduce
