"""What the agent knows about its process across attaches: one object, read and written by the agent's threads.

An attach is short; the process is long. CUPTI's memory per window, whether the engine replays CUDA graphs, the
device's facts and the first PM session's lasting effect belong to the process, not to one attach.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ProcessFacts:
    """Facts of this process that outlive an attach."""

    # Has a traced window of this process seen CUDA-graph kernels? Sticky: from then on every window keeps its
    # guard token, even one whose previous window happened to see none (policy.guard_for_window).
    graph_kernels_seen: bool = False
    # Has the cuda_graphs adapter seen this process replay a CUDA graph (session.replay_log)? Sticky too: from then on
    # a token window's CUPTI is finalized on the decode thread (policy.finalize_off_loop)
    graph_replays_seen: bool = False
    # What the engine says (engine_adapter.report_cuda_graphs): False = it never replays CUDA graphs, so an
    # attach's first window can trace one token without a guard; None = not said, and the first window guards.
    engine_cuda_graphs: bool | None = None
    windows_in_process: int = 0  # traced windows closed (CUPTI finalized) in this process, over every attach
    cupti_start_ns: int = 0  # how long the last CUPTI start-up took, on whichever thread made it (policy.start_off_loop)
    pm_armed_before: bool = False  # a PM session was armed in this process already
    pm_last_release: list = field(default_factory=list)  # the steps that failed releasing the last PM session
    gpu: dict = field(default_factory=dict)  # wire.GpuInfo by CUDA index, read at the first attach that found it
    model: object = None  # wire.ModelFacts from the engine (sent in every hello)
    # the step-start hook's own cost a call on the decode thread (engine_adapter/step_starts.py), ns; 0: not hooked
    step_count_ns: float = 0.0
    # the token marks this process sent to monitors, over every attach: the tokens they stand for, and the engine's
    # seconds they span (each attach's from its first mark to its last one sent); a monitor that had the agent
    # before counts from them the tokens another monitor got meanwhile (Hello.tokens_shipped, Hello.marked_s)
    tokens_shipped: int = 0
    marked_ns: int = 0
    attaches_marked: int = 0  # the attaches that sent marks: each one's first mark ends a token begun unwatched

    def note_window_kernels(self, saw_graph_kernels: bool) -> bool:
        """A window did or did not see graph kernels: whether the next one keeps its guard (sticky once seen)."""
        self.graph_kernels_seen = self.graph_kernels_seen or bool(saw_graph_kernels)
        return self.graph_kernels_seen


PROCESS = ProcessFacts()
