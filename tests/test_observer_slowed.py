"""Tokens the observer's own steps overlapped are not the loop's speed: the agent notes each step that can hold the
decode thread or its GIL (a traced window on the decode thread, CUPTI's start-up, a collect, a PM pump, a window by
time) on the marks' clock, ships them beside the marks, and the monitor leaves the tokens they overlap out of the
loop's figures and bills them to the observer in milliseconds."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from decodemon.monitor.analysis.tokens import observed_tokens, observer_slowed, token_stats
from decodemon.monitor.render.text import observer_parts
from decodemon.monitor.session import Session
from decodemon.probes import session as sess
from decodemon.probes import wire
from decodemon.probes.facts import PROCESS
from tests.test_agent import _fake_tracer, _run_agent_loop

MS = 1_000_000


def test_a_step_marks_the_tokens_it_overlaps_and_no_other():
    t = np.array([0, 10, 20, 80, 90, 100, 110]) * MS
    assert observed_tokens(t, [(25 * MS, 30 * MS, 2)]).tolist() == [False, False, True, False, False, False]
    # touching a boundary is not overlapping: a step that ends as a token starts leaves that token alone
    assert observed_tokens(t, [(10 * MS, 20 * MS, 0)]).tolist() == [False, True, False, False, False, False]
    assert observed_tokens(t, [(85 * MS, 105 * MS, 3)]).tolist() == [False, False, False, True, True, True]
    assert not observed_tokens(t, [(200 * MS, 210 * MS, 1)]).any()  # after the marks


def test_the_loops_figures_leave_the_overlapped_tokens_out_and_the_observer_pays_for_them():
    t = np.array([0, 10, 20, 80, 90, 100, 110]) * MS  # one 60 ms token while the agent collected a window
    spans = [(25 * MS, 30 * MS, 2)]
    plain, fair = token_stats(t), token_stats(t, observed_tokens(t, spans))
    assert plain.ms_per_token_p99 > 50 and plain.tokens_per_s == pytest.approx(1e3 / (110 / 6))
    assert (fair.tokens, fair.ms_per_token, fair.ms_per_token_p99, fair.tokens_per_s) == (5, 10.0, 10.0, 100.0)
    assert observer_slowed(t, spans, wire.OBSERVER_STEPS) == {"tokens": 1, "extra_ms": 50.0, "by": ["collect"]}
    # a span that overlapped every token leaves nothing to read the loop by: the figures stay as they were
    everything = [(0, 110 * MS, 0)]
    assert token_stats(t, observed_tokens(t, everything)) == plain
    assert observer_slowed(t, everything, wire.OBSERVER_STEPS) is None


def _marks_frame(t_ns, spans=()):
    extra = {"observer_ns": wire.Column.of([v for row in spans for v in row])} if spans else {}
    return wire.TokenMarks(t_ns=wire.Column.of(list(t_ns)), depth=wire.Column.of([100] * len(t_ns)), **extra)


def test_the_summary_reads_the_loop_without_the_observers_stall_and_says_what_it_cost():
    t = [i * 10 * MS for i in range(200)]
    t = t[:100] + [x + 300 * MS for x in t[100:]]  # token 100 took 310 ms: a PM pump held the GIL
    s = Session(label="x")
    s.add(1, wire.Hello(wire_version=2, pid=1, argv=["loop"], python="3.11", hostname="h"))
    s.add(2, _marks_frame(t, [(t[99] + 5 * MS, t[99] + 305 * MS, wire.OBSERVER_STEPS.index("pump"))]))
    snap = s.snapshot()
    assert snap.tokens.ms_per_token == pytest.approx(10.0) and snap.tokens.tokens_per_s == pytest.approx(100.0)
    assert snap.tokens.tokens == 198  # 199 tokens, the one the pump overlapped left out
    o = snap.observer
    assert (o["slowed_tokens"], o["slowed_extra_ms"], o["slowed_by"]) == (1, 300.0, ["pump"])
    assert observer_parts(o) == ["the observer overlapped 1 token (pump): +300.0 ms over the others' median, left "
                                 "out of the loop's figures"]
    unobserved = Session(label="y")  # the same marks with no step noted: the stall is the loop's
    unobserved.add(2, _marks_frame(t))
    plain = unobserved.snapshot()
    assert plain.tokens.tokens_per_s == pytest.approx(1e3 * 199 / (199 * 10 + 300)) and plain.observer is None


def test_the_agent_ships_its_window_and_collect_beside_the_marks_they_overlap(monkeypatch):
    """The real agent loop (a stand-in CUPTI): the decode thread's traced window and the agent's collect come
    over the wire on the marks' clock, around the traced token."""
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)
    monkeypatch.setattr(PROCESS, "windows_in_process", 1)
    tr = _fake_tracer()
    s = sess.Session(wire.Attach(window_period_s=0.3, window_tokens=1, window_min_tokens=0, agent_tick_s=0.1,
                                 prepare_first_window=False), tr)
    loop, result, got, theirs = _run_agent_loop(s, name="decodemon-session")
    t_end = time.monotonic() + 1.5
    while time.monotonic() < t_end:
        s.on_token(1)
        time.sleep(0.01)
    theirs.shutdown(socket.SHUT_RDWR)
    loop.join(5)
    frames = [wire.decode_frame(x) for x in wire.StreamReader(max_frame=1 << 22).feed(bytes(got))]
    marks = np.concatenate([f.t_ns.array() for f in frames if isinstance(f, wire.TokenMarks)])
    rows = np.concatenate([f.observer_ns.array() for f in frames
                           if isinstance(f, wire.TokenMarks) and f.observer_ns is not None]).reshape(-1, 3)
    steps = {wire.OBSERVER_STEPS[k] for k in rows[:, 2]}
    assert {"window", "collect"} <= steps
    for a, b, k in rows:
        assert b >= a and marks[0] <= a <= marks[-1] + 1e9
    win = rows[rows[:, 2] == 0][0]
    inside = marks[(marks >= win[0]) & (marks <= win[1])]
    assert len(inside) >= 1  # the traced token's closing mark falls in the window's span
    assert observed_tokens(marks, [tuple(win)]).sum() >= 1


def test_steps_noted_while_no_token_came_wait_for_the_next_marks_and_a_detach_ships_the_last_marks():
    from decodemon.probes import attach_loop

    mine, theirs = socket.socketpair()
    s = sess.Session(wire.Attach(trace=False, pm=False, agent_tick_s=1.0), None)
    loop = attach_loop.AttachLoop(mine, wire.StreamReader(), s, {}, None)
    s.observer.append((1, 2, 3))
    loop._ship_marks()
    assert not loop.out and s.observer == [(1, 2, 3)]  # nothing shipped, nothing dropped
    s.on_token(4)
    loop._ship_marks()
    (frame,) = [wire.decode_frame(p) for p in wire.StreamReader().feed(bytes(loop.out))]
    assert frame.observer_ns.array().tolist() == [1, 2, 3] and len(frame.t_ns.array()) == 1 and s.observer == []
    mine.close()
    theirs.close()
    # a detach between two ticks: the marks since the last tick reach the monitor before the Bye
    s = sess.Session(wire.Attach(trace=False, pm=False, agent_tick_s=1.0), None)
    loop, result, got, theirs = _run_agent_loop(s)
    time.sleep(0.1)
    for _ in range(5):
        s.on_token(1)
    theirs.sendall(wire.pack(wire.Detach()))
    loop.join(5)
    assert result == ["detached"]
    time.sleep(0.1)
    marks = [f for f in (wire.decode_frame(p) for p in wire.StreamReader().feed(bytes(got)))
             if isinstance(f, wire.TokenMarks)]
    assert sum(len(f.t_ns.array()) for f in marks) == 5
