"""Run a step on the thread that launches GPU work, at the exit of one of its launch calls (CUPTI's callback API).

A window by time is opened, closed and finalized by the agent thread's clock, but CUPTI's state must not change
under a launch in flight on another thread: in a process that replays CUDA graphs, enabling, flushing and
finalizing from the agent thread ended the loop on an H200 (`unspecified launch failure`), even with the GPU
drained first. CUPTI's own advice is to finalize at the exit site of a driver or runtime API call; the gate does
every change there, on the launching thread, between two of its launches:

    agent:   arm(step) ............................ wait(event) ...
    loop:    launch | launch exit -> step() -> event.set() | launch | ...

Callbacks are enabled only while a step is armed, and only for launch calls (graph launches alone while a window
counts them), so a loop pays for them a few times a window, not at every launch.
"""

from __future__ import annotations

import threading

_LAUNCH_PREFIXES = ("cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cudaGraphLaunch", "cuLaunchKernel",
                    "cuLaunchCooperativeKernel", "cuGraphLaunch")
_GRAPH_PREFIXES = ("cudaGraphLaunch", "cuGraphLaunch")


class GateUnavailable(RuntimeError):
    """CUPTI refused the subscription (another tool holds CUPTI's one subscriber); str() says so."""


class LaunchGate:
    """One CUPTI subscriber; `arm(step, graphs_only)` runs `step(is_graph_launch)` at launch exits until it
    returns True, then sets the returned event."""

    def __init__(self, cupti) -> None:
        self._c = cupti
        dom = cupti.CallbackDomain
        self._rt, self._drv = int(dom.RUNTIME_API), int(dom.DRIVER_API)
        self._exit = int(cupti.ApiCallbackSite.API_EXIT)

        def ids(enum, prefixes):
            return {int(v) for n, v in enum.__members__.items() if n.startswith(prefixes)}

        rt, drv = cupti.runtime_api_trace_cbid, cupti.driver_api_trace_cbid
        self._launch = [(self._rt, i) for i in ids(rt, _LAUNCH_PREFIXES)] + \
                       [(self._drv, i) for i in ids(drv, _LAUNCH_PREFIXES)]
        self._graph = {(self._rt, i) for i in ids(rt, _GRAPH_PREFIXES)} | \
                      {(self._drv, i) for i in ids(drv, _GRAPH_PREFIXES)}
        self._lock = threading.Lock()
        self._step = None
        self._event: threading.Event | None = None
        self._enabled: set = set()
        self.error: BaseException | None = None
        try:
            self._sub = cupti.subscribe(self._callback, None)
        except Exception as exc:
            raise GateUnavailable(f"CUPTI subscription refused ({type(exc).__name__}: {exc})") from None

    def _enable(self, which: set) -> None:
        for dom, cbid in self._enabled - which:
            self._c.enable_callback(0, self._sub, dom, cbid)
        for dom, cbid in which - self._enabled:
            self._c.enable_callback(1, self._sub, dom, cbid)
        self._enabled = set(which)

    def arm(self, step, graphs_only: bool = False) -> threading.Event:
        """Run `step` at the next launch exits (graph launches only, if asked) until it returns True."""
        ev = threading.Event()
        with self._lock:
            self._step, self._event = step, ev
            self._enable(set(self._graph) if graphs_only else set(self._launch))
        return ev

    def widen(self) -> None:
        """The armed step sees every launch from now on, not graph launches only."""
        with self._lock:
            if self._step is not None:
                self._enable(set(self._launch))

    def disarm(self) -> None:
        """No step any more (a loop that stopped launching); callbacks off."""
        with self._lock:
            self._step, self._event = None, None
            try:
                self._enable(set())
            except Exception:
                pass

    def _callback(self, userdata, domain, cbid, data) -> None:
        if int(data.callback_site) != self._exit:
            return
        with self._lock:
            step, ev = self._step, self._event
            if step is None:
                return
            try:
                done = bool(step((int(domain), int(cbid)) in self._graph))
            except BaseException as exc:  # never into the loop's launch call
                self.error, done = exc, True
            if done:
                self._step, self._event = None, None
                try:
                    self._enable(set())
                except Exception:
                    pass  # a step that finalized CUPTI took the subscription with it
                ev.set()
