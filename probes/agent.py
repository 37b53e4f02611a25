"""The probe agent's entry points: what an engine (or `decodemon run`) calls inside the decode process.

The agent lives in the decode process, dormant until a monitor attaches. Dormant means: one daemon thread blocked
in `accept()` on a Unix socket in a per-user 0700 directory (server.py), CUPTI not loaded, and `mark_token()`
returning after one global read. On attach the agent ships token marks four times a second and, every
`window_period_s`, traces a window (attach_loop.py; when, policy.py): whole
tokens opened and closed at the decode thread's boundaries (session.py), or, for a loop that marks no tokens or
whose host runs ahead of the GPU, a stretch of time traced by the agent thread. PM and NVML are read by the
monitor's sidecar, in decodemon's own process, never here. On detach, or when the monitor vanishes, it disarms; the next token boundary
finalizes CUPTI if a window was open.

The decode thread only ever runs `mark_token()`. Everything else happens in the agent thread, the sidecar
process, or the monitor.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from pathlib import Path

from decodemon.probes import frames
from decodemon.probes.facts import PROCESS
from decodemon.probes.server import Agent, clean_stale_sockets  # noqa: F401 - part of the agent's API
from decodemon.probes.session import ACTIVE

_agent: Agent | None = None
_start_lock = threading.Lock()


def set_model_facts(facts: "frames.ModelFacts") -> None:
    """Tell the agent what the engine is decoding (sent in every hello)."""
    PROCESS.model = facts


def set_cuda_graphs(replays: bool | None) -> None:
    """The engine says whether it replays CUDA graphs (None: not said). Read when a window opens."""
    PROCESS.engine_cuda_graphs = None if replays is None else bool(replays)


def note_collective(ns: int, nbytes: int) -> None:
    """Count one collective of the current token (host-side duration, payload). One global read when dormant."""
    s = ACTIVE.session
    if s is None or not hasattr(s, "coll"):
        return
    s.coll[0] += 1
    s.coll[1] += ns
    s.coll[2] += nbytes


def note_graph_replay(graph: int) -> None:
    """One CUDA graph replay (engine_adapter/cuda_graphs.py), by the graph's id: the step clock of a loop that
    marks no token. One global read when dormant."""
    s = ACTIVE.session
    log = getattr(s, "replay_log", None)
    if log is None:
        return
    if not log:
        s.replay_t0 = time.perf_counter_ns()  # the first replay since the last ship: a point on the count's curve
    log.append(graph)


def note_step_start() -> None:
    """One step began (engine_adapter/step_starts.py: its embedding lookup): the step count of a loop that marks
    no token, with each step's time. One global read when dormant, or once the loop has marked a token."""
    log = getattr(ACTIVE.session, "start_log", None)
    if log is not None:
        log.append(time.perf_counter_ns())


def note_step_count_cost(ns: float) -> None:
    """The step-start hook's own cost a call (ns), measured where it was installed: billed to the observer."""
    PROCESS.step_count_ns = float(ns)


def mark_token(depth: int = 0) -> None:
    """The token clock: call once per decoded token, at the boundary. Costs one global read when dormant."""
    s = ACTIVE.session
    if s is None or s.token_range:  # attached with --token-range: that range's closes are the clock
        return
    s.on_token(depth)


def mark_step(tokens: int, depth: int = 0) -> None:
    """A batched engine's clock: call once per decode step, with the tokens it made (one per sequence in the
    batch). Costs one global read when dormant."""
    s = ACTIVE.session
    if s is None or s.token_range:
        return
    s.on_token(depth, tokens)


def note_first_tokens(waits_s: list[float]) -> None:
    """A batched engine's requests that got their first token in the step just marked: each one's seconds from its
    arrival to that token (time to first token). Costs one global read when dormant."""
    s = ACTIVE.session
    first = getattr(s, "first_tokens", None)
    if first is not None:
        first.extend(int(w * 1e9) for w in waits_s)


def start() -> Path | None:
    """Start the agent (idempotent); return its socket path, or None if it could not start."""
    global _agent
    with _start_lock:
        if _agent is None:
            try:
                _agent = Agent()
            except OSError as exc:
                print(f"decodemon: agent not started: {exc}", file=sys.stderr)
                return None
            atexit.register(_agent.shutdown)
        return _agent.path


# processes an engine starts that inherit `decodemon run`'s environment but decode nothing: no agent in them (an
# attach or the exporter would arm PM in them against the engine)
HELPERS = ("_inductor/compile_worker/", "torch._inductor.compile_worker",  # torch.compile's compile workers
           "/torchrun", "torch.distributed.run", "torch.distributed.launch")  # torchrun: it starts the ranks


def is_helper(argv: list[str]) -> bool:
    """Is this command line one of the HELPERS?"""
    return any(h in a.replace(os.sep, "/") or a == h.strip("/") for a in argv[:3] for h in HELPERS)


def start_from_env() -> None:
    """Start the agent if DECODEMON_AGENT=1 (set by `decodemon run`), unless this process is a helper. Nothing is
    loaded ahead: an attach brings decodemon's CUPTI library itself, loaded with the GIL given up."""
    if os.environ.get("DECODEMON_AGENT") == "1" and not is_helper(list(getattr(sys, "orig_argv", sys.argv))):
        start()


def __getattr__(name: str):
    """`_session`: the attached session (None while dormant), for callers that only ask whether one is."""
    if name == "_session":
        return ACTIVE.session
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
