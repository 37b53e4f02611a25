"""`--json` on the committed recordings: each key holds one figure (kernels are not launches), each candidate says
which quantity its `value` is, and a figure that was not measured is null, one way, everywhere in the summary."""

from __future__ import annotations

import json
from functools import cache

import pytest

from decodemon.monitor.ceilings import QUANTITIES
from tests.conftest import DATA, cli

EAGER, GRAPH = DATA / "h200_eager.dmon", DATA / "h200_graph.dmon"
# one of each shape: eager and graphed with PM, grids from counters alone, no token clock, a batched engine whose
# windows traced no launch calls, a rank of a TP=2 loop, and nothing priced at all
SHAPES = (EAGER, GRAPH, DATA / "h200_compiled_llama8b_enqueue_1.dmon", DATA / "h200_cuda_loop_8gib.dmon",
          DATA / "h200_hf_cb_4.dmon", DATA / "h200_tp2_eager_rank0.dmon", DATA / "h200_compiled_llama8b_marks_5.dmon")


@cache
def summary(path) -> dict:
    """`decodemon replay PATH --json`, read with NaN and infinity refused (they are not JSON's null)."""
    r = cli("replay", path, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{path.name}: {c} in the JSON"))


def test_kernels_per_token_counts_kernels_and_launch_calls_count_the_hosts_calls():
    eager, graph = summary(EAGER), summary(GRAPH)
    for j in (eager, graph, eager["rolling_5s"], graph["rolling_5s"]):
        assert "launches_per_token" not in j  # it held kernels: one replayed graph launch read as ~1,860 launches
        assert j["kernels_per_token"] > 1800
    # graphed: ~1,864 kernels a token, started by one graph launch and no kernel launch call
    assert graph["graph_launches_per_token"] == 1.0 and graph["kernel_launch_calls_per_token"] == 0
    assert graph["host_launch_calls_per_token"] == 1.0 == graph["rolling_5s"]["host_launch_calls_per_token"]
    # eager: every kernel is one host launch call, the runtime's or (cuBLAS's) the driver's; the runtime's own
    # count is named apart
    assert eager["graph_launches_per_token"] == 0
    assert eager["host_launch_calls_per_token"] == eager["kernel_launch_calls_per_token"] == eager["kernels_per_token"]
    assert eager["runtime_launch_calls_per_token"] == 1638 and graph["runtime_launch_calls_per_token"] == 0
    c = json.loads(cli("compare", EAGER, GRAPH, "--json").stdout)
    assert c["b_over_a"]["host_launch_calls_per_token"] == round(1.0 / eager["host_launch_calls_per_token"], 4)
    assert c["b_over_a"]["kernels_per_token"] == pytest.approx(1.0, abs=0.01)


def test_each_candidate_names_the_quantity_its_value_holds():
    seen = {}
    for path in SHAPES:
        for name, c in summary(path)["candidates"].items():
            assert c["quantity"] in QUANTITIES, (path.name, name, c)
            # one quantity is read in one unit, whichever recording priced it
            assert seen.setdefault(c["quantity"], c["unit"]) == c["unit"], (path.name, name)
    occupancy = {p.name: summary(p)["candidates"]["occupancy"]["quantity"] for p in (EAGER, SHAPES[2])}
    # grids from a traced window on the demo; SM active over GPU busy where no window traced grids: two figures
    assert occupancy == {"h200_eager.dmon": "small_grid_kernel_time_pct",
                         "h200_compiled_llama8b_enqueue_1.dmon": "sm_active_pct_of_gpu_busy"}
    assert summary(SHAPES[3])["candidates"]["bandwidth"]["quantity"] == "bandwidth_over_dram_gbs"
    assert summary(EAGER)["candidates"]["bandwidth"]["quantity"] == "ms_per_token_over_floor"
    assert {summary(p)["candidates"]["launch"]["quantity"] for p in (EAGER, GRAPH)} == {"idle_pct_of_step"}


def _values(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _values(v, f"{path}.{k}")
    elif isinstance(x, list):
        for v in x:
            yield from _values(v, f"{path}[]")
    else:
        yield path, x


def test_a_figure_not_measured_is_null_and_every_key_is_always_there():
    for path in SHAPES:
        for where, v in _values(summary(path)):
            assert not (isinstance(v, str) and v.strip() in ("", "-", "—", "n/a", "N/A", "nan")), (path.name, where)
            assert not (isinstance(v, str) and v.startswith("n/a")), (path.name, where, v)
    # the same keys whatever the source measured: the top level (the diagnosis's and a batched engine's among
    # them), each candidate, the collectives, the idle's causes and the observer's cost
    parts = {"top": lambda j: j, "candidate": lambda j: j["candidates"]["launch"],
             "collectives": lambda j: j["collectives"], "gaps": lambda j: j["gap_ms_per_token"],
             "observer": lambda j: j["observer_cost"], "rolling": lambda j: j["rolling_5s"]}
    for name, part in parts.items():
        sets = {tuple(sorted(part(summary(p)))) for p in SHAPES if part(summary(p)) is not None}
        assert len(sets) == 1, (name, [set(a) ^ set(b) for a in sets for b in sets if a != b][:1])


def test_zero_is_a_measured_zero_and_what_was_not_measured_is_null():
    no_clock = summary(DATA / "h200_cuda_loop_8gib.dmon")
    assert no_clock["token_clock"] is None and no_clock["tokens"] is None  # no clock counted no token: not 0
    nothing = summary(DATA / "h200_compiled_llama8b_marks_5.dmon")
    assert nothing["ceiling"] == "unknown" and nothing["predicted_win"] is None and nothing["falsify"] is None
    assert nothing["remedy"].startswith("measure ")  # what would decide, said once, in words
    assert nothing["bandwidth_floor_ms"] is None and nothing["us_per_kernel"] is None
    # windows that traced no launch calls cannot tell a host launching late: host_late is null, the rest unsplit
    batched = summary(DATA / "h200_hf_cb_4.dmon")
    assert batched["gap_ms_per_token"]["host_late"] is None and batched["gap_ms_per_token"]["unsplit"] > 0
    assert batched["tokens_per_step"] and batched["steps"] > 0 and batched["ended"]
    # a window that traced them split every gap: 0 unsplit is measured, and host_late is a figure
    eager = summary(EAGER)
    assert eager["gap_ms_per_token"]["unsplit"] == 0 and eager["gap_ms_per_token"]["host_late"] > 10
    assert eager["tokens_per_step"] is None and eager["steps"] is None and eager["serial_fraction"] is None


def test_a_batched_engines_candidates_speak_of_steps_as_its_screen_does():
    """A batched engine's marks are steps: the diagnosis prices one, and the JSON's words name it a step's (its
    bandwidth ceiling is steps a second, not tokens)."""
    j = summary(DATA / "h200_hf_cb_16.dmon")
    assert j["tokens_per_step"] and j["tokens_per_step"] > 1
    detail = j["candidates"]["bandwidth"]["detail"]
    assert "steps/s ceiling" in detail and "ms/step" in detail
    assert not any("tok/s ceiling" in c["detail"] or "ms/token" in c["detail"] for c in j["candidates"].values())


def test_compare_of_two_batched_engines_gives_the_throughput_ratio_and_says_tokens_per_s_counts_steps():
    """hf_cb at 1 and 16 requests in flight: steps a second fall while every request's tokens a second rise
    ~8.8x; the ratio of the throughput is there, and tokens_per_s's ratio says it counts the clock's marks."""
    c = json.loads(cli("compare", DATA / "h200_hf_cb_1.dmon", DATA / "h200_hf_cb_16.dmon", "--json").stdout)
    a, b = c["a"], c["b"]
    assert c["b_over_a"]["throughput_tokens_per_s"] == round(b["throughput_tokens_per_s"] / a["throughput_tokens_per_s"], 4)
    assert c["b_over_a"]["throughput_tokens_per_s"] > 5 and c["b_over_a"]["tokens_per_s"] < 1
    assert "a batched engine's steps" in c["b_over_a_of"]["tokens_per_s"]
    assert "DRAM bytes (read + write)" in c["b_over_a_of"]["bytes_per_token"]
