"""Windows by time: a loop that never marks a token (or whose marks come in bursts) still gets traced windows,
opened and closed by the agent thread, with decodemon's CUPTI library faked at its ctypes boundary."""

from __future__ import annotations

import socket
import time

from decodemon.probes import policy, wire
from decodemon.probes import session as sess
from decodemon.probes.facts import PROCESS
from tests.conftest import as_monitor_reads
from tests.test_agent import _fake_tracer, _run_agent_loop


class _LateRecords:
    """The library's flush, for a GPU that runs behind the host: the first `late` flushes after the close each
    deliver one more kernel record, `gap_s` apart."""

    def __init__(self, tr, late: int, gap_s: float) -> None:
        self.tr, self.late, self.gap_s, self.last = tr, late, gap_s, 0.0

    def __call__(self) -> int:
        now = time.monotonic()
        if self.late and now - self.last >= self.gap_s:
            self.late -= 1
            self.last = now
            self.tr._c.records += 1
        return 0


def test_trace_for_opens_sleeps_closes_drains_the_late_records_then_finalizes():
    tr = _fake_tracer()
    tr._c.decodemon_win_flush = _LateRecords(tr, late=3, gap_s=0.02)
    slept = []
    t0 = time.monotonic()
    tr.trace_for(0.1, quiet_s=0.05, drain_max_s=1.0, sleep=lambda s: (slept.append(s), time.sleep(s)))
    took = time.monotonic() - t0
    names = [n for n, _ in tr._c.calls]
    assert names[0] == "activity_register_callbacks" and names[-1] == "finalize"
    assert tr._c.records == 3  # every late record came in before the finalize
    assert slept[0] == 0.1 and 0.1 + 0.04 + 0.05 <= took < 0.6
    assert len(tr.bounds) == 2 and not tr.active and not tr.initialised


def test_a_drain_that_never_goes_quiet_stops_at_its_cap():
    tr = _fake_tracer()
    tr._c.decodemon_win_flush = _LateRecords(tr, late=10**6, gap_s=0.0)
    t0 = time.monotonic()
    tr.trace_for(0.0, quiet_s=0.05, drain_max_s=0.2)
    assert 0.2 <= time.monotonic() - t0 < 0.5 and not tr.initialised


def test_a_time_window_records_clock_time_and_no_tokens():
    tr = _fake_tracer()
    tr.trace_for(0.01, quiet_s=0.01)
    w = as_monitor_reads(tr.collect(4, guard_tokens=0, clock="time"))
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
    assert tr._c.calls == [] and tr.active and s.marks_queued == 3
    s.timed_window = False


def test_bursty_marks_open_windows_by_time_while_the_decode_thread_keeps_marking(monkeypatch):
    monkeypatch.setattr(PROCESS, "windows_in_process", 0)
    tr = _fake_tracer()
    st = wire.Attach(window_period_s=0.3, window_max_s=0.3, window_min_tokens=0, time_window_s=0.05,
                     agent_tick_s=0.05)
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    t_end = time.monotonic() + 2.0
    while time.monotonic() < t_end:  # 40 marks back to back, then a 60 ms wait: the host runs ahead
        for _ in range(40):  # (no sleep between them: on a loaded 2-core machine a 0.2 ms sleep took ~1 ms)
            s.on_token(1)
        time.sleep(0.06)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = _frames(got)
    wins = [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert wins and wins[-1].clock == "time"
    status = [f for f in frames if isinstance(f, wire.ProbeStatus) and f.window_clock == "time"]
    assert status and status[-1].window_clock_reason == "bursts"
    assert {th for _, th in tr._c.calls} == {"decodemon-session"}


def test_a_loop_that_replays_graphs_and_marks_nothing_gets_counters_and_the_reason_not_a_window(monkeypatch):
    """No token boundary and CUDA graphs replaying: no safe point to finalize CUPTI at, so no window by time; the
    status says so (the monitor prices the floor from the DRAM counters alone)."""
    monkeypatch.setattr(policy, "NO_MARKS_S", 0.3)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", True)
    tr = _fake_tracer()
    st = wire.Attach(window_period_s=0.2, window_max_s=0.2, window_min_tokens=0, time_window_s=0.05,
                     agent_tick_s=0.05)
    s = sess.Session(st, tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    time.sleep(1.5)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = _frames(got)
    assert not [f for f in frames if isinstance(f, wire.KernelWindow)]
    assert "activity_register_callbacks" not in [n for n, _ in tr._c.calls]
    status = [f for f in frames if isinstance(f, wire.ProbeStatus) and f.window_clock]
    assert status and (status[-1].window_clock, status[-1].window_clock_reason) == ("none", "graphs")

