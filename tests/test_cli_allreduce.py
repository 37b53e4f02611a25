"""`decodemon allreduce` repeats the benchmark and reports the median and range of its runs, says when the
latency-bound conclusion is inside that range, and flags a payload that costs more than a bigger one."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.cli.allreduce import summarise, summary_text
from tests.conftest import assert_one_line_error, cli


def _run(us_1x, us_8x, us_64x) -> dict:
    """One run's report as the benchmark prints it with --json."""
    return {"device": "cpu", "tp": 2, "dtype": "float32", "method": "host clock",
            "sizes": {"1": {"bytes": 2048, "us_per_call": us_1x}, "8": {"bytes": 16384, "us_per_call": us_8x},
                      "64": {"bytes": 131072, "us_per_call": us_64x}}}


def test_two_runs_that_disagree_are_undecided_with_their_range():
    # the two back-to-back runs that read 1.23x "latency-bound" and 5.818x "bandwidth matters"
    s = summarise([_run(100, 110, 123), _run(100, 300, 581.8), _run(100, 150, 190)])
    assert s["repeats"] == 3 and s["within_noise"] and s["regime"].startswith("undecided")
    assert s["ratio_64x"] == pytest.approx(1.9) and s["ratio_64x_range"] == pytest.approx([1.23, 5.82])
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
    assert s["non_monotonic"] == ["8x costs more than 64x (3599.50 against 2653.50 µs/call)"]
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


def test_within_noise_holds_for_the_range_as_printed():
    # 199.996 / 100 is 2.00 as the range prints it: the range reaches the bandwidth side, so the runs straddle the line
    s = summarise([_run(100, 105, 150), _run(100, 105, 199.996), _run(100, 105, 160)])
    assert s["ratio_64x_range"] == [1.5, 2.0] and s["within_noise"] and s["regime"].startswith("undecided")
    assert "1.50-2.00x" in summary_text(s) and "inside their own noise" in summary_text(s)


def test_a_latency_bound_range_around_one_is_not_within_noise_and_the_text_says_which_side():
    # the trial's run 2: 64x ranged 0.684-1.483x of 1x; every run under 2x, so latency-bound stands
    s = summarise([_run(265.3612, 260.8577, 181.5), _run(300, 280, 444.9), _run(250, 255, 250)])
    assert s["ratio_64x_range"] == [0.68, 1.48] and not s["within_noise"] and s["regime"].startswith("latency-bound")
    text = summary_text(s)
    assert "0.68-1.48x, every run under 2x; the table's medians give " in text and "): latency-bound" in text
    # the headline is the runs' own ratios' median, and the table's medians' ratio is said beside it
    assert "(the median of 3 runs' own ratios, " in text
    s = summarise([_run(100, 400, 3000), _run(100, 420, 2800)])
    text = summary_text(s)
    assert "every run at 2x or over; the table's medians give " in text and "): bandwidth matters" in text
    said = float(text.split("the table's medians give ")[1].split("x")[0])
    table = s["sizes"]["64"]["us_per_call"] / s["sizes"]["1"]["us_per_call"]
    assert said == pytest.approx(table, abs=0.006)


def test_microseconds_are_rounded_to_a_hundredth_in_json_and_text_alike():
    s = summarise([_run(265.3612345, 260.8577001, 280.123456), _run(270.004999, 250.1, 290.555555)])
    one = s["sizes"]["1"]
    assert one["us_per_call_runs"] == [265.36, 270.0] and one["us_per_call"] == 267.68
    assert one["us_per_call_range"] == [265.36, 270.0] and s["sizes"]["64"]["us_per_call"] == 285.34
    text = json.dumps(s)
    assert "265.3612" not in text and "260.8577" not in text and "267.68" in summary_text(s)


def test_an_inversion_inside_the_runs_spread_is_noise_in_text_and_json_alike():
    # 8x's median is 20% over 64x's, but its runs (110-160) overlap 64x's (120-135): the spread makes it
    s = summarise([_run(100, 150, 120), _run(100, 110, 135), _run(100, 160, 125)])
    assert s["non_monotonic"] == [] and s["regime"].startswith("latency-bound")
    assert s["out_of_order_within_noise"] == [{"size": "8x", "costs_more_than": "64x", "us_per_call": [150, 125],
                                               "why": "inside the runs' ranges"}]
    text = summary_text(s)
    assert "not monotonic" not in text and "undecided" not in text
    assert text.splitlines()[-1] == "out of order, within the noise: 8x over 64x (inside the runs' ranges)"
    # the trial's 1x 265.36 against 8x 260.86: under 10%, said as noise, never as non-monotonic
    s = summarise([_run(265.36, 260.86, 270)])
    assert s["non_monotonic"] == [] and [x["why"] for x in s["out_of_order_within_noise"]] == ["within 10%"]
    assert summary_text(s).splitlines()[-1] == "out of order, within the noise: 1x over 8x (within 10%)"
    s = summarise([_run(100, 105, 120), _run(100, 104, 130)])  # in order: nothing said
    assert s["out_of_order_within_noise"] == [] and "out of order" not in summary_text(s)


@pytest.mark.parametrize("args, words", [
    (["--device", "cpu", "--spacer-in", "1024,1536"], "--spacer-in places GEMVs"),
    (["--device", "cpu", "--profile-kernels"], "--profile-kernels reads the NCCL kernels"),
    (["--device", "cpu", "--calls", "10"], "--calls sets the all-reduces per CUDA graph"),
    (["--device", "cpu", "--tp", "1"], "--tp 1: an all-reduce across one rank exchanges nothing"),
    (["--device", "cuda", "--tp", "1"], "--tp 1: an all-reduce across one rank exchanges nothing"),
])
def test_options_that_cannot_apply_are_refused_in_one_line(args, words):
    r = cli("allreduce", "--payload-bytes", 2048, *args)
    assert_one_line_error(r)
    assert words in r.stderr and r.stdout == ""
    if "cpu" in args and "--tp" not in args:
        assert "run on CPU (--device cpu)" in r.stderr


def test_the_text_summary_says_what_it_measured_first():
    """A CPU figure printed bare reads as a GPU's: the first line names the device, the ranks and the dtype."""
    from decodemon.monitor.cli.allreduce import summary_text

    s = {"device": "cpu", "tp": 2, "dtype": "float32", "method": "host clock around each synchronous gloo call",
         "sizes": {}, "repeats": 1, "ratio_64x": None, "regime": "one size", "non_monotonic": [],
         "out_of_order_within_noise": []}
    assert summary_text(s).splitlines()[0] == ("all-reduce on cpu, 2 ranks, float32 (host clock around each "
                                               "synchronous gloo call)")
