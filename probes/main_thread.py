"""Run a step on the interpreter's main thread between two of its bytecodes (`Py_AddPendingCall`).

A window by time is timed by the agent thread's clock, but in a process that replays CUDA graphs CUPTI's state
must not change under the loop's feet: on an H200 a finalize from any thread but the one replaying the graphs
ended the loop (`unspecified launch failure`) in 6 of 7 runs of a bare CUDA-graph loop (the seventh, a compiled
loop whose host spends most of its time in Python, lived), while the same sequence made on the replaying thread
between two replays, with the GPU idle, never did. A loop that marks tokens has its windows
finalized on its own thread at a token boundary. A pending call gives a loop that marks nothing the same place:
the main thread (where decode loops run) runs it at its next bytecode, so never inside a CUDA call, and a host
that waits for the GPU in a sync runs it when the sync returns.

    agent:   run(step) ........................ wait(event) ...
    main:    ... bytecode | step() -> event.set() | bytecode ...
"""

from __future__ import annotations

import ctypes
import threading

_PENDING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class MainThreadGate:
    """`arm(step)` runs `step()` once on the main thread, at its next bytecode; the returned event is set after.
    A step that raises is kept in `error` (never raised into the loop)."""

    def __init__(self, add_pending=None) -> None:
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._armed: tuple | None = None
        self._cfunc = _PENDING(self._run)  # kept alive as long as the gate: the interpreter holds its address
        if add_pending is None:
            api = ctypes.pythonapi.Py_AddPendingCall
            api.argtypes, api.restype = [_PENDING, ctypes.c_void_p], ctypes.c_int
            add_pending = api
        self._add = add_pending

    def arm(self, step) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            self._armed = (step, ev)
        if self._add(self._cfunc, None) != 0:  # the interpreter's queue of pending calls is full
            with self._lock:
                self._armed = None
            self.error = RuntimeError("Py_AddPendingCall refused the step")
        return ev

    def disarm(self) -> bool:
        """The armed step will not run (the main thread never came back to Python). False: too late, it has
        started (its event is set once it ends)."""
        with self._lock:
            removed, self._armed = self._armed is not None, None
        return removed

    def _run(self, _arg) -> int:
        with self._lock:
            armed, self._armed = self._armed, None
        if armed is None:
            return 0
        step, ev = armed
        try:
            step()
        except BaseException as exc:  # never into the loop
            self.error = exc
        ev.set()
        return 0
