"""NVTX ranges pushed from Python, seen by the agent: on the timeline of traced windows, and as a token clock.

While a monitor is attached, the range calls an engine makes from Python are wrapped: `torch.cuda.nvtx.range_push`
/ `range_pop` (and `torch.cuda.nvtx.range`, which calls them), and the `nvtx` package's `push_range` / `pop_range`
and `annotate` used as a context manager. Each thread keeps its stack of open ranges. A range that closes inside a
traced window is kept with its start and end in CUPTI's clock (`Session.note_range`); a range whose name is the
attach's `token_range` marks a token when it closes (`decodemon attach PID --token-range NAME`), and the engine's
other marks are then ignored. The originals go back when the monitor leaves.

Ranges pushed from C or C++ (NCCL's, a C++ engine's) do not pass through here; CUPTI sees those only with NVTX
injection set up before the process starts, which an attach to a running process cannot do.
"""

from __future__ import annotations

import sys
import threading

from decodemon.probes import agent

_state: dict = {}
_local = threading.local()


MAX_DEPTH = 256  # open ranges kept per thread; a stack deeper than this (pops made where we cannot see them) restarts


def _stack() -> list:
    """This thread's open ranges, as of the current install: one left by an earlier attach starts empty (its
    ranges' pops went by unwrapped, and would pair with the wrong pushes)."""
    gen = _state.get("gen", 0)
    if getattr(_local, "gen", None) != gen:
        _local.gen, _local.stack = gen, []
    return _local.stack


def _opened(name) -> None:
    """Before the engine's push: never raises into it."""
    try:
        s = agent.ACTIVE.session
        st = _stack()
        if len(st) >= MAX_DEPTH:
            st.clear()
        st.append((str(name) if name is not None else "", s.range_clock_ns() if s is not None else None))
    except Exception:
        pass


def _closed() -> None:
    """After the engine's pop: never raises into it."""
    try:
        st = _stack()
        if not st:
            return
        name, t0 = st.pop()
        s = agent.ACTIVE.session
        if s is not None:
            s.on_range(name, t0, len(st))
    except Exception:
        pass


def _wrap_push(original):
    def range_push(*args, **kwargs):  # torch: range_push(msg); nvtx: push_range(message=None, color=..., ...)
        out = original(*args, **kwargs)  # a push that fails (torch without CUDA) opens nothing
        _opened(args[0] if args else kwargs.get("message", kwargs.get("msg")))
        return out

    range_push.__wrapped__ = original
    return range_push


def _wrap_pop(original):
    def range_pop(*args, **kwargs):
        out = original(*args, **kwargs)
        _closed()
        return out

    range_pop.__wrapped__ = original
    return range_pop


def _wrap_enter(original):
    def __enter__(self):
        out = original(self)
        args = getattr(self, "init_args", None) or (None,)
        _opened(args[0])
        return out

    __enter__.__wrapped__ = original
    return __enter__


def _wrap_exit(original):
    def __exit__(self, *exc):
        out = original(self, *exc)
        _closed()
        return out

    __exit__.__wrapped__ = original
    return __exit__


def _patch(owner, name: str, wrapper) -> None:
    original = getattr(owner, name)
    setattr(owner, name, wrapper(original))
    _state.setdefault("patched", []).append((owner, name, original))


def install() -> str | None:
    """Wrap the NVTX range calls of the packages this process has loaded; what was wrapped, or None."""
    if _state.get("patched"):
        return None
    _state["gen"] = _state.get("gen", 0) + 1
    what = []
    tn = sys.modules.get("torch.cuda.nvtx")
    if tn is not None and hasattr(tn, "range_push") and hasattr(tn, "range_pop"):
        _patch(tn, "range_push", _wrap_push)
        _patch(tn, "range_pop", _wrap_pop)
        what.append("torch.cuda.nvtx")
    nv = sys.modules.get("nvtx")
    if nv is not None and hasattr(nv, "push_range") and hasattr(nv, "pop_range"):
        _patch(nv, "push_range", _wrap_push)
        _patch(nv, "pop_range", _wrap_pop)
        ann = getattr(nv, "annotate", None)
        if isinstance(ann, type):
            _patch(ann, "__enter__", _wrap_enter)
            _patch(ann, "__exit__", _wrap_exit)
        what.append("nvtx")
    return f"NVTX ranges ({', '.join(what)})" if what else None


def uninstall() -> None:
    """Put the originals back (ranges still open keep their place on each thread's stack)."""
    for owner, name, original in reversed(_state.pop("patched", [])):
        setattr(owner, name, original)


def installed() -> bool:
    """Whether the range calls are wrapped."""
    return bool(_state.get("patched"))
