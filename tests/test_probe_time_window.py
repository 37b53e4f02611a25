"""Windows by time: a loop that never marks a token (or whose marks come in bursts) still gets traced windows,
opened and closed by the agent thread, with CUPTI faked at the cupti-python boundary."""

from __future__ import annotations

import socket
import time

import pytest

from decodemon.probes import policy, wire
from decodemon.probes import session as sess
from decodemon.probes.facts import PROCESS
from tests.test_agent import _fake_tracer, _run_agent_loop


@pytest.fixture(autouse=True)
def _short_host_wait(monkeypatch):
    """Faked CUPTI delivers no launch record unless a test makes it: the agent's windows wait only briefly."""
    from decodemon.probes import tracer

    monkeypatch.setattr(tracer, "HOST_WAIT_S", 0.02)


class _LateRecords:
    """cupti-python's flush, for a GPU that runs behind the host: the first `late` flushes after the close each
    deliver one more kernel record, `gap_s` apart."""

    def __init__(self, tr, late: int, gap_s: float) -> None:
        self.tr, self.late, self.gap_s, self.last = tr, late, gap_s, 0.0

    def __call__(self, flag) -> None:
        now = time.monotonic()
        if self.late and now - self.last >= self.gap_s:
            self.late -= 1
            self.last = now
            self.tr._completed([object()])


def test_trace_for_opens_sleeps_closes_drains_the_late_records_then_finalizes():
    tr = _fake_tracer()
    tr._c.activity_flush_all = _LateRecords(tr, late=3, gap_s=0.02)
    slept = []
    t0 = time.monotonic()
    tr.trace_for(0.1, quiet_s=0.05, drain_max_s=1.0, sleep=lambda s: (slept.append(s), time.sleep(s)))
    took = time.monotonic() - t0
    names = [n for n, _ in tr._c.calls]
    assert names[0] == "activity_register_callbacks" and names[-1] == "finalize"
    assert len(tr._batches) == 3  # every late record came in before the finalize
    assert 0.1 in slept and 0.1 + 0.05 <= took < 0.6  # the window's own sleep, after the host's first record
    assert len(tr.bounds) == 2 and not tr.active and not tr.initialised


def test_trace_for_waits_for_the_gpu_after_the_close_and_pumps_before_the_finalize():
    tr = _fake_tracer()
    c = tr._c
    tr.trace_for(0.01, quiet_s=0.01, gpu_sync=lambda: c.calls.append(("gpu_sync", "")),
                 before_finalize=lambda: c.calls.append(("pm_pump", "")), wait_host_s=0)
    names = [n for n, _ in c.calls]
    order = [names.index(n) for n in ("activity_disable", "gpu_sync", "activity_flush_all", "pm_pump", "finalize")]
    assert order == sorted(order) and names[-1] == "finalize" and "gpu_sync" in tr.last_ns


class _LaunchingLoop:
    """launch_gate.LaunchGate's interface over a thread named "loop" that launches every millisecond once
    `idle_s` has passed (graph launches if `graphs`): armed steps run there, at its launches' exits."""

    def __init__(self, idle_s: float, graphs: bool, launches: bool = True) -> None:
        import threading

        self.graphs, self.error, self._step, self._ev = graphs, None, None, None
        self._graphs_only, self._lock, self._stop = False, threading.Lock(), threading.Event()
        self._t0, self._idle, self._launches = time.monotonic(), idle_s, launches
        self._th = threading.Thread(target=self._run, name="loop", daemon=True)
        self._th.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            if not self._launches or time.monotonic() - self._t0 < self._idle:
                continue
            with self._lock:
                if self._step is None or (self._graphs_only and not self.graphs):
                    continue
                if self._step(self.graphs):
                    self._step, ev = None, self._ev
                    ev.set()

    def arm(self, step, graphs_only=False):
        import threading

        with self._lock:
            self._step, self._ev, self._graphs_only = step, threading.Event(), graphs_only
            return self._ev

    def widen(self):
        self._graphs_only = False

    def disarm(self):
        with self._lock:
            self._step = None

    def stop(self):
        self._stop.set()
        self._th.join(2)


def test_a_window_by_time_opens_at_the_hosts_next_launch_and_closes_after_a_dozen_graph_launches():
    from decodemon.probes import tracer

    tr = _fake_tracer()
    loop = _LaunchingLoop(idle_s=0.3, graphs=True)
    synced = []
    try:
        tr.trace_for(5.0, gate=loop, wait_host_s=2.0, gpu_sync=lambda: synced.append(1),
                     before_finalize=lambda: tr._c.calls.append(("pm_pump", "agent")))
    finally:
        loop.stop()
    assert 0.25 <= tr.last_ns["host_wait"] / 1e9 < 0.6  # it waited for the host's first launch ...
    assert tr.last_ns["graph_launches"] == tracer.GRAPH_LAUNCHES  # ... and closed after a dozen replays
    calls = tr._c.calls
    on = {n: th for n, th in calls if n in ("activity_enable", "activity_disable", "finalize", "activity_flush_all")}
    assert set(on.values()) == {"loop"}  # every change to CUPTI on the launching thread
    names = [n for n, _ in calls]
    assert names.index("pm_pump") < names.index("finalize") and len(synced) == 2  # before it, and inside it
    assert not tr.initialised and not tr.active and len(tr.bounds) == 2


def test_an_eager_loop_s_window_closes_at_its_first_launch_after_the_time_is_up():
    tr = _fake_tracer()
    loop = _LaunchingLoop(idle_s=0.0, graphs=False)
    t0 = time.monotonic()
    try:
        tr.trace_for(0.1, gate=loop, wait_host_s=1.0)
    finally:
        loop.stop()
    assert 0.1 <= time.monotonic() - t0 < 0.6 and tr.last_ns["graph_launches"] == 0
    assert {th for n, th in tr._c.calls if n == "finalize"} == {"loop"}


def test_a_host_that_stops_launching_still_gets_its_window_opened_and_finalized_by_the_agent(monkeypatch):
    from decodemon.probes import tracer

    monkeypatch.setattr(tracer, "FINALIZE_WAIT_S", 0.05)
    tr = _fake_tracer()
    loop = _LaunchingLoop(idle_s=0.0, graphs=True, launches=False)
    try:
        tr.trace_for(0.05, gate=loop, wait_host_s=0.1)
    finally:
        loop.stop()
    assert {th for n, th in tr._c.calls if n in ("activity_enable", "finalize")} == {"MainThread"}
    assert not tr.initialised and len(tr.bounds) == 2


def test_a_drain_that_never_goes_quiet_stops_at_its_cap():
    tr = _fake_tracer()
    tr._c.activity_flush_all = _LateRecords(tr, late=10**6, gap_s=0.0)
    t0 = time.monotonic()
    tr.trace_for(0.0, quiet_s=0.05, drain_max_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 0.5 and not tr.initialised


def test_a_time_window_records_clock_time_and_no_tokens():
    tr = _fake_tracer()
    tr.trace_for(0.01, quiet_s=0.01)
    w = tr.collect(4, guard_tokens=0, clock="time")
    assert (w.clock, w.tokens, w.guard_tokens, w.window_id) == ("time", 0, 0, 4)
    assert len(w.token_bounds_ns.array()) == 2 and w.analysed_span() is None
    assert wire.decode_frame(wire.encode(w)) == w


def _frames(got) -> list:
    return [wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got))]


def test_a_loop_without_token_marks_gets_windows_by_time_from_the_agent_thread(monkeypatch):
    monkeypatch.setattr(policy, "NO_MARKS_S", 0.3)
    monkeypatch.setattr(PROCESS, "windows_in_process", 0)
    tr = _fake_tracer()
    st = wire.Attach(window_period_s=0.2, window_max_s=0.2, window_min_tokens=0, time_window_s=0.05,
                     agent_tick_s=0.05, api_every=1)
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    t_end = time.monotonic() + 5
    while time.monotonic() < t_end and sum(isinstance(f, wire.KernelWindow) for f in _frames(got)) < 2:
        time.sleep(0.05)
    time.sleep(1.2)  # a stats frame after the windows
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = _frames(got)
    wins = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert len(wins) >= 2 and all(w.clock == "time" and w.tokens == 0 and w.guard_tokens == 0 for w in wins)
    assert [w.window_id for w in wins] == list(range(len(wins)))
    threads = {th for _, th in tr._c.calls}
    assert threads == {"decodemon-session"}  # no decode thread: the agent thread opened, closed, finalized
    names = [n for n, _ in tr._c.calls]
    # every window started CUPTI and finalized it (one more may have been traced after the monitor left)
    assert names.count("activity_register_callbacks") == names.count("finalize") in (len(wins), len(wins) + 1)
    status = [f for f in frames if isinstance(f, wire.ProbeStatus) and f.window_clock]
    assert status and (status[-1].window_clock, status[-1].window_clock_reason) == ("time", "no_marks")
    assert PROCESS.windows_in_process in (len(wins), len(wins) + 1) and result == ["monitor went away"]


def test_no_window_by_time_before_the_loop_has_been_silent_long_enough(monkeypatch):
    monkeypatch.setattr(policy, "NO_MARKS_S", 30.0)
    monkeypatch.setattr(policy, "FIRST_NO_MARKS_S", 30.0)
    tr = _fake_tracer()
    st = wire.Attach(window_period_s=0.1, window_max_s=0.1, window_min_tokens=0, agent_tick_s=0.05)
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s)
    time.sleep(0.6)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    assert tr._c.calls == [] and not any(isinstance(f, wire.KernelWindow) for f in _frames(got))


def test_token_marks_during_a_window_by_time_leave_cupti_to_the_agent_thread():
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(window_tokens=1), tr)
    s.timed_window = True
    tr.open()
    tr._c.calls.clear()
    for i in range(3):
        s.on_token(i)  # a bursty loop marking tokens while the agent's window is open
    assert tr._c.calls == [] and tr.active and len(s.marks_t) == 3
    s.timed_window = False


def test_bursty_marks_open_windows_by_time_while_the_decode_thread_keeps_marking(monkeypatch):
    monkeypatch.setattr(PROCESS, "windows_in_process", 0)
    tr = _fake_tracer()
    st = wire.Attach(window_period_s=0.3, window_max_s=0.3, window_min_tokens=0, time_window_s=0.05,
                     agent_tick_s=0.05)
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:  # 40 marks ~0.2 ms apart, then a 60 ms wait: the host runs ahead
        for _ in range(40):
            s.on_token(1)
            time.sleep(0.0002)
        time.sleep(0.06)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = _frames(got)
    wins = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert wins and wins[-1].clock == "time"
    status = [f for f in frames if isinstance(f, wire.ProbeStatus) and f.window_clock == "time"]
    assert status and status[-1].window_clock_reason == "bursts"
    assert {th for _, th in tr._c.calls} == {"decodemon-session"}


def test_a_loop_that_replays_graphs_and_marks_nothing_gets_a_window_that_waits_for_the_gpu_first(monkeypatch):
    """No token boundary and CUDA graphs replaying: the window by time is closed, then the agent waits for the GPU
    to run what was enqueued while it traced, and only then flushes and finalizes CUPTI."""
    from decodemon.probes import attach_loop

    monkeypatch.setattr(policy, "NO_MARKS_S", 0.3)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", True)
    tr = _fake_tracer()
    monkeypatch.setattr(attach_loop, "_gpu_sync", lambda: tr._c.calls.append(("gpu_sync", "")))
    st = wire.Attach(window_period_s=0.2, window_max_s=0.2, window_min_tokens=0, time_window_s=0.05,
                     agent_tick_s=0.05)
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    time.sleep(1.5)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = _frames(got)
    wins = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert wins and {w.clock for w in wins} == {"time"}
    names = [n for n, _ in tr._c.calls]
    finals = [i for i, n in enumerate(names) if n == "finalize"]
    assert finals
    for i in finals:
        last_disable = max(j for j in range(i) if names[j] == "activity_disable")
        syncs = [j for j in range(last_disable, i) if names[j] == "gpu_sync"]
        flushes = [j for j in range(last_disable, i) if names[j] == "activity_flush_all"]
        assert syncs and flushes and syncs[0] < flushes[0]  # closed, the GPU waited for, then flushed, finalized


def test_the_launch_gate_runs_its_step_at_launch_exits_only_while_armed():
    import enum
    import types

    from decodemon.probes.launch_gate import GateUnavailable, LaunchGate

    class Rt(enum.IntEnum):
        cudaLaunchKernel_v7000 = 1
        cudaGraphLaunch_v10000 = 2
        cudaMalloc_v3020 = 3

    class Drv(enum.IntEnum):
        cuLaunchKernel = 10
        cuGraphLaunch = 11

    enabled, subs = {}, []
    fake = types.SimpleNamespace(
        CallbackDomain=types.SimpleNamespace(RUNTIME_API=2, DRIVER_API=1),
        ApiCallbackSite=types.SimpleNamespace(API_EXIT=1), runtime_api_trace_cbid=Rt, driver_api_trace_cbid=Drv,
        subscribe=lambda cb, ud: subs.append(cb) or 7,
        enable_callback=lambda on, sub, dom, cbid: enabled.__setitem__((dom, cbid), bool(on)))
    gate = LaunchGate(fake)
    cb = subs[0]
    seen = []
    ev = gate.arm(lambda graph: seen.append(graph) or len(seen) == 2, graphs_only=True)
    assert {k for k, v in enabled.items() if v} == {(2, 2), (1, 11)}  # graph launches only, both APIs
    cb(None, 2, 2, types.SimpleNamespace(callback_site=0))  # an API's entry: nothing
    assert seen == [] and not ev.is_set()
    cb(None, 2, 2, types.SimpleNamespace(callback_site=1))
    gate.widen()
    assert {k for k, v in enabled.items() if v} == {(2, 1), (2, 2), (1, 10), (1, 11)}  # never cudaMalloc
    cb(None, 2, 1, types.SimpleNamespace(callback_site=1))
    assert seen == [True, False] and ev.is_set() and not any(enabled.values())  # done: callbacks off
    cb(None, 2, 1, types.SimpleNamespace(callback_site=1))
    assert seen == [True, False]
    boom = gate.arm(lambda graph: 1 / 0)
    cb(None, 2, 1, types.SimpleNamespace(callback_site=1))  # a failing step never raises into the launch
    assert boom.is_set() and isinstance(gate.error, ZeroDivisionError)

    def refuse(cb, ud):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    fake.subscribe = refuse
    try:
        LaunchGate(fake)
        raise AssertionError("a refused subscription must say so")
    except GateUnavailable as exc:
        assert "MULTIPLE_SUBSCRIBERS" in str(exc)
