"""Bytes per token times tokens a second, held against PM's DRAM throughput (its share of the device's peak): two
counters and the token clock that should tell one rate, checked on real H200 recordings."""

from __future__ import annotations

from decodemon.monitor.render import summary_json
from decodemon.monitor.sources.collect import collect
from tests.conftest import DATA


def test_bytes_per_token_times_the_rate_is_held_against_pms_dram_share_on_real_recordings():
    """Two counters and the token clock that should tell one DRAM rate: on the compiled 8B loop's replay count they
    agree; on its run read by the GPU's steps in traced windows (the loop idles between generations, which PM's
    average holds and the steps do not) they are 55% apart, and the summary says so."""
    agree = summary_json(collect(DATA / "h200_compiled_llama8b_replays.dmon").snapshot())["dram_check"]
    assert abs(agree["off_pct"]) < 1 and agree["apart"] is None
    apart = summary_json(collect(DATA / "h200_compiled_llama8b_nomarks.dmon").snapshot())["dram_check"]
    assert apart["off_pct"] > 10 and "GPU idle between bursts or generations" in apart["apart"]


def test_the_pm_side_of_the_check_is_recomputed_from_the_json_alone():
    """PM's side is dram_pct × the peak it is a share of, and that peak is in the JSON (the H100's NVML peak, not the
    measured copy the floor divides by), so the product holds by hand to dram_pct's rounding."""
    j = summary_json(collect(DATA.parent.parent / "monitor" / "data" / "h100_graph.dmon").snapshot())
    c = j["dram_check"]
    assert c["peak_gbs"] != j["bandwidth_gbs"]  # not the floor's bandwidth: the spec PM's share is of
    assert abs(j["dram_pct"] / 100 * c["peak_gbs"] - c["pm_dram_pct_x_peak_gbs"]) <= 0.0005 * c["peak_gbs"] + 0.1
    assert "dram_pct × peak_gbs" in c["of"]
