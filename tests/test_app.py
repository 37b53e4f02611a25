"""The Textual app on the committed recordings: snapshots at fixed points in time, and the keys."""

from __future__ import annotations

import asyncio

from decodemon.monitor.app import DecodemonApp, HelpScreen
from decodemon.monitor.player import RecordingPlayer
from decodemon.monitor.widgets.kernels import KernelsPanel
from decodemon.monitor.widgets.timeline import TimelinePanel
from tests.conftest import REC


def make_app(names, at=10.0, out_dir="."):
    labels = {"eager": "eager (H200)", "graph": "graph (H200)"}
    players = [RecordingPlayer(str(REC[n]), labels.get(n, n)) for n in names]
    return DecodemonApp(players, start_at_s=at, paused=True, out_dir=str(out_dir))


def test_main_screen_graph_snapshot(snap_compare):
    assert snap_compare(make_app(["graph"]), terminal_size=(120, 50))


def test_compare_screen_snapshot(snap_compare):
    assert snap_compare(make_app(["eager", "graph"]), terminal_size=(160, 50))


def test_main_screen_eager_80x24_snapshot(snap_compare):
    assert snap_compare(make_app(["eager"]), terminal_size=(80, 24))


def test_keys(tmp_path):
    asyncio.run(_keys(tmp_path))


async def _keys(tmp_path):
    app = make_app(["eager", "graph"], out_dir=tmp_path)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)

        await pilot.press("plus")
        assert all(t.zoom == 2 for t in app.query(TimelinePanel))
        await pilot.press("minus")
        assert all(t.zoom == 1 for t in app.query(TimelinePanel))

        before = app.players[0].clock_ns
        await pilot.press("right")
        assert app.players[0].clock_ns == before + 5_000_000_000
        await pilot.press("left")
        assert app.players[0].clock_ns == before

        await pilot.press("right_square_bracket")
        assert app.players[0].speed == 2.0

        table = app.query(KernelsPanel).first()
        table.focus()
        await pilot.press("k")
        assert table.sort == "idle SMs"

        await pilot.press("d")
        assert "OCCUPANCY" in (tmp_path / "DIAGNOSIS-2.md").read_text()
        assert "LAUNCH" in (tmp_path / "DIAGNOSIS-1.md").read_text()

        await pilot.press("s")
        assert list(tmp_path.glob("*.svg"))

        await pilot.press("space")  # paused replay starts playing
        assert not app.frozen and app.players[0].paused is False
        await pilot.press("space")
        assert app.frozen and app.players[0].paused
        await pilot.press("q")
    assert app.return_code in (0, None)


def test_a_newer_snapshot_replaces_a_queued_one():
    from decodemon.monitor.app import SnapshotReady

    a, b, other = SnapshotReady(0, "old", ""), SnapshotReady(0, "new", ""), SnapshotReady(1, "x", "")
    assert a.can_replace(b) and not a.can_replace(other)


def test_probe_notes_reach_the_screen():
    asyncio.run(_probe_notes())


async def _probe_notes():
    from decodemon.monitor.widgets.telemetry import TelemetryPanel
    from decodemon.probes import wire
    from decodemon.probes.agent import PM_FIRST_SESSION_NOTE

    app = make_app(["graph"])
    async with app.run_test(size=(160, 50)):
        p = app.players[0]
        p.session.add(p.clock_ns, wire.Stats(state={"pm_note": PM_FIRST_SESSION_NOTE,
                                                    "trace_paused": "torch.profiler is recording in the target",
                                                    "window_budget": "500 windows reached: one window every 60 s"}))
        app._apply_all()
        tele = app.query(TelemetryPanel).first()._put_last.plain
        line = app.query(TimelinePanel).first()._put_last.plain
        assert "left a graphed loop ~13% faster" in tele
        assert "windows paused: torch.profiler is recording" in line
        assert "window budget: 500 windows reached" in line


def test_lost_pm_samples_reach_the_screen_before_the_first_session_note():
    asyncio.run(_pm_lost())


async def _pm_lost():
    from decodemon.monitor.widgets.telemetry import TelemetryPanel
    from decodemon.probes import agent, wire

    pm = type("Pm", (), {"full_pumps": 4, "overflows": 0, "max_samples": 1024, "interval_us": 200})()
    app = make_app(["graph"])
    async with app.run_test(size=(160, 50)):
        p = app.players[0]
        p.session.add(p.clock_ns, wire.Stats(state={"pm_note": agent.PM_FIRST_SESSION_NOTE,
                                                    "pm_lost": agent.pm_lost(pm)}))
        app._apply_all()
        tele = app.query(TelemetryPanel).first()._put_last.plain
        assert "PM samples lost: 4 pumps found more samples than their 1024-sample image holds" in tele
        assert "--pm-interval-us" in tele and "~13% faster" not in tele


def test_group_of_ranks_shows_the_all_reduce_and_who_the_others_wait_for():
    asyncio.run(_group())


async def _group():
    from pathlib import Path

    from decodemon.monitor.app import GroupBar
    from decodemon.monitor.widgets.collectives import CollectivesPanel

    data = Path(__file__).parent / "data"
    players = [RecordingPlayer(str(data / f"h200_tp2_graph_rank{r}.dmon"), f"rank {r}") for r in (0, 1)]
    app = DecodemonApp(players, start_at_s=60.0, paused=True, group=True)  # past the end: the whole recording
    async with app.run_test(size=(200, 50)):
        bar = app.query_one(GroupBar)
        g = bar.group
        assert g["tp"] == 2 and g["last_to_arrive_rank"] == 0
        text = str(bar.render())
        assert f"all-reduce {g['collective_us_per_call']:.1f} µs/call" in text and "× 56/token" in text
        assert "the others wait for rank 0" in text
        assert "rank 0 OCCUPANCY, rank 1 OCCUPANCY" in text
        panels = [p._put_last.plain for p in app.query(CollectivesPanel)]
        assert len(panels) == 2 and all("56 calls/token" in t and "launch gap" in t for t in panels)


def test_the_timeline_draws_the_last_token_whose_launch_calls_were_traced():
    asyncio.run(_kernels_only_timeline())


async def _kernels_only_timeline():
    from decodemon.monitor.widgets.launches import LaunchesPanel

    # h200_eager_api2.dmon: windows 1.46 (launch calls traced), 2.45 (kernels only), 3.47 (traced) s in
    for at, title in ((3.0, "timeline · latest token with its launch calls traced, 2 s ago"),
                      (4.2, "timeline · latest traced token")):
        app = DecodemonApp([RecordingPlayer(str(REC["eager_api2"]), "eager")], start_at_s=at, paused=True,
                           out_dir=".")
        async with app.run_test(size=(120, 50)) as pilot:
            await pilot.pause()
            assert app.query(TimelinePanel).first().border_title == title
            text = str(app.query(LaunchesPanel).first().content)
            assert "1638 kernel launch calls" in text
            assert ("launch calls: traced 2 s ago" in text) is (at == 3.0)


def test_the_screen_refresh_is_the_users_and_defaults_to_half_a_second(monkeypatch):
    """`--refresh S` reaches the app (None: the app's REFRESH_S, 0.5 s since the app's CPU was measured beside an
    eager decode thread); the CLI's help names the same default."""
    from decodemon.monitor import app as app_mod
    from decodemon.monitor.cli import build_parser

    assert app_mod.REFRESH_S == 0.5
    for argv in (["attach", "123"], ["replay", "x.dmon"], ["compare", "a", "b"], ["demo"]):
        assert build_parser().parse_args(argv).refresh is None
        assert build_parser().parse_args(argv + ["--refresh", "2"]).refresh == 2.0
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "attach" in a.choices)
    assert "default 0.5" in sub.choices["attach"].format_help().replace("\n", " ")
    assert make_app(["graph"]).refresh_s == app_mod.REFRESH_S
    seen = []
    monkeypatch.setattr(app_mod.DecodemonApp, "run", lambda self: seen.append(self.refresh_s))
    app_mod.run_app([str(REC["graph"])], refresh_s=2.0)
    app_mod.run_app([str(REC["graph"])])
    assert seen == [2.0, app_mod.REFRESH_S]
