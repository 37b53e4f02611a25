"""Model facts and a context-manager form of the token clock."""

from __future__ import annotations

from decodemon.probes import agent
from decodemon.probes.wire import ModelFacts


def report_model(name: str, weight_bytes: int, kv_bytes_per_position: int = 0, layers: int = 0,
                 dtype: str = "", tp_degree: int = 1, hidden: int = 0,
                 measured_bandwidth_gbs: float = 0.0) -> ModelFacts:
    """Tell an attached (or later) monitor what is being decoded; returns the facts sent."""
    facts = ModelFacts(name=name, weight_bytes=int(weight_bytes), kv_bytes_per_position=int(kv_bytes_per_position),
                       layers=int(layers), dtype=dtype, tp_degree=int(tp_degree), hidden=int(hidden),
                       measured_bandwidth_gbs=float(measured_bandwidth_gbs))
    agent.set_model_facts(facts)
    return facts


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
