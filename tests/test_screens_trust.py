"""The screens a newcomer distrusted, each at 200x50 and 80x24: no headline, pending line or history that its own
candidates contradict, and no two sources for GPU busy 1.5x apart without a flag on screen."""

from __future__ import annotations

import asyncio

import pytest

from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.player import RecordingPlayer
from decodemon.monitor.rolling import headline
from tests.conftest import DATA

SCREENS = {  # name: (recording, seconds into it)
    "tp2_rank0": (DATA / "h200_tp2_eager_samewindow_rank0.dmon", None),  # its end: "the source ended"
    "compiled_8b_at_3s": (DATA / "h200_compiled_llama8b_replays.dmon", 3.0),
    "hf_static": (DATA / "h200_hf_generate_static.dmon", None),
    "demo_eager": (DATA / "h200_eager.dmon", 10.0),
    "compiled_8b_nomarks": (DATA / "h200_compiled_llama8b_nomarks.dmon", None),
    "demo_graph": (DATA / "h200_graph.dmon", 10.0),  # kernels traced past the untraced step
    "serving_16": (DATA / "h200_hf_cb_16.dmon", 5.0),
    "tp2_eager_rank1": (DATA / "h200_tp2_eager_rank1.dmon", None),  # LAUNCH binds; PM and the kernels disagree
}


def _app(name: str) -> DecodemonApp:
    path, at = SCREENS[name]
    p = RecordingPlayer(str(path), name)
    return DecodemonApp([p], start_at_s=at if at is not None else p.end_ns / 1e9, paused=True, out_dir=".")


@pytest.mark.parametrize("name", sorted(SCREENS))
def test_the_headline_is_the_ceiling_its_candidates_support(name):
    asyncio.run(_headline(name))


async def _headline(name: str) -> None:
    from decodemon.monitor.widgets.verdict import VerdictPanel

    app = _app(name)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        s = app.players[0].snapshot()
        ceiling, _ = headline(s.diagnosis, s.rolling)
        states = {k: c.state for k, c in s.diagnosis.candidates.items()}
        if ceiling in states:
            assert states[ceiling] == "binding", (name, ceiling, states)
        elif ceiling == "unknown":
            assert "binding" not in states.values() or s.diagnosis.ceiling == "unknown", (name, states)
        assert not (all(v == "unknown" for v in states.values()) and ceiling not in ("unknown", "kernels"))
        text = app.query_one(VerdictPanel)._put_last.plain
        assert f"  {ceiling.upper()}  " in text.splitlines()[0]
        pm, share = s.pm.get("gpu_busy_pct") if s.pm else None, s.kernel_share_pct
        if pm and share and max(pm, share) / min(pm, share) > 1.5:  # two sources apart: said on screen
            from decodemon.monitor.widgets.timeline import TimelinePanel

            assert "apart" in app.query_one(TimelinePanel)._put_last.plain, name


@pytest.mark.parametrize("size", [(200, 50), (80, 24)], ids=["200x50", "80x24"])
@pytest.mark.parametrize("name", sorted(SCREENS))
def test_screen_snapshot(snap_compare, name, size):
    assert snap_compare(_app(name), terminal_size=size)


def test_the_gaps_and_kernels_add_up_to_the_token_they_were_read_in():
    """An eager window's gaps are read in its traced token, which tracing stretches past the loop's own token: --json
    names that token beside them, so the parts add up to a whole it shows (they need not add up to ms/token)."""
    import json

    from tests.conftest import cli

    j = json.loads(cli("replay", DATA / "h200_eager.dmon", "--json").stdout)
    parts = sum(j["gap_ms_per_token"].values()) + j["kernel_sum_ms_per_token"]
    assert parts == pytest.approx(j["traced_token_ms"], rel=0.01)
    assert j["traced_token_ms"] > j["ms_per_token"]
    assert "gap_traced_ms_per_token" not in j and "stretches" in j["gap_note"]  # one figure, named for what it is
