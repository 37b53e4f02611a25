"""A count wherever a rate is shown: every bundled H200 recording's summary gives, beside a non-null ms/token, the
number of tokens or GPU steps that rate was read over, and `record` names the clock beside the count."""

from __future__ import annotations

from pathlib import Path

import pytest

from decodemon.monitor.cli.record import counted
from decodemon.monitor.render import summary_json
from decodemon.monitor.sources.collect import collect_recording

ROOT = Path(__file__).resolve().parents[1]
RECORDINGS = sorted((ROOT / "tests" / "data").glob("*.dmon")) + sorted((ROOT / "monitor" / "data").glob("*.dmon"))


@pytest.mark.parametrize("rec", RECORDINGS, ids=lambda p: p.name)
def test_no_rate_stands_beside_a_zero_count(rec):
    snap = collect_recording(rec).snapshot()
    j = summary_json(snap)
    if j.get("ms_per_token") is not None:
        assert j["tokens"] and j["tokens"] > 0, (rec.name, j["token_clock"], j["tokens"])
        words = counted(snap)
        assert words.startswith(f"{j['tokens']} ") and (snap.token_clock or "no clock") in words
