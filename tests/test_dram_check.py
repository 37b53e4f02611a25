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
