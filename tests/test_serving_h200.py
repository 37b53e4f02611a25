"""transformers' continuous batching on the H200 at 1, 4 and 16 requests in flight, recorded by pid and replayed
here against the engine's own per-request token stamps over the same seconds (tests/data/h200_hf_cb.json)."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor.api import replay
from tests.conftest import DATA

FACTS = json.loads((DATA / "h200_hf_cb.json").read_text())["own"]


@pytest.mark.parametrize("name", sorted(FACTS))
def test_a_batched_engine_is_read_per_step_against_its_own_stamps(name):
    own = FACTS[name]
    j = replay(DATA / name).as_json()
    assert j["tokens_per_step"] == own["in_flight"]  # a step makes one token of every request in flight
    assert j["ms_per_token"] == pytest.approx(own["step_ms"], rel=0.05)  # the step, each request's token gap
    assert j["throughput_tokens_per_s"] == pytest.approx(own["tokens_per_s"], rel=0.05)
    assert j["tokens"] == pytest.approx(j["steps"] * own["in_flight"], rel=0.05)
    # the clock's marks are steps, and the JSON says so beside its per-step rate
    assert j["clock_unit"] == "step" and "name them as the step's" in j["ms_per_token_note"]
    assert j["ms_per_step"] == j["ms_per_token"] and j["steps_per_s"] == j["tokens_per_s"]
    assert j["tokens_per_s"] * j["tokens_per_step"] == pytest.approx(j["throughput_tokens_per_s"], rel=0.1)


@pytest.mark.parametrize("name", sorted(FACTS))
def test_each_batch_gets_a_verdict_with_its_numbers(name):
    """The eager Qwen3-0.6B step is host-bound at every batch: LAUNCH, with every candidate priced on the step."""
    j = replay(DATA / name).as_json()
    assert j["verdict"] == "launch"
    c = j["candidates"]
    assert c["launch"]["value"] > 0 and c["bandwidth"]["value"] > 10 and c["launch"]["state"] == "binding"
    assert j["kernels_per_token"] > 1000  # a step's launches, not a token's share of them
