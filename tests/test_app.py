"""The Textual app on the committed recordings: snapshots at fixed points in time, and the keys."""

from __future__ import annotations

import asyncio
from pathlib import Path

from decodemon.monitor.app import DecodemonApp, HelpScreen
from decodemon.monitor.player import RecordingPlayer
from decodemon.monitor.widgets.kernels import KernelsPanel
from decodemon.monitor.widgets.status_bar import StatusBar, status_line
from decodemon.monitor.widgets.timeline import TimelinePanel
from tests.conftest import DATA, REC


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


def test_help_defines_every_column_and_scrolls_at_80x24_snapshot(snap_compare):
    assert snap_compare(make_app(["eager"]), press=["question_mark"], terminal_size=(80, 24))


def test_the_help_names_every_kernel_column():
    from decodemon.monitor.widgets.help_screen import HELP

    from decodemon.monitor.widgets.kernels import COLUMNS

    for col in COLUMNS:
        assert f"\n  {col} " in HELP


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

        await pilot.press("space")  # paused replay starts playing
        assert not app.frozen and app.players[0].paused is False
        await pilot.press("space")
        assert app.frozen and app.players[0].paused
        bar = app.query_one(StatusBar)
        assert "paused" in status_line(bar.states) and "FROZEN" not in status_line(bar.states)  # as help says
        await pilot.press("q")
    assert app.return_code in (0, None)


def test_k_sorts_the_kernels_of_every_source_with_no_panel_focused():
    asyncio.run(_k_without_focus())


async def _k_without_focus():
    app = make_app(["eager", "graph"])
    async with app.run_test(size=(160, 50)) as pilot:
        assert app.focused is None
        tables = list(app.query(KernelsPanel))
        await pilot.press("k")
        assert [t.sort for t in tables] == ["idle SMs", "idle SMs"]
        assert all("sorted by time × idle SMs" in str(t.border_title) for t in tables)
        await pilot.press("tab", "k")  # and with a panel focused
        assert [t.sort for t in tables] == ["calls", "calls"]


def test_the_kernel_table_shows_every_column_whole_at_80_columns():
    asyncio.run(_kernels_fit())


async def _kernels_fit():
    from decodemon.monitor.widgets.kernels import COLUMNS

    app = make_app(["eager"])
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one(KernelsPanel)
        for maximised in (False, True):
            if maximised:
                table.focus()
                await pilot.press("z")
                await pilot.pause()
                assert app.screen.maximized is table
            assert table.row_count == 12
            assert [str(c.label) for c in table.ordered_columns] == list(COLUMNS)
            assert sum(c.get_render_width(table) for c in table.ordered_columns) <= table.size.width, maximised
            assert table.max_scroll_x == 0, maximised  # no horizontal scrollbar: nothing is cut off
            assert {table.get_row_at(i)[-1] for i in range(table.row_count)} >= {"100%", "19%"}


def test_the_launch_history_bar_is_labelled():
    asyncio.run(_launch_bar())


async def _launch_bar():
    from decodemon.monitor.widgets.launches import LaunchesPanel

    app = make_app(["eager"])
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        lines = app.query_one(LaunchesPanel)._put_last.plain.splitlines()
        bar = next(i for i, line in enumerate(lines) if line and set(line) <= set(" ▁▂▃▄▅▆▇█"))
        assert lines[bar - 1] == "kernels/token per traced window:"


def test_the_arrows_seek_whichever_panel_has_focus():
    asyncio.run(_seek_with_focus())


async def _seek_with_focus():
    app = make_app(["eager", "graph"], at=2.0)
    async with app.run_test(size=(160, 50)) as pilot:
        focused = set()
        for _ in range(12):  # every panel of both sides, the kernel tables among them
            await pilot.press("tab")
            focused.add(type(app.focused).__name__)
            before = app.players[0].clock_ns
            await pilot.press("right")
            assert app.players[0].clock_ns == before + 5_000_000_000, type(app.focused).__name__
            await pilot.press("left")
            assert app.players[0].clock_ns == before
        assert {"KernelsPanel", "VerdictPanel", "TimelinePanel"} <= focused


def test_the_focused_panel_has_a_border_no_other_panel_has():
    asyncio.run(_focus_visible())


async def _focus_visible():
    from decodemon.monitor.widgets.source_pane import SourcePane

    app = make_app(["eager", "graph"])
    async with app.run_test(size=(160, 50)) as pilot:
        for _ in range(6):
            await pilot.press("tab")
            assert app.focused.styles.border_top[0] == "double", type(app.focused).__name__
            panels = [w for pane in app.query(SourcePane) for w in pane.walk_children() if w.styles.border_top[0]]
            looks = [(w.styles.border_top, w.styles.border_title_color) for w in panels]
            focused = (app.focused.styles.border_top, app.focused.styles.border_title_color)
            assert app.focused in panels and looks.count(focused) == 1, type(app.focused).__name__


def test_the_focused_panel_stands_out_snapshot(snap_compare):
    assert snap_compare(make_app(["eager"]), press=["tab"], terminal_size=(80, 24))


def test_a_maximised_panel_names_its_source_and_side():
    asyncio.run(_maximised())


async def _maximised():
    app = make_app(["eager", "graph"])
    said = []
    app.notify = lambda message, **kw: said.append(message)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("z")  # nothing focused: nothing to maximise, and the app says what to do
        assert app.screen.maximized is None and said == ["tab to a panel first: z maximises the focused one"]
        await pilot.press(*["tab"] * 11, "z")  # the right side's kernel table
        shown = app.screen.maximized
        assert isinstance(shown, KernelsPanel) and shown is app.focused
        assert shown.border_subtitle == "source: graph (H200) (right) · escape restores"
        await pilot.press("escape")
        assert app.screen.maximized is None and not shown.border_subtitle
        await pilot.press("shift+tab", "z")
        assert "graph (H200) (right)" in app.screen.maximized.border_subtitle


def test_a_maximised_panel_names_its_source_snapshot(snap_compare):
    assert snap_compare(make_app(["eager", "graph"]), press=["tab"] * 11 + ["z"], terminal_size=(120, 30))


def test_s_and_d_name_their_files_after_the_sources_and_say_the_full_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    asyncio.run(_files(tmp_path))


async def _files(tmp_path):
    app = make_app(["eager", "graph"], out_dir="out")  # relative: the notice still says where, in full
    said = []
    app.notify = lambda message, **kw: said.append((message, kw.get("severity", "information")))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("d")
        out = tmp_path / "out"
        assert "LAUNCH" in (out / "DIAGNOSIS-eager-H200.md").read_text()
        assert "OCCUPANCY" in (out / "DIAGNOSIS-graph-H200.md").read_text()
        assert said[-1] == (f"wrote {out / 'DIAGNOSIS-eager-H200.md'} (of eager (H200)); "
                            f"{out / 'DIAGNOSIS-graph-H200.md'} (of graph (H200))", "information")

        await pilot.press("s")
        (svg,) = out.glob("*.svg")
        assert svg.name.startswith("decodemon-eager-H200-vs-graph-H200-")
        assert said[-1] == (f"saved {svg}", "information")

        await pilot.press("tab", "z", "s")  # the left verdict alone: the file names that side only
        assert any(p.name.startswith("decodemon-eager-H200-2") for p in out.glob("*.svg"))

        app.out_dir = tmp_path / "missing"
        await pilot.press("d")
        assert said[-1][1] == "error" and str(tmp_path / "missing" / "DIAGNOSIS-eager-H200.md") in said[-1][0]


def test_source_slugs_are_file_names_and_distinct():
    from decodemon.monitor.app import source_slugs

    assert source_slugs(["eager (H200)", "/x/y/h200_graph.dmon", "pid 4242", "///"]) == [
        "eager-H200", "h200_graph", "pid-4242", "source"]
    assert source_slugs(["a.dmon", "other/a.dmon"]) == ["a-1", "a-2"]


def test_a_newer_snapshot_replaces_a_queued_one():
    from decodemon.monitor.app import SnapshotReady

    a, b, other = SnapshotReady(0, "old", ""), SnapshotReady(0, "new", ""), SnapshotReady(1, "x", "")
    assert a.can_replace(b) and not a.can_replace(other)


def test_probe_notes_reach_the_screen():
    asyncio.run(_probe_notes())


async def _probe_notes():
    from decodemon.monitor.widgets.telemetry import TelemetryPanel
    from decodemon.probes import wire
    from decodemon.monitor.probe_status import PM_FIRST_SESSION_NOTE

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
    from decodemon.monitor import probe_status
    from decodemon.probes import wire

    pm = type("Pm", (), {"full_pumps": 4, "overflows": 0, "max_samples": 1024, "interval_us": 200})()
    app = make_app(["graph"])
    async with app.run_test(size=(160, 50)):
        p = app.players[0]
        p.session.add(p.clock_ns, wire.Stats(state={"pm_note": probe_status.PM_FIRST_SESSION_NOTE,
                                                    "pm_lost": probe_status.pm_lost_of(pm)}))
        app._apply_all()
        tele = app.query(TelemetryPanel).first()._put_last.plain
        assert "PM samples lost: 4 pumps found more samples than their 1024-sample image holds" in tele
        assert "--probe pm_interval_us=N" in tele and "~13% faster" not in tele


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
        assert "the others wait for rank 0 (0.19 µs/call)" in text  # rank 1's kernels 5.23 µs against 5.04
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
            assert "1863 kernel launch calls (1638 through the runtime, 225 through the driver" in text
            assert ("the runtime's calls traced 2 s ago" in text) is (at == 3.0)


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


NO_LIBCUDA = "CUDA driver is not found (libcuda.so.1: cannot open shared object file: No such file or directory)"


def engine_frames(gpu=None, trace="unavailable (no GPU)", tokens=200):
    """What the agent of a decode loop sends before its first traced window: hello, its state, token marks."""
    from decodemon.probes import wire

    hello = wire.Hello(wire_version=wire.WIRE_VERSION, pid=4242, argv=["engine"], python="3.11", hostname="host",
                       gpu=gpu, gpu_unavailable="" if gpu else NO_LIBCUDA)
    state = {"token_clock": "armed", "trace": trace, "pm": "unavailable (no GPU)", "nvml": "unavailable (no GPU)"}
    if gpu is None:
        state["gpu"] = f"unavailable ({NO_LIBCUDA})"
    marks = wire.TokenMarks(t_ns=wire.Column.of([i * 431_000 for i in range(tokens)]),
                            depth=wire.Column.of(list(range(tokens))))
    return [(1_000_000, hello), (2_000_000, wire.Stats(state=state)), (100_000_000, marks)]


def live_app(monkeypatch, frames, ended: str | None = None):
    """The app on a LivePlayer whose attach yields `frames`, then ends with `ended` (else stays until detached)."""
    import time

    from decodemon.monitor import player
    from decodemon.probes import wire

    def fake_live_frames(pid, settings=None, stop=None):
        for rx, frame in frames:
            yield rx, b"", frame
        if ended:
            yield 200_000_000, b"", wire.Bye(reason=ended)
            return
        while not stop():
            time.sleep(0.01)

    monkeypatch.setattr(player, "live_frames", fake_live_frames)
    return DecodemonApp([player.LivePlayer(4242)], refresh_s=3600)


async def settle(app, pilot):
    """Wait for the live player to take every frame, then draw."""
    p = app.players[0]
    for _ in range(200):
        if p.session.feed.tokens_seen and (not p.thread.is_alive() or p.session.feed.state):
            break
        await asyncio.sleep(0.01)
    p.thread.join(timeout=0.2)
    app._apply_all()
    await pilot.pause()


def test_a_cpu_only_engine_says_no_gpu_and_what_is_still_measured(monkeypatch):
    asyncio.run(_cpu_only(monkeypatch))


async def _cpu_only(monkeypatch):
    from decodemon.monitor.widgets.header import HeaderPanel
    from decodemon.monitor.widgets.launches import LaunchesPanel
    from decodemon.monitor.widgets.verdict import VerdictPanel

    app = live_app(monkeypatch, engine_frames())
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(app, pilot)
        header = app.query_one(HeaderPanel)._put_last.plain
        verdict = app.query_one(VerdictPanel)._put_last.plain
        assert "no GPU (CPU-only engine: no CUDA driver in the process)" in header
        assert "libcuda" not in header and "unavailable" not in header
        assert "no traced windows: no GPU in the target" in verdict and "waiting" not in verdict
        assert ("still measured: 199 tokens timed in the last 0.1 s at 0.431 ms/token median (the engine's clock)"
                in verdict)
        assert "(199 tokens timed, mark_token)" in header  # one count on every panel
        assert "remedy: none to measure on the GPU" in verdict and "traced window" not in verdict.split("remedy")[1]
        assert "no GPU in the target" in app.query_one(LaunchesPanel)._put_last.plain


def test_a_cpu_only_engine_screen_snapshot(snap_compare, monkeypatch):
    app = live_app(monkeypatch, engine_frames())

    async def run_before(pilot):
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_tracing_unavailable_on_a_gpu_says_why_and_what_is_still_measured(monkeypatch):
    asyncio.run(_no_tracer(monkeypatch))


async def _no_tracer(monkeypatch):
    from decodemon.monitor.widgets.header import HeaderPanel
    from decodemon.monitor.widgets.verdict import VerdictPanel
    from decodemon.probes import wire

    gpu = wire.GpuInfo(index=0, name="NVIDIA H200", sm_count=132, mem_bandwidth_gbs=4800.0, cc="9.0")
    app = live_app(monkeypatch, engine_frames(gpu=gpu, trace="unavailable (ImportError: no module named cupti)"))
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(app, pilot)
        verdict = app.query_one(VerdictPanel)._put_last.plain
        assert "no traced windows: tracing is unavailable: ImportError: no module named cupti" in verdict
        assert "still measured: 199 tokens timed" in verdict
        assert "NVIDIA H200  132 SMs" in app.query_one(HeaderPanel)._put_last.plain


def test_the_status_bar_says_how_a_live_source_ended(monkeypatch):
    asyncio.run(_ended(monkeypatch))


async def _ended(monkeypatch):
    app = live_app(monkeypatch, engine_frames(), ended="pid 4242 went away")
    async with app.run_test(size=(120, 50)) as pilot:
        await settle(app, pilot)
        assert app.players[0].status() == "ended: pid 4242 went away"
        from decodemon.monitor.widgets.status_bar import StatusBar

        line = str(app.query_one(StatusBar).render())
        assert line == "pid 4242: ended: pid 4242 went away" and "live" not in line


def test_a_replay_at_its_end_says_so():
    p = RecordingPlayer(str(REC["graph"]), "graph")
    p.seek(p.end_ns)
    assert p.status().endswith("end of recording")
    p.seek(0)
    assert "end of recording" not in p.status()


def test_positions_in_a_recordings_last_milliseconds_that_show_different_figures_read_apart():
    """The eager recording's last frames come within a millisecond (a batch of marks at 8.0115 s, PM's last samples
    and the bye at 8.0124 s), each moving the figures: a position there is told to 0.1 ms, not read as 8.01/8.01."""
    p = RecordingPlayer(str(Path(__file__).parent.parent / "monitor" / "data" / "h100_eager.dmon"), "eager")
    p.paused = True
    seen = {}
    for t in (8_010_000_000, 8_012_000_000, p.end_ns - 1):
        p.seek(t)
        s = p.snapshot()
        seen[p.status()] = (s.tokens.tokens, round(s.tokens.ms_per_token, 3))
    assert len(seen) == 3 and len(set(seen.values())) >= 2, seen  # three positions, told apart as their figures are
    p.seek(6_000_000_000)
    assert p.status().startswith("  6.00/8.01 s")  # far from the end: to 10 ms


def test_a_looping_replay_keeps_its_last_pass_on_screen_until_the_next_pass_has_a_window():
    p = RecordingPlayer(str(REC["graph"]), "graph", loop=True)
    p.seek(p.end_ns)
    last = p.snapshot()
    assert last.diagnosis.ceiling == "occupancy"
    p.tick(0.5)  # past the end: the recording starts again, and its first window is seconds in
    assert p.clock_ns < 1e9 and not p.session.metrics
    shown = p.snapshot()
    assert shown.diagnosis.ceiling == "occupancy" and shown.tokens is not None
    for _ in range(200):  # on, until the new pass has its own window
        p.tick(0.1)
        if p.session.metrics:
            break
    assert p.session.metrics and p.snapshot().rx_ns <= p.clock_ns


def test_side_by_side_replays_that_loop_start_each_pass_together():
    from decodemon.monitor.player import in_step

    a, b = in_step([RecordingPlayer(str(REC["eager"]), "eager", loop=True),
                    RecordingPlayer(str(REC["graph"]), "graph", loop=True)])
    short, long_ = sorted((a, b), key=lambda p: p.end_ns)
    assert short.end_ns < long_.end_ns and a.period_ns == b.period_ns == long_.end_ns
    restarts = {id(a): [], id(b): []}
    for i in range(int(2.5 * long_.end_ns / 1e9 / 0.25)):  # two and a half passes of the longer, 0.25 s a tick
        for p in (a, b):
            before = p.clock_ns
            p.tick(0.25)
            if p.clock_ns < before:
                restarts[id(p)].append(i)
        assert short.clock_ns <= short.end_ns  # the shorter holds its end while the longer plays on
    assert len(restarts[id(a)]) == 2 and restarts[id(a)] == restarts[id(b)]  # the sides start again at one tick


def _serving_app(at=5.0):
    from tests.conftest import DATA

    return DecodemonApp([RecordingPlayer(str(DATA / "h200_hf_cb_16.dmon"), "transformers CB, 16 in flight (H200)")],
                        start_at_s=at, paused=True, out_dir=".")


def test_a_batched_engine_gets_the_serving_view_and_a_batch_one_loop_none():
    asyncio.run(_serving())


async def _serving():
    from decodemon.monitor.widgets.serving import ServingPanel

    app = _serving_app()
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        panel = app.query_one(ServingPanel)
        text = panel._put_last.plain
        assert panel.display and "batch 16 tokens/step" in text and "tok/s in all" in text
        assert "per request: a token every" in text and "verdict on the step: LAUNCH" in text
    app = make_app(["eager"])
    async with app.run_test(size=(120, 50)) as pilot:
        await pilot.pause()
        assert not app.query_one(ServingPanel).display


def test_the_serving_view_snapshot(snap_compare):
    assert snap_compare(_serving_app(), terminal_size=(120, 50))


def test_the_group_bar_names_no_late_rank_where_the_ranks_arrive_together():
    from decodemon.monitor.ranks import combine
    from decodemon.monitor.widgets.group_bar import group_parts

    snaps = []
    for r in (0, 1):
        p = RecordingPlayer(str(DATA / f"h200_tp2_eager_rank{r}.dmon"))
        p.seek(p.end_ns)
        snaps.append(p.snapshot())
    text = " ".join(t.plain for t in group_parts(combine(snaps)))
    # the eager ranks' calls 4.90 and 4.86 µs: 0.04 µs apart, the kernels' jitter
    assert "the ranks arrive together (0.04 µs/call apart)" in text and "the others wait" not in text
