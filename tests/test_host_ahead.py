"""A loop that marks each token at enqueue, ahead of the GPU (gpt-fast's `generate(callback=mark_token)` under
torch.compile reduce-overhead): five records in a row of one process on the H200, replayed against the loop's own
clock and torch.profiler's count of the same loop (tests/data/h200_compiled_llama8b_marks.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decodemon.monitor.analysis.rates import burst_stats
from decodemon.monitor.api import replay
from decodemon.monitor.player import RecordingPlayer
from tests.conftest import DATA

FACTS = json.loads((DATA / "h200_compiled_llama8b_marks.json").read_text())
RECORDS = sorted(FACTS["own_ms_per_token"])


@pytest.mark.parametrize("name", RECORDS)
def test_each_of_five_records_reads_the_loops_own_ms_per_token(name):
    j = replay(DATA / name).as_json()
    own = FACTS["own_ms_per_token"][name]
    assert j["token_clock"] == "mark_bursts"
    assert j["ms_per_token"] == pytest.approx(own, rel=0.05)  # marks one by one read 0.50-0.88 against 5.89
    assert j["tokens"] > 0 and j["token_clock_note"].startswith("marks come in bursts")
    assert j["candidates"]["launch"]["state"] != "binding"


def test_the_traced_window_is_read_on_whole_gpu_steps():
    """The one record whose window opened: its marks were 9.5 ms apart (a full launch queue paces the host), yet
    8% of the kernels it traced started between them. Read on the GPU's step: torch.profiler's launches and
    kernel time a step, the GPU 94% busy, and LAUNCH ruled out."""
    with_window = [n for n in RECORDS if replay(DATA / n).as_json()["windows"]]
    assert with_window == ["h200_compiled_llama8b_marks_4.dmon"]
    j = replay(DATA / with_window[0]).as_json()
    prof = FACTS["profiler"]
    assert j["kernels_per_token"] == pytest.approx(prof["kernels_per_step"], rel=0.1)
    assert j["kernel_sum_ms_per_token"] == pytest.approx(prof["kernel_ms_per_step"], rel=0.1)
    assert j["gpu_busy_pct"] >= 90
    assert j["candidates"]["launch"]["state"] == "ruled_out"


def test_burst_starts_are_where_the_gpu_caught_up():
    """The marks of one record: bursts of up to 200 enqueues 0.5 ms apart, whose last ~20 come at the GPU's pace
    (a full launch queue), then a wait of 0.5-1 s. Only the waits start a burst."""
    p = RecordingPlayer(str(DATA / "h200_compiled_llama8b_marks_3.dmon"))
    p.seek(p.end_ns)
    t = p.session.feed.token_times_ns()
    d = np.diff(t) / 1e6
    assert np.median(d) < 1 and (d > 100).sum() == 4
    assert 3 < ((d > 5) & (d < 7)).sum()  # the paced ends of bursts: not pauses
    ts = burst_stats(t)
    assert ts.ms_per_token == pytest.approx(FACTS["own_ms_per_token"]["h200_compiled_llama8b_marks_3.dmon"], rel=0.02)
    steady = np.cumsum(np.full(100, 5_000_000, dtype=np.int64))
    assert burst_stats(steady) is None  # no pause: nothing to time by bursts


def test_a_loop_that_idles_between_generations_is_not_read_as_running_ahead():
    """A chat loop making 50 tokens 25 ms apart, then waiting 5 s for its user, marks in bursts too; its marks are
    no enqueues (far over a millisecond apart), so its clock stays the marks one by one: 25 ms, not 125."""
    from decodemon.monitor.analysis.rates import marks_enqueued
    from decodemon.monitor.session import Session
    from decodemon.probes import wire

    t, now = [], 0
    for _ in range(6):
        for _ in range(50):
            now += 25_000_000
            t.append(now)
        now += 5_000_000_000
    s = Session()
    s.add(1_000, wire.TokenMarks(t_ns=wire.Column.of(t), depth=wire.Column.of([0] * len(t))))
    snap = s.snapshot()
    assert snap.token_clock == "mark_token" and snap.tokens.ms_per_token == pytest.approx(25.0)
    assert not marks_enqueued(t) and marks_enqueued(t, gpu_busy_pct=95.0)
