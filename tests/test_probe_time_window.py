"""Windows by time: a loop that never marks a token (or whose marks come in bursts) still gets traced windows,
opened and closed by the agent thread, with CUPTI faked at the cupti-python boundary."""

from __future__ import annotations

import socket
import time

from decodemon.probes import policy, wire
from decodemon.probes import session as sess
from decodemon.probes.facts import PROCESS
from tests.test_agent import _fake_tracer, _run_agent_loop


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
    tr.trace_for(0.1, quiet_s=0.05, drain_max_s=1.0, sleep=lambda s: (slept.append(s), time.sleep(s)), gate=False)
    took = time.monotonic() - t0
    names = [n for n, _ in tr._c.calls]
    assert names[0] == "activity_register_callbacks" and names[-1] == "finalize"
    assert len(tr._batches) == 3  # every late record came in before the finalize
    assert slept[0] == 0.1 and 0.1 + 0.04 + 0.05 <= took < 0.6
    assert len(tr.bounds) == 2 and not tr.active and not tr.initialised


def test_trace_for_waits_for_the_gpu_after_the_close_and_pumps_before_the_finalize():
    tr = _fake_tracer()
    c = tr._c
    tr.trace_for(0.01, quiet_s=0.01, gpu_sync=lambda: c.calls.append(("gpu_sync", "")),
                 before_finalize=lambda: c.calls.append(("pm_pump", "")), gate=False)
    names = [n for n, _ in c.calls]
    order = [names.index(n) for n in ("activity_disable", "gpu_sync", "activity_flush_all", "pm_pump", "finalize")]
    assert order == sorted(order) and names[-1] == "finalize" and "gpu_sync" in tr.last_ns


class _MainLoop:
    """main_thread.MainThreadGate's interface over a thread named "loop" that comes back to Python every
    millisecond once `idle_s` has passed (never, with `returns=False`): armed steps run there."""

    def __init__(self, idle_s: float, returns: bool = True) -> None:
        import threading

        self.error, self._armed, self._lock, self._stop = None, None, threading.Lock(), threading.Event()
        self._t0, self._idle, self._returns = time.monotonic(), idle_s, returns
        self._th = threading.Thread(target=self._run, name="loop", daemon=True)
        self._th.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            if not self._returns or time.monotonic() - self._t0 < self._idle:
                continue
            with self._lock:
                armed, self._armed = self._armed, None
            if armed:
                armed[0]()
                armed[1].set()

    def arm(self, step):
        import threading

        with self._lock:
            self._armed = (step, threading.Event())
            return self._armed[1]

    def disarm(self):
        with self._lock:
            self._armed = None

    def stop(self):
        self._stop.set()
        self._th.join(2)


def test_a_window_by_time_changes_cupti_only_on_the_main_thread_and_pumps_pm_before_the_finalize():
    tr = _fake_tracer()
    loop = _MainLoop(idle_s=0.3)  # a host waiting 0.3 s for the GPU in a sync, then back in Python
    synced = []
    try:
        tr.trace_for(0.05, gate=loop, wait_host_s=2.0, gpu_sync=lambda: synced.append(1),
                     before_finalize=lambda: tr._c.calls.append(("pm_pump", "agent")))
    finally:
        loop.stop()
    assert 0.25 <= tr.last_ns["host_wait"] / 1e9 < 0.6  # opened when the host came back
    calls = tr._c.calls
    on = {th for n, th in calls if n in ("activity_enable", "activity_disable", "finalize", "activity_flush_all")}
    assert on == {"loop"}  # every change to CUPTI there
    names = [n for n, _ in calls]
    assert names.index("activity_disable") < names.index("pm_pump") < names.index("finalize")
    assert len(synced) == 4  # the main thread before the open, the close and the finalize; the agent before the pump
    assert not tr.initialised and not tr.active and len(tr.bounds) == 2


def test_a_main_thread_that_never_comes_back_still_gets_its_window_made_by_the_agent(monkeypatch):
    from decodemon.probes import tracer

    monkeypatch.setattr(tracer, "FINALIZE_WAIT_S", 0.05)
    tr = _fake_tracer()
    loop = _MainLoop(idle_s=0.0, returns=False)
    try:
        tr.trace_for(0.05, gate=loop, wait_host_s=0.1)
    finally:
        loop.stop()
    assert {th for n, th in tr._c.calls if n in ("activity_enable", "finalize")} == {"MainThread"}
    assert not tr.initialised and len(tr.bounds) == 2


def test_the_main_thread_gate_runs_its_step_on_the_main_thread_between_bytecodes():
    import threading

    from decodemon.probes.main_thread import MainThreadGate

    gate = MainThreadGate()
    ran_on, box = [], {}
    th = threading.Thread(target=lambda: box.update(ev=gate.arm(lambda: ran_on.append(
        threading.current_thread().name))))
    th.start()
    th.join()
    t0 = time.monotonic()
    while not box["ev"].is_set() and time.monotonic() - t0 < 5:
        pass  # the main thread runs bytecode: the pending call comes in here
    assert ran_on == ["MainThread"] and gate.error is None
    bad = gate.arm(lambda: 1 / 0)
    t0 = time.monotonic()
    while not bad.is_set() and time.monotonic() - t0 < 5:
        pass
    assert isinstance(gate.error, ZeroDivisionError)  # kept, never raised into the loop
    th = threading.Thread(target=lambda: (gate.arm(lambda: ran_on.append("late")), gate.disarm()))
    th.start()
    th.join()
    for _ in range(1000):
        pass
    assert ran_on == ["MainThread"]  # a disarmed step never runs


def test_a_drain_that_never_goes_quiet_stops_at_its_cap():
    tr = _fake_tracer()
    tr._c.activity_flush_all = _LateRecords(tr, late=10**6, gap_s=0.0)
    t0 = time.monotonic()
    tr.trace_for(0.0, quiet_s=0.05, drain_max_s=0.2, gate=False)
    assert 0.2 <= time.monotonic() - t0 < 0.5 and not tr.initialised


def test_a_time_window_records_clock_time_and_no_tokens():
    tr = _fake_tracer()
    tr.trace_for(0.01, quiet_s=0.01, gate=False)
    w = tr.collect(4, guard_tokens=0, clock="time")
    assert (w.clock, w.tokens, w.guard_tokens, w.window_id) == ("time", 0, 0, 4)
    assert len(w.token_bounds_ns.array()) == 2 and w.analysed_span() is None
    assert wire.decode_frame(wire.encode(w)) == w


def _frames(got) -> list:
    return [wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got))]


def test_a_loop_without_token_marks_gets_windows_by_time_timed_by_the_agent_made_on_the_main_thread(monkeypatch):
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
    t_end = time.monotonic() + 1.2
    while time.monotonic() < t_end:  # a stats frame after the windows; the main thread runs Python meanwhile
        time.sleep(0.01)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = _frames(got)
    wins = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert len(wins) >= 2 and all(w.clock == "time" and w.tokens == 0 and w.guard_tokens == 0 for w in wins)
    assert [w.window_id for w in wins] == list(range(len(wins)))
    # the agent thread timed each window; the main thread (this test's, running Python) opened, closed, finalized
    assert {th for n, th in tr._c.calls if n == "activity_enable"} == {"MainThread"}
    assert set([th for n, th in tr._c.calls if n == "finalize"][:len(wins)]) == {"MainThread"}
    assert {th for n, th in tr._c.calls if n == "activity_register_callbacks"} == {"decodemon-session"}
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
    # the window changed CUPTI on the main thread (this test's, marking tokens), never on a marking boundary
    assert {th for n, th in tr._c.calls if n in ("activity_enable", "finalize")} == {"MainThread"}


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
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:  # the loop's main thread, running Python between its launches
        time.sleep(0.01)
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
