"""The step count of an eager PyTorch loop that marks no token: its embedding lookups, counted on the host.

A decode step starts by looking its token up in the embedding table, once, and that lookup is the step's first
kernel. At attach the adapter wraps `torch.nn.functional.embedding`, which `nn.Embedding` (transformers, gpt-fast,
the demo engine) looks up at call time, and notes each call's time (one global read, a clock read and a list append
on the decode thread). The agent ships those times as the step count (probes/attach_loop.py); the monitor holds
their rate against the GPU's own steps in the traced windows, and times the loop by them when they agree: one
lookup a step, over every second of the attach, where a window sees a few dozen steps.

Not for a loop torch.compile has compiled: its compiled code calls no Python function per step, and a function
its guards may hold is left as it is (replacing it after a compile recompiles the model). At detach the original
is put back.
"""

from __future__ import annotations

import sys
import time

from decodemon.probes import agent

_state: dict = {}
COST_CALLS = 2000  # calls timed at install: the wrapper's own cost a step, billed to the observer


def _never() -> bool:
    return False


def _wrap(original, compiling=_never):
    table: list = []  # the first table looked up while wrapped: a model with two (GPT-2's tokens and positions)
    #                   looks each up once a step, and only one of them is counted

    def embedding(*args, **kwargs):
        if compiling():  # traced by torch.compile: the original alone, nothing of ours for its guards to hold
            return original(*args, **kwargs)
        try:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            if not table:
                table.append(id(weight))
            if id(weight) == table[0]:
                agent.note_step_start()
        except Exception:  # never into the engine's forward (an interpreter shutting down, say)
            pass
        return original(*args, **kwargs)

    embedding.__wrapped__ = original
    embedding.decodemon_step_starts = True
    return embedding


def compiled_graphs() -> int:
    """The graphs torch.compile has compiled in this process (its guards may hold the functions it traced); -1
    where that cannot be told."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return 0
    try:
        return int(dynamo.counters["stats"].get("unique_graphs", 0))
    except Exception:
        return -1


def wrapper_cost_ns() -> float:
    """The wrapper's own cost a call (ns): COST_CALLS calls of it around a no-op, less as many of the no-op, plus
    as many of the clock read and append it makes while attached."""
    def noop(*_a, **_k):
        return None

    wrapped, log, clock = _wrap(noop), [], time.perf_counter_ns
    t0 = time.perf_counter_ns()
    for _ in range(COST_CALLS):
        noop(0)
    t1 = time.perf_counter_ns()
    for _ in range(COST_CALLS):
        wrapped(0)
    t2 = time.perf_counter_ns()
    for _ in range(COST_CALLS):
        log.append(clock())
    t3 = time.perf_counter_ns()
    return max(0.0, ((t2 - t1) - (t1 - t0)) / COST_CALLS) + (t3 - t2) / COST_CALLS


def install(functional=None) -> str | None:
    """Count the embedding lookups of this process if torch is loaded and nothing is compiled; what was hooked,
    or None. `functional`: the module whose `embedding` is wrapped (default torch.nn.functional)."""
    if "module" in _state:
        return None
    own = functional is None
    if own:
        functional = sys.modules.get("torch.nn.functional")
        if functional is None:
            return None
    current = getattr(functional, "embedding", None)
    if getattr(current, "decodemon_step_starts", False):  # ours, left in by a detach (see uninstall): counts again
        _state.update(module=functional, original=current.__wrapped__, graphs=compiled_graphs())
    elif current is None or getattr(current, "__wrapped__", None) is not None or (own and compiled_graphs()):
        return None  # someone else's wrapper, or a compiled model's guards may hold the function
    else:
        compiler = sys.modules.get("torch.compiler")
        functional.embedding = _wrap(current, getattr(compiler, "is_compiling", _never))
        _state.update(module=functional, original=current, graphs=compiled_graphs())
    agent.note_step_count_cost(wrapper_cost_ns())
    return "embedding lookups"


def uninstall() -> None:
    """Put the original back, unless torch.compile compiled something while the wrapper was in: its guards hold
    the wrapper, and taking it out would recompile the engine's model. The wrapper left in does nothing but
    one global read a call until the next attach counts with it again."""
    module = _state.pop("module", None)
    original = _state.pop("original", None)
    graphs = _state.pop("graphs", 0)
    if module is None or compiled_graphs() != graphs:
        return
    if getattr(getattr(module, "embedding", None), "__wrapped__", None) is original:
        module.embedding = original  # ours is still the one in place: put the original back (else leave theirs be)


def installed() -> bool:
    """Whether the hook is in."""
    return "module" in _state
