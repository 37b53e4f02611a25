"""H200 recordings of eager loops that mark nothing, started with plain python3 and attached by pid: the step
starts are their clock, over ≥ 200 steps, against the loop's own per-token clock (tests/data/h200_unmarked.json)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import DATA, cli

FACTS = json.loads((DATA / "h200_unmarked.json").read_text())["records"]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_an_unmarked_eager_loop_is_timed_by_its_steps_within_5_percent_of_its_own_clock(name):
    # own_ms_per_token is the loop's own over the seconds the rolling clock covered: the last 5 s (--last 5)
    r = cli("replay", DATA / name, "--json", "--last", 5, timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["token_clock"] == "step_starts" and j["clock_steps"] >= 200 and j["clock_provisional"] is False
    assert j["ms_per_token"] == pytest.approx(FACTS[name]["own_ms_per_token"], rel=0.05)
    assert j["ms_per_token_p90"] <= j["ms_per_token_p99"] and j["ms_per_token"] <= j["ms_per_token_p90"]
    # the count costs the loop what its hook costs a step, well under 1% of it
    assert 0 < j["observer_cost"]["step_count_pct"] < 0.1
    assert j["verdict"] == "launch" and j["candidates"]["launch"]["state"] == "binding"  # host-bound eager loops
