"""No headline over a candidate that does not bind: every bundled recording and every recording under tests/,
replayed, gives a verdict that is "unknown" or the name of a candidate whose state is "binding" — in the JSON
summary, the Markdown report and the exporter's verdict label alike (one rule: diagnosis.verdict)."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodemon.monitor.diagnosis import BINDING, ORDER, verdict
from decodemon.monitor.render import summary_json
from decodemon.monitor.sources.collect import collect

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted([*ROOT.glob("monitor/data/*.dmon"), *ROOT.glob("tests/data/**/*.dmon")])


@pytest.mark.parametrize("path", RECORDINGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_headline_of_every_recording_stands_over_a_binding_candidate(path):
    snap = collect(path).snapshot()
    j = summary_json(snap)
    assert j["verdict"] in (*ORDER, "unknown")
    if j["verdict"] != "unknown":
        assert j["candidates"][j["verdict"]]["state"] == BINDING, (j["verdict"], j["candidates"])
    assert j["ceiling"] == verdict(snap.diagnosis.candidates) == j["verdict"]
    # a headline the recorded history does not end on is explained by the pending line, history or none
    last = snap.rolling.history[-1].after if snap.rolling.history else "unknown"
    if j["verdict"] not in ("unknown", last):
        assert j["verdict_pending"], j
        assert ("history is empty" in j["verdict_pending"]) == (not j["history"]), j


def test_recordings_were_found():
    assert len(RECORDINGS) >= 30

