"""CUDA graph replays as the step clock of a loop that marks no token (torch.compile's "reduce-overhead",
hand-captured graphs), watched with no line of decodemon in the engine.

At attach the adapter wraps `torch.cuda.CUDAGraph.replay`, which torch.compile's CUDA-graph trees and
`torch.cuda.graph` users call once per replay from Python, and notes each replay's graph (one attribute read
and a list append on the decode thread). The agent ships the replays over the replays one step makes (read off
their order) as the step count (probes/attach_loop.py), four times a second; the monitor reads ms a step as a
rate over those counts. The count is the host's: a loop that enqueues replays ahead of the GPU is still held to
the GPU's pace over whole bursts, since its queue is bounded. At detach the original is put back.
"""

from __future__ import annotations

import sys

from decodemon.probes import agent

_state: dict = {}


def _wrap(original):
    def replay(self, *args, **kwargs):
        try:
            agent.note_graph_replay(id(self))
        except Exception:  # never into the engine's replay (an interpreter shutting down, say)
            pass
        return original(self, *args, **kwargs)

    replay.__wrapped__ = original
    return replay


def install(graph_class=None) -> str | None:
    """Count every CUDA graph replay in this process if torch's CUDA graphs are loaded; what was hooked, or None.
    `graph_class`: the class whose `replay` is wrapped (default torch.cuda.CUDAGraph)."""
    if "cls" in _state:
        return None
    if graph_class is None:
        mod = sys.modules.get("torch.cuda.graphs")
        graph_class = getattr(mod, "CUDAGraph", None) if mod is not None else None
        if graph_class is None or "replay" not in graph_class.__dict__:
            return None
    original = graph_class.__dict__["replay"]
    graph_class.replay = _wrap(original)
    _state.update(cls=graph_class, original=original)
    return "CUDA graph replays"


def uninstall() -> None:
    """Put the original back."""
    cls = _state.pop("cls", None)
    original = _state.pop("original", None)
    if cls is not None and getattr(cls.__dict__.get("replay"), "__wrapped__", None) is original:
        cls.replay = original  # ours is still the one in place: put the original back (else leave theirs be)


def installed() -> bool:
    """Whether the hook is in."""
    return "cls" in _state
