"""`decodemon allreduce` repeats the benchmark and reports the median and range of its runs, says when the
latency-bound conclusion is inside that range, and flags a payload that costs more than a bigger one."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.cli.allreduce import summarise, summary_text
from tests.conftest import cli


def _run(us_1x, us_8x, us_64x) -> dict:
    """One run's report as the benchmark prints it with --json."""
    return {"device": "cpu", "tp": 2, "dtype": "float32", "method": "host clock",
            "sizes": {"1": {"bytes": 2048, "us_per_call": us_1x}, "8": {"bytes": 16384, "us_per_call": us_8x},
                      "64": {"bytes": 131072, "us_per_call": us_64x}}}


def test_two_runs_that_disagree_are_undecided_with_their_range():
    # the two back-to-back runs that read 1.23x "latency-bound" and 5.818x "bandwidth matters"
    s = summarise([_run(100, 110, 123), _run(100, 300, 581.8), _run(100, 150, 190)])
    assert s["repeats"] == 3 and s["within_noise"] and s["regime"].startswith("undecided")
    assert s["ratio_64x"] == pytest.approx(1.9) and s["ratio_64x_range"] == pytest.approx([1.23, 5.818])
    assert s["sizes"]["64"]["us_per_call"] == 190 and s["sizes"]["64"]["us_per_call_range"] == [123, 581.8]
    assert "inside their own noise" in summary_text(s)


@pytest.mark.parametrize("runs, regime", [
    ([_run(100, 105, 120), _run(100, 104, 130)], "latency-bound"),
    ([_run(100, 400, 3000), _run(100, 420, 2800)], "bandwidth matters"),
])
def test_runs_on_one_side_of_the_line_conclude(runs, regime):
    s = summarise(runs)
    assert not s["within_noise"] and s["regime"].startswith(regime) and s["non_monotonic"] == []
    assert "not monotonic" not in summary_text(s) and "undecided" not in summary_text(s)


def test_eight_times_costing_more_than_sixty_four_times_is_flagged():
    s = summarise([_run(1120, 3699, 2707), _run(1000, 3500, 2600)])
    assert s["non_monotonic"] == ["8x costs more than 64x (3600 against 2654 µs/call)"]
    text = summary_text(s)
    assert s["regime"].startswith("undecided") and "bandwidth matters" not in text  # no conclusion beside it
    assert "not monotonic: 8x costs more than 64x" in text


def test_a_latency_bound_call_whose_sizes_cost_within_ten_percent_is_not_inverted():
    s = summarise([_run(100, 104, 98), _run(100, 102, 97)])  # flat: 64x a few % under 1x is its noise
    assert s["non_monotonic"] == [] and s["regime"].startswith("latency-bound")


def test_a_single_run_says_it_has_no_spread():
    assert "one run: no spread" in summary_text(summarise([_run(100, 105, 120)]))


def test_the_verb_on_cpu_gives_each_size_its_median_and_range():
    r = cli("allreduce", "--payload-bytes", 2048, "--tp", 2, "--iters", 10, "--device", "cpu", "--repeats", 2,
            "--json", timeout=300)  # two gloo ranks: minutes on a 2-core machine beside other work
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["repeats"] == 2 and set(d["sizes"]) == {"1", "8", "64"}
    for row in d["sizes"].values():
        lo, hi = row["us_per_call_range"]
        assert len(row["us_per_call_runs"]) == 2 and 0 < lo <= row["us_per_call"] <= hi
    lo, hi = d["ratio_64x_range"]
    assert lo <= d["ratio_64x"] <= hi and d["within_noise"] == (lo < 2 <= hi)
