"""The screen shows how it reached its verdict: every candidate's number, threshold, state and the source of each
input, the sentence that decides, at 200x50 on the main screen and one key (`v`) away at 80x24; and no headline,
pending line or history that the candidates contradict."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from decodemon.monitor.advice import NO_GPU_FALSIFY, NO_GPU_REMEDY
from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.diagnosis import ORDER
from decodemon.monitor.player import RecordingPlayer
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.rolling import Rolling, advance, headline
from decodemon.monitor.widgets.collectives import CollectivesPanel
from decodemon.monitor.widgets.header import HeaderPanel
from decodemon.monitor.widgets.telemetry import TelemetryPanel
from decodemon.monitor.widgets.timeline import TimelinePanel
from decodemon.monitor.widgets.verdict import VerdictPanel
from tests.conftest import DATA, cli
from tests.test_app import engine_frames, live_app, settle
from tests.test_screens_trust import SCREENS


def _app(path, at=None, *more) -> DecodemonApp:
    players = [RecordingPlayer(str(p), p.stem) for p in (path, *more)]
    start = at if at is not None else players[0].end_ns / 1e9
    return DecodemonApp(players, start_at_s=start, paused=True, out_dir=".")


async def _texts(app, size=(200, 50), keys=()):
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        if keys:
            await pilot.press(*keys)
            await pilot.pause()
        return app.players[0].snapshot(), {cls: app.query(cls).first()._put_last.plain
                                           for cls in (HeaderPanel, VerdictPanel, TimelinePanel, CollectivesPanel,
                                                       TelemetryPanel)}


async def until(pilot, holds, timeout_s: float = 10.0) -> bool:
    """Wait for `holds()` (a scroll that may animate), bounded in time; whether it held."""
    deadline = time.monotonic() + timeout_s
    while not holds() and time.monotonic() < deadline:
        await pilot.pause(0.02)
    return holds()


def texts(path, at=None, size=(200, 50)):
    """The snapshot at `at` and each panel's text, drawn at `size`."""
    return asyncio.run(_texts(_app(path, at), size))


def agrees(s, text: str) -> None:
    """The verdict panel's text says nothing its candidates contradict: the headline binds (or nothing does), a
    pending line names the headline and the history's own verdict, and a history whose last verdict is not the
    headline is explained on screen."""
    cands = s.diagnosis.candidates
    ceiling, pending = headline(s.diagnosis, s.rolling)
    first = text.splitlines()[0]
    assert first.split()[0] == ceiling.upper()
    binding = [k for k in ORDER if cands[k].state == "binding"]
    assert ceiling == (binding[0] if binding else "unknown"), (ceiling, binding)
    if len(binding) > 1:
        assert f"{binding[0].upper()} and {binding[1].upper()} both bind" in text
        assert f"the first in the method's order (BANDWIDTH, COMM, LAUNCH, OCCUPANCY), {binding[0].upper()}" in text
    history = s.rolling.history
    if pending and not history:  # no window has named a ceiling: the headline is the span's alone
        assert "no window has named a ceiling yet" in first and s.rolling.ceiling == "unknown"
    elif pending:
        assert "binds on the span's figures" in first and f"the history keeps {s.rolling.ceiling.upper()}" in first
        assert history and history[-1].after == s.rolling.ceiling
    elif history and history[-1].after != ceiling:
        assert f"the history's last verdict is {history[-1].after.upper()}" in text
    for line in text.splitlines():
        m = re.match(r"(BANDWIDTH|COMM|LAUNCH|OCCUPANCY) +(binding|ruled out|unknown)", line)
        if m:
            assert cands[m.group(1).lower()].state == m.group(2).replace(" ", "_"), line


@pytest.mark.parametrize("name", sorted(SCREENS))
def test_no_headline_pending_line_or_history_contradicts_the_candidates(name):
    path, at = SCREENS[name]
    for size in ((200, 50), (80, 24)):
        s, t = texts(path, at, size)
        agrees(s, t[VerdictPanel])


def test_a_headline_the_windows_have_not_yet_recorded_says_so_beside_the_history():
    """Windows that voted COMM while the candidates now support LAUNCH: the pending line says LAUNCH binds now and
    the history keeps COMM, never "COMM → LAUNCH?" under a LAUNCH headline."""
    s = texts(DATA / "h200_eager.dmon", 10.0)[0]
    voted = advance(Rolling(), "comm", "0.0 s", {})
    ceiling, pending = headline(s.diagnosis, voted)
    assert ceiling == "launch" and "?" not in pending
    # and where the span's own figures rule the kept ceiling out, it says so (COMM: one rank, nothing to reduce)
    # the latest window read COMM: no "binds now ... (0 so far)", which reads as a contradiction
    assert pending == ("binds on the span's figures; the history keeps COMM: its latest window did not read LAUNCH, "
                       "and it changes once 2 windows in a row do; the figures of the span now rule COMM out")
    once = advance(voted, "launch", "1.0 s", {})
    assert headline(s.diagnosis, once)[1] == (
        "binds on the span's figures; the history keeps COMM, its windows' verdict, until LAUNCH wins 2 windows in a "
        "row (1 so far); the figures of the span now rule COMM out")


def test_a_first_window_whose_collectives_all_waited_for_a_peer_votes_no_comm():
    """Both TP ranks traced in the same tokens: rank 0's first window priced a call at 305 µs, its every call
    waiting for rank 1, and voted COMM (the artefact docs/tensor-parallel.md names). The calls waited longer than
    they ran, so COMM is unknown there, the wait is the step's idle, and the rank reads LAUNCH from its first window
    on, as its later windows and rank 1 do."""
    s, t = texts(DATA / "h200_tp2_eager_samewindow_rank0.dmon", 4.0)
    comm = s.diagnosis.candidates["comm"]
    assert comm.state == "unknown" and "the calls waited longer than they ran" in comm.detail
    launch = s.diagnosis.candidates["launch"]
    assert s.diagnosis.ceiling == "launch" and "ms waiting for a late peer left out" in launch.detail
    s, t = texts(DATA / "h200_tp2_eager_samewindow_rank0.dmon")
    assert [h.after for h in s.rolling.history] == ["launch"] and t[VerdictPanel].splitlines()[0].split()[0] == "LAUNCH"


def test_each_candidate_shows_its_threshold_and_inputs_with_their_sources():
    s, t = texts(DATA / "h200_eager.dmon", 10.0)
    text = t[VerdictPanel]
    for k in ORDER:
        assert f"threshold: {s.diagnosis.candidates[k].threshold}" in text
    i = s.inputs
    floor = s.diagnosis.bandwidth_floor_ms
    # every "=" holds: the ratio, then the floor's own parts
    assert (f"{i.ms_per_token:.4g} ms/token (median of the last 5 s, {s.tokens.tokens} tokens timed, mark_token) ÷ "
            f"floor {floor:.3g} ms = {i.ms_per_token / floor:.3g}×; floor {floor:.3g} ms = "
            f"{i.bytes_per_token / 1e9:.3g} GB/token (model: weights + KV at depth {s.depth}) ÷ "
            f"{i.bandwidth_gbs:.4g} GB/s (engine adapter's measured copy)") in text
    assert f"÷ {i.kernels_per_token:.0f} kernels/token (traced; each launched by the host)" in text
    assert "each a launch" not in text
    assert f"kernel share {s.kernel_share_pct:.0f}% of the step (traced kernels' time ÷ ms/token: its 50% rule" in text
    # the sentence that decides: OCCUPANCY's 70% would bind but for a GPU idle most of the step
    assert ("decides: LAUNCH binds, not OCCUPANCY: OCCUPANCY is unknown at 70.2% kernel time in small grids: the GPU is idle most "
            f"of the step, so grids are not yet what binds (kernel share {s.kernel_share_pct:.0f}% of the step, under "
            "the 50%") in text
    assert f"= {i.bytes_per_token / 1e9:.3g} GB (model" in t[HeaderPanel]  # the floor's parts in the header too

    s, t = texts(DATA / "h200_graph.dmon", 10.0)
    assert f"GPU busy {s.inputs.gpu_busy_pct:.0f}% from PM counters (device-wide)" in t[VerdictPanel]
    assert f"SM active {s.inputs.sm_active_pct:.0f}% from PM counters" in t[VerdictPanel]


def test_a_spec_bandwidth_is_named_as_one():
    s, t = texts(DATA / "h200_hf_cb_16.dmon", 5.0)
    assert s.bandwidth_source.startswith("NVML peak")
    assert "GB/s (spec: NVML peak, not measured)" in t[VerdictPanel]


def test_at_80x24_the_reasoning_is_one_key_away_and_scrolls():
    asyncio.run(_why_at_80x24())


async def _why_at_80x24():
    from textual.containers import VerticalScroll

    from decodemon.monitor.widgets.why_screen import WhyScreen

    app = _app(DATA / "h200_eager.dmon", 10.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        compact = app.query_one(VerdictPanel)._put_last.plain
        assert "threshold:" not in compact and "v: each candidate's threshold and inputs" in compact
        await pilot.press("v")
        assert isinstance(app.screen, WhyScreen)
        why = app.screen.query_one("#why").render().plain
        for c in app.players[0].snapshot().diagnosis.candidates.values():
            assert c.threshold in why.replace("\n", " ") or c.threshold in why
        assert "engine adapter's measured copy" in why and "prove it wrong" in why
        box = app.screen.query_one(VerticalScroll)
        assert box.max_scroll_y > 0  # taller than the terminal: it scrolls
        await pilot.press("end")
        assert await until(pilot, lambda: box.scroll_y == box.max_scroll_y)
        await pilot.press("escape")
        assert not isinstance(app.screen, WhyScreen)


def test_help_scrolls_with_the_keys_it_names_at_80x24():
    asyncio.run(_help_scrolls())


async def _help_scrolls():
    from textual.containers import VerticalScroll

    from decodemon.monitor.app import HelpScreen
    from decodemon.monitor.widgets.help_screen import HELP

    assert "↑ ↓, PgUp PgDn, Home End scroll it" in HELP
    assert "not the OCCUPANCY ceiling, the grid against the SMs)" in HELP  # the warps sentence ends
    app = _app(DATA / "h200_eager.dmon", 10.0)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one(VerticalScroll)
        assert box.max_scroll_y > 0
        for key, where in (("down", 1), ("end", box.max_scroll_y), ("home", 0), ("pagedown", None)):
            await pilot.press(key)
            assert await until(pilot, lambda: (box.scroll_y > 0) if where is None else box.scroll_y == where), key


def test_kernels_past_the_step_are_flagged_not_clipped():
    s, t = texts(DATA / "h200_graph.dmon", 10.0)
    i = s.inputs
    assert i.kernel_sum_ms_per_token > i.ms_per_token
    flag = (f"⚠ kernels {i.kernel_sum_ms_per_token:.3g} ms are "
            f"{100 * i.kernel_sum_ms_per_token / i.ms_per_token:.0f}% of the {i.ms_per_token:.4g} ms median step")
    assert flag in t[TimelinePanel] and flag in t[VerdictPanel]
    assert "kernels 100% of the step" not in t[TimelinePanel]
    assert summary_json(s)["kernels_past_step"].startswith(flag[2:])  # --json flags it beside its share (clipped)
    s, t = texts(DATA / "h200_eager.dmon", 10.0)
    assert "⚠ kernels" not in t[TimelinePanel] and summary_json(s)["kernels_past_step"] is None
    # the eager token drawn is the traced one, which tracing stretched past the median step: said beside it
    drawn = s.window.timeline.token_ns / 1e6
    assert drawn > 1.3 * s.tokens.ms_per_token
    assert (f"the traced token took {drawn:.3g} ms against the {s.tokens.ms_per_token:.3g} ms median step: tracing "
            "stretched it") in t[TimelinePanel].replace("\n", " ")


def test_pm_armed_with_no_sample_says_so_after_a_few_seconds():
    early, late = texts(DATA / "h200_eager.dmon", 2.0)[1], texts(DATA / "h200_eager.dmon", 10.0)[1]
    assert "PM sampling: armed (in process" in early[TelemetryPanel] and "no sample" not in early[TelemetryPanel]
    said = late[TelemetryPanel].replace("\n", "")
    assert "PM sampling: armed in the target's agent thread, but no sample in 10 s" in said
    assert "GPU busy comes from the kernel share (traced kernel time ÷ ms/token)" in said and "--probe" not in said  # a replay: no advice to attach otherwise
    s = texts(DATA / "h200_eager.dmon", 10.0)[0]
    assert summary_json(s)["pm_silent"].replace("\n", "") in said  # --json says the same, where pm_* are null
    assert summary_json(texts(DATA / "h200_eager.dmon", 2.0)[0])["pm_silent"] is None
    s, graph = texts(DATA / "h200_graph.dmon", 10.0)
    assert "no sample" not in graph[TelemetryPanel] and summary_json(s)["pm_silent"] is None  # its PM delivers


def test_every_ms_per_token_says_what_it_is():
    s, t = texts(DATA / "h200_eager.dmon", 10.0)
    assert f"{s.tokens.ms_per_token:.3f} ms/token median" in t[HeaderPanel] and "mean of the last 5 s" in t[HeaderPanel]
    assert "ms/token its median" in t[TelemetryPanel]


def test_the_same_window_artefact_is_named_where_it_applies():
    for rank in (0, 1):
        s, t = texts(DATA / f"h200_tp2_eager_samewindow_rank{rank}.dmon")
        assert "waiting for a late peer: ranks traced in the same tokens run late by turns" in t[VerdictPanel]
        assert "ranks traced in the same tokens run late by turns" in t[CollectivesPanel]
        assert s.diagnosis.candidates["comm"].state == "ruled_out"
    s, t = texts(DATA / "h200_tp2_eager_rank0.dmon")  # staggered windows: no wait, no word of it
    assert "ranks traced in the same tokens" not in t[VerdictPanel] + t[CollectivesPanel]


def test_launch_counts_a_collectives_wait_for_a_peer_as_idle_on_screen_as_the_diagnosis_does():
    kernels = {}
    for rank in (0, 1):
        s, t = texts(DATA / f"h200_tp2_eager_samewindow_rank{rank}.dmon")
        line = " ".join(t[VerdictPanel].split())
        m = re.search(r"GPU idle ([\d.]+) ms = [\d.]+ ms/token \(median\) − ([\d.]+) ms of kernels", line)
        assert m and "NCCL waiting for a peer" in line, line
        idle_pct = 100 * float(m.group(1)) / s.inputs.ms_per_token
        # the same idle as LAUNCH's own detail ("... ms/token no kernel explains (92% of the step")
        said = re.search(r"no kernel explains \((\d+)% of the step", s.diagnosis.candidates["launch"].detail)
        assert said and abs(idle_pct - int(said.group(1))) <= 1, (idle_pct, said.group(0))
        kernels[rank] = float(m.group(2))
    # one step's kernels on both ranks, their waits for each other taken out (10.7 and 20.1 ms with them in)
    assert kernels[0] == pytest.approx(kernels[1], rel=0.05)


def test_counts_agree_across_panels():
    from decodemon.monitor.widgets.serving import ServingPanel

    async def serving():
        app = _app(DATA / "h200_hf_cb_16.dmon", 5.0)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            return (app.players[0].snapshot(), app.query_one(HeaderPanel)._put_last.plain,
                    app.query_one(ServingPanel)._put_last.plain)

    s, header, panel = asyncio.run(serving())
    n = s.tokens.tokens
    assert f"({n} steps timed" in header and f"(median of {n} steps" in panel


def test_the_status_bar_and_group_bar_fit_80_columns():
    asyncio.run(_bars_at_80())


async def _bars_at_80():
    from decodemon.monitor.app import GroupBar
    from decodemon.monitor.widgets.group_bar import group_parts
    from decodemon.monitor.widgets.status_bar import StatusBar

    app = DecodemonApp([RecordingPlayer(str(DATA / f"h200_{n}.dmon"), f"{n} (H200)") for n in ("eager", "graph")],
                       start_at_s=10.0, paused=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        bar = app.query_one(StatusBar)
        line = str(bar.render())
        assert len(line) <= bar.content_size.width
        assert re.search(r"eager( \(H200\))?: 10.00/21.16 s paused", line), line
        assert re.search(r"graph( \(H200\))?: 10.00/15.16 s paused", line), line
    players = [RecordingPlayer(str(DATA / f"h200_tp2_graph_rank{r}.dmon")) for r in (0, 1)]  # labelled by path
    app = DecodemonApp(players, start_at_s=60.0, paused=True, group=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        bar = app.query_one(GroupBar)
        lines = str(bar.render()).splitlines()
        parts = [p.plain for p in group_parts(bar.group)]
        assert len(lines) > 1 and all(len(x) <= bar.content_size.width for x in lines)
        for x in lines:  # every line is whole phrases, none cut across lines
            assert x.split("  ") and all(any(piece in p for p in parts) for piece in x.split("  ")), x
        # each rank's status and header name it by the end of its file's name, where the two differ, and whole
        status = str(app.query_one(StatusBar).render())
        assert "…" not in status.replace("…tp2_graph_rank", "") and "rank0" in status and "rank1" in status
        heads = [h._put_last.plain.splitlines()[0] for h in app.query(HeaderPanel)]
        assert [h.split()[0] for h in heads] == ["…tp2_graph_rank0", "…tp2_graph_rank1"], heads


def test_a_cpu_engine_screen_asks_for_nothing_it_cannot_measure(monkeypatch):
    asyncio.run(_cpu(monkeypatch))


async def _cpu(monkeypatch):
    app = live_app(monkeypatch, engine_frames())
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(app, pilot)
        s = app.players[0].snapshot()
        text = app.query_one(VerdictPanel)._put_last.plain
        header = app.query_one(HeaderPanel)._put_last.plain
        agrees(s, text)
        assert "decides: no GPU in the target: bandwidth, launches and grids cannot be priced" in text
        assert "a traced window" not in text and "measure more" not in text
        # the falsifier and the remedy --json and report give are the screen's: nothing asks for a GPU's figure
        d = s.diagnosis.as_json()
        assert d["ceiling"] == "unknown" and d["remedy"] == NO_GPU_REMEDY and d["falsify"] == NO_GPU_FALSIFY
        assert all("traced window" not in c["detail"] for c in d["candidates"].values()), d["candidates"]
        j = summary_json(s)
        assert j["gpu_busy_pct"] is None and j["gpu_busy_source"] is None  # no source named for no figure
        assert f"remedy: {NO_GPU_REMEDY}" in text and f"prove it wrong: {NO_GPU_FALSIFY}" in text
        n = s.tokens.tokens
        assert f"({n} tokens timed" in header and f"still measured: {n} tokens timed" in text


@pytest.mark.parametrize("size", [(200, 50), (80, 24)], ids=["200x50", "80x24"])
def test_cpu_engine_screen_snapshot(snap_compare, monkeypatch, size):
    """No CPU recording is bundled: the CPU engine's screen is drawn from the frames its agent sends."""
    app = live_app(monkeypatch, engine_frames())

    async def run_before(pilot):
        await settle(app, pilot)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("name", ["demo_eager", "tp2_rank0"])
def test_why_screen_snapshot_at_80x24(snap_compare, name):
    path, at = SCREENS[name]
    p = RecordingPlayer(str(path), name)
    app = DecodemonApp([p], start_at_s=at if at is not None else p.end_ns / 1e9, paused=True, out_dir=".")
    assert snap_compare(app, press=["v"], terminal_size=(80, 24))


def test_a_comparison_names_what_its_ratios_compare():
    asyncio.run(_ratios())


async def _ratios():
    from decodemon.monitor.app import RatioBar

    app = DecodemonApp([RecordingPlayer(str(DATA / f"h200_{n}.dmon"), n) for n in ("eager", "graph")],
                       start_at_s=10.0, paused=True)
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        a, b = (p.snapshot() for p in app.players)
        text = str(app.query_one(RatioBar).render())
        assert f"ms/token median {a.tokens.ms_per_token:.2f} → {b.tokens.ms_per_token:.2f}" in text
        assert f"GPU busy {a.gpu_busy_pct:.0f}% (kernel share) → {b.gpu_busy_pct:.0f}% (PM)" in text
        # the figure `compare --json` calls host_launch_calls_per_token: a captured graph is one launch call, not 0
        calls = [summary_json(s)["host_launch_calls_per_token"] for s in (a, b)]
        assert calls[1] >= 1 and calls[0] > 1000
        assert f"host launch calls/token {calls[0]:.0f} → {calls[1]:.0f}  " in text


def test_demo_screen_snapshot_at_200x50(snap_compare):
    """`decodemon demo` replaying the bundled recordings: each side's verdict with its reasoning on the main screen."""
    app = DecodemonApp([RecordingPlayer(str(DATA / f"h200_{n}.dmon"), f"{n} (H200)") for n in ("eager", "graph")],
                       start_at_s=10.0, paused=True)
    assert snap_compare(app, terminal_size=(200, 50))


def _lines(app, panel) -> list[str]:
    """A panel's text as wrapped on screen, line by line."""
    return [line.plain for line in panel._put_last.wrap(app.console, panel.content_size.width)]


def test_a_number_is_never_wrapped_away_from_its_unit():
    asyncio.run(_number_beside_unit())


async def _number_beside_unit():
    from decodemon.monitor.widgets.format import value_words

    # the demo at 6 s: eager's launch candidate is 8.82 µs idle/kernel, one cell too wide beside its state at 80x24
    app = _app(DATA / "h200_eager.dmon", 6.0, DATA / "h200_graph.dmon")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        for side, panel in zip(app.players, app.query(VerdictPanel)):
            lines = _lines(app, panel)
            for c in side.snapshot().diagnosis.candidates.values():
                if c.value is not None:
                    core = value_words(c.value, c.unit.split(" ")[0])
                    assert any(core in line for line in lines), (core, lines)
    app = _app(DATA / "h200_eager.dmon", 6.0, DATA / "h200_graph.dmon")
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        for side, panel in zip(app.players, app.query(HeaderPanel)):
            s = side.snapshot()
            floor = s.diagnosis.bandwidth_floor_ms
            lines = _lines(app, panel)
            assert any(f"floor {floor:.3f} ms" in line for line in lines), lines
            assert any(f"{s.tokens.ms_per_token / floor:.1f}× floor" in line for line in lines), lines


def test_a_share_past_100_percent_reads_as_at_least_100():
    s, t = texts(DATA / "h200_cuda_loop_8gib.dmon")
    c = s.diagnosis.candidates["occupancy"]
    assert c.value > 100.5  # the diagnosis keeps its own figure; only the screen reads it as ≥100%
    text = t[VerdictPanel]
    assert "OCCUPANCY ruled out ≥100% SM active of GPU busy" in text
    # the figure itself appears only in the candidate's inputs, with why a share can pass 100%
    said = f"{c.value:.0f}% of GPU busy (past 100%: the two counters are sampled apart"
    assert text.count(f"{c.value:.0f}%") == text.count(said) == 1


def test_a_wide_kernel_table_reads_a_mangled_name_as_its_short_one():
    from decodemon.monitor.widgets.kernels import kernel_label

    mangled = "_ZN2at6native13reduce_kernelILi512ELi1ENS0_8ReduceOpIfNS0_7MeanOpsIffffEEjfLi4ELi4EEEEEvT1_"
    assert kernel_label("native::reduce_kernel", mangled, 200) == "native::reduce_kernel"
    assert kernel_label("nvjet_sm90_tst", "nvjet_sm90_tst_8x64_64x16_2x1_v_bz_TNN", 200).endswith("_TNN")
    # a short name cut at 48 characters is cut no shorter than the column it is shown in
    long = "triton_poi_fused__scaled_dot_product_cudnn_attention_" + "x" * 150
    assert kernel_label(long[:47] + "…", long, 130) == long[:129] + "…"


def test_a_source_another_monitor_holds_says_so_where_the_verdict_is():
    from dataclasses import replace

    from decodemon.monitor.widgets.verdict import verdict_text

    s = RecordingPlayer(str(DATA / "h200_eager.dmon")).snapshot()
    held = replace(s, ended="busy: monitor pid 23449 is attached; one monitor at a time")
    first = verdict_text(held, 200).plain.splitlines()[0]
    assert "not watched: busy: monitor pid 23449 is attached" in first and "the source ended" not in first
    assert "stale: the source ended" in verdict_text(replace(s, ended="detached"), 200).plain.splitlines()[0]


def test_a_replay_paused_at_its_end_shows_the_figures_its_json_gives_for_the_same_span():
    # the end in seconds and back in ns can fall 1 ns short of the last frame: the paused screen then left it out
    path = DATA / "h200_hf_static_plain.dmon"
    end = RecordingPlayer(str(path)).end_ns
    assert int(end / 1e9 * 1e9) < end  # the recording this would miss a frame of
    s, _ = texts(path)
    j = summary_json(s)
    last = json.loads(cli("replay", str(path), "--json", "--last", "5").stdout)
    assert (j["span"]["tokens"], j["ms_per_token"], j["ceiling"]) == (last["span"]["tokens"], last["ms_per_token"],
                                                                      last["ceiling"])
