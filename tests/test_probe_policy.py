"""When the agent traces, as pure functions: which clock a window opens by, the budget, the guard, the schedule."""

from __future__ import annotations

import pytest

from decodemon.probes import policy, wire
from decodemon.probes.schedule import Schedule

MS = 1_000_000


def steady(n: int, every_ms: float = 5.0) -> list[int]:
    return [int(i * every_ms * MS) for i in range(n)]


def bursts(n: int, burst: int = 40, fast_ms: float = 0.7, wait_ms: float = 150.0) -> list[int]:
    """A host that enqueues `burst` steps ~0.7 ms apart, then waits ~150 ms for the GPU to catch up."""
    t, out = 0.0, []
    for i in range(n):
        t += wait_ms if i and i % burst == 0 else fast_ms
        out.append(int(t * MS))
    return out


def test_a_loop_that_marks_no_tokens_gets_windows_by_time_half_a_second_into_an_attach():
    assert policy.window_clock(now=100.2, attached_at=100.0, last_mark_at=None, recent_marks_ns=[]) is None
    # no mark half a second into an attach: the first window opens by time, so the first verdict comes early
    assert policy.window_clock(now=100.5, attached_at=100.0, last_mark_at=None, recent_marks_ns=[]) == "time"
    assert policy.time_clock_reason(None, 102.0) == "no_marks"


def test_a_loop_that_stops_marking_gets_windows_by_time_two_seconds_after_its_last_mark():
    marks = steady(100)
    assert policy.window_clock(105.0, 100.0, last_mark_at=104.0, recent_marks_ns=marks) == "tokens"
    assert policy.window_clock(106.5, 100.0, last_mark_at=104.0, recent_marks_ns=marks) == "time"
    assert policy.time_clock_reason(104.0, 106.5) == "no_marks"


def test_marks_in_bursts_mean_the_host_runs_ahead_and_windows_open_by_time():
    assert not policy.marks_bursty(steady(64))
    assert not policy.marks_bursty(steady(64, 20.0) + [64 * 20 * MS + 400 * MS])  # one stall is not a burst
    assert policy.marks_bursty(bursts(64))
    assert not policy.marks_bursty(bursts(10))  # too few marks to tell
    assert policy.window_clock(105.0, 100.0, last_mark_at=104.9, recent_marks_ns=bursts(200)) == "time"
    assert policy.time_clock_reason(104.9, 105.0) == "bursts"
    # only the newest 64 marks count: a loop that was bursty and now is steady opens by tokens again
    assert policy.window_clock(105.0, 100.0, 104.9, bursts(200) + [bursts(200)[-1] + x for x in steady(64)]) \
        == "tokens"


def test_the_budget_rations_then_stops_windows():
    assert policy.budget_state(0, 500) == "open"
    assert policy.budget_state(500, 500) == "rationed"
    assert policy.budget_state(policy.BUDGET_CAP * 500, 500) == "spent"


def test_the_guard_token_follows_graphs_seen_and_what_the_engine_said():
    g = policy.guard_for_window
    assert g(True, False, None) and not g(False, False, None)  # not said: the tracer's own view
    assert not g(True, False, False)  # the engine said it never replays graphs
    assert g(False, True, False) and g(False, False, True)  # graphs seen, or said: always


def test_time_windows_keep_the_cadence_rules_of_token_windows():
    """A marks-less loop has no tokens to wait for: its windows come every window_max_s, and the budget holds."""
    st = wire.Attach(window_period_s=4, window_min_tokens=250, window_max_s=5, window_budget=3)
    assert not policy.window_due(st, now=4.0, next_window=4.0, since_s=4.0, tokens_since=0)
    assert policy.window_due(st, now=5.0, next_window=4.0, since_s=5.0, tokens_since=0)
    assert not policy.window_due(st, now=5.0, next_window=4.0, since_s=5.0, tokens_since=0, windows_so_far=3)


def test_a_schedule_runs_each_task_a_period_after_it_ran_half_a_tick_early():
    s = Schedule(slack_s=0.125)
    s.add("stats", 1.0, first_at=11.0)
    s.add("pm", 1.0, first_at=10.5)
    assert not s.due("stats", 10.8) and s.due("stats", 10.875) and s.due("pm", 10.375)
    s.ran("stats", 10.9)
    assert s.next_at("stats") == pytest.approx(11.775)
    s.due_at("pm", 10.91)  # a closed window: pump soon, not a period later
    assert s.due("pm", 10.91) and not s.due("pm", 10.9)


def test_a_process_that_replays_graphs_gets_no_window_by_time(monkeypatch):
    import types

    monkeypatch.setattr(policy, "POOL_CHECK_S", 0.0)  # every call looks again (the agent looks every 30 s)
    monkeypatch.setattr(policy, "_POOLS", {"seen": False, "checked_at": -1e18})

    class Cuda:
        def __init__(self, started, pools=((0, 0),), broken=False):
            self.started, self.pools, self.broken = started, pools, broken

        def is_initialized(self):
            return self.started

        def memory_snapshot(self):
            if self.broken:
                raise RuntimeError("no snapshot")
            return [{"segment_pool_id": p} for p in self.pools]

    def mods(**kw):
        return {"torch": types.SimpleNamespace(cuda=Cuda(**kw))}

    assert not policy.replays_graphs(False, None, {})  # no torch: nothing says graphs
    assert policy.replays_graphs(True, None, {}) and policy.replays_graphs(False, True, {})
    assert policy.replays_graphs(False, None, {"torch._inductor.cudagraph_trees": object()})
    assert not policy.replays_graphs(False, None, mods(started=False))
    assert not policy.replays_graphs(False, None, mods(started=True))  # only the default pool
    assert policy.replays_graphs(False, None, mods(started=True, pools=((0, 0), (1, 2))))  # a captured graph's pool
    assert policy.replays_graphs(False, None, mods(started=True))  # and it stays known
    policy._POOLS["seen"] = False
    assert policy.replays_graphs(False, None, mods(started=True, broken=True))  # cannot tell: no window by time
    assert not policy.replays_graphs(False, False, mods(started=True, broken=True))  # the engine said: no graphs


def test_a_window_by_time_traces_about_four_tokens_of_a_marking_loop_and_the_longest_without_marks():
    assert policy.time_window_s(0.25, []) == 0.25
    ms = [int(i * 4.0 * MS) for i in range(64)]  # 4 ms tokens
    assert policy.time_window_s(0.25, ms) == 0.02  # four 4 ms tokens: 16 ms, under the 20 ms floor
    slow = [int(i * 30.0 * MS) for i in range(64)]
    assert abs(policy.time_window_s(0.25, slow) - 0.12) < 1e-9
    glacial = [int(i * 300.0 * MS) for i in range(64)]
    assert policy.time_window_s(0.25, glacial) == 0.25
