"""Text a target supplies reaches the live screen and the exporter's /metrics as data, never as a command: an OSC
title sequence, a screen clear and Textual markup in the name given to report_model(), a kernel's name and the GPU's
name are shown escaped (`\\x1b]0;...`, `[bold red]x[/]` as it reads) in every panel, the status line and the
titles, and as label values on /metrics. Frames through the real wire: a real CPU decode loop that reports the name
(live, through `decodemon run`), and a modified copy of the bundled H200 eager recording whose names alone were
replaced (the snapshot)."""

from __future__ import annotations

import asyncio
import threading
import time

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from decodemon.monitor.exporter import collector, serve
from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.player import LivePlayer, RecordingPlayer
from decodemon.monitor.safe_text import visible
from decodemon.monitor.widgets.header import HeaderPanel
from decodemon.monitor.widgets.kernels import KernelsPanel
from decodemon.monitor.widgets.verdict import VerdictPanel
from decodemon.probes import wire
from decodemon.probes.wire_file import load_recording, recording_bytes
from tests.conftest import DATA, run_script

# a terminal title, a screen clear, then what Textual would read as markup
EVIL = "\x1b]0;owned\x07\x1b[2J[bold red]x[/]"
SHOWN = visible(EVIL)  # \x1b]0;owned\x07\x1b[2J[bold red]x[/], as text
RAW = ("\x1b", "\x07")


def no_raw(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)


@pytest.fixture(scope="module")
def modified_recording(tmp_path_factory):
    """A modified copy of the bundled H200 eager recording: the model's name (as report_model() gives it), the
    GPU's name and UUID, every kernel's name and the Bye's reason replaced by ones holding EVIL; every other byte
    of every frame as recorded, the frames encoded again by the wire's own writer."""
    frames = load_recording(DATA / "h200_eager.dmon")
    header, out = frames[0][1], []
    for rx, f in frames[1:]:
        if isinstance(f, wire.Hello):
            f = msgspec.structs.replace(f, model=msgspec.structs.replace(f.model, name=f"qwen3 {EVIL}"),
                                        gpu=msgspec.structs.replace(f.gpu, name=f"H200 {EVIL}", uuid=f"GPU-{EVIL}"))
        elif isinstance(f, wire.KernelWindow):
            f = msgspec.structs.replace(f, names=[f"k{i} {EVIL}" for i in range(len(f.names))])
        elif isinstance(f, wire.Bye):
            f = wire.Bye(reason=f"ended {EVIL}")
        out.append((rx, f))
    path = tmp_path_factory.mktemp("modified") / "h200_eager_names_modified.dmon"
    path.write_bytes(recording_bytes(out, header))
    return path


def _app(path, at_s=None) -> DecodemonApp:
    p = RecordingPlayer(str(path), "eager, names modified")
    return DecodemonApp([p], start_at_s=p.end_ns / 1e9 if at_s is None else at_s, paused=True, out_dir=".")


def test_the_screen_shows_a_targets_names_escaped_snapshot(snap_compare, modified_recording):
    assert snap_compare(_app(modified_recording, 10.0), terminal_size=(200, 50))


def test_every_panel_the_titles_and_the_screen_show_the_names_as_text(modified_recording):
    asyncio.run(_every_panel(modified_recording))


async def _every_panel(path):
    app = _app(path, 10.0)
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        header = app.query_one(HeaderPanel)._put_last.plain
        assert f"qwen3 {SHOWN}" in header and f"H200 {SHOWN}" in header
        table = app.query_one(KernelsPanel)
        names = [table.get_row_at(i)[0] for i in range(table.row_count)]
        assert names and all(n.plain.endswith(SHOWN) and not n.spans for n in names)  # no markup read in them
        for text in (app.title, app.sub_title, str(app.screen.title or ""), str(app.screen.sub_title or "")):
            no_raw(text)
        svg = app.export_screenshot()
        no_raw(svg)
        assert "\\x1b]0;owned\\x07\\x1b[2J[bold&#160;red]x[/]" in svg  # drawn as it reads, brackets and all
        await pilot.press("v")  # how the verdict was reached: its inputs name the device
        await pilot.pause()
        no_raw(app.export_screenshot())
    app = _app(path)  # at its end: the Bye's reason
    async with app.run_test(size=(200, 50)) as pilot:
        await pilot.pause()
        assert f"ended {SHOWN}" in app.query_one(HeaderPanel)._put_last.plain
        no_raw(app.export_screenshot())


def test_a_live_sources_end_in_the_status_line_is_shown_escaped(monkeypatch, modified_recording):
    """The status line names how a live source ended: the agent's Bye, decoded from the wire."""
    asyncio.run(_status_line(monkeypatch, modified_recording))


async def _status_line(monkeypatch, path):
    from tests.test_app import live_app, settle

    frames = load_recording(path)
    bye = wire.decode_frame(wire.encode(wire.Bye(reason=f"ended {EVIL}")))
    upto = next(i for i, (_, f) in enumerate(frames) if isinstance(f, wire.KernelWindow))
    app = live_app(monkeypatch, [*frames[1:upto + 1], (frames[upto][0] + 1, bye)])
    async with app.run_test(size=(200, 50)) as pilot:
        await settle(app, pilot)
        line = str(app.query_one("StatusBar").render())
        assert line.endswith(f"ended: ended {SHOWN}"), line
        no_raw(app.export_screenshot())


# a decode loop on the CPU that reports its model by hand, with EVIL in the name
LOOP = f"""
import sys, time
from decodemon.engine_adapter import mark_token, report_model
report_model(name={('qwen3 ' + EVIL)!r}, weight_bytes=1 << 20, layers=2, dtype="float32")
print("decoding", file=sys.stderr, flush=True)
i = 0
while True:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.002:
        pass
    mark_token(i)
    i += 1
"""


@pytest.fixture(scope="module")
def reporting_loop(tmp_path_factory):
    script = tmp_path_factory.mktemp("loop") / "loop.py"
    script.write_text(LOOP)
    proc, pid = run_script(script)
    yield pid
    proc.terminate()
    try:
        proc.wait(30)
    except Exception:
        proc.kill()
        proc.wait()


def test_a_live_attach_shows_the_reported_name_escaped(reporting_loop):
    asyncio.run(_live(reporting_loop))


async def _live(pid):
    app = DecodemonApp([LivePlayer(pid)], refresh_s=0.25)
    async with app.run_test(size=(160, 50)) as pilot:
        deadline = time.monotonic() + 30
        header = ""
        while time.monotonic() < deadline and f"qwen3 {SHOWN}" not in header:
            await pilot.pause(0.25)
            header = getattr(app.query_one(HeaderPanel)._put_last, "plain", "")
        assert f"qwen3 {SHOWN}" in header, header
        no_raw(header)
        no_raw(app.query_one(VerdictPanel)._put_last.plain)
        no_raw(app.title + app.sub_title)
        no_raw(app.export_screenshot())
    app.players[0].thread.join(10)  # detached: the loop's agent is free for the exporter's watch


def test_metrics_label_values_show_the_reported_name_escaped(reporting_loop):
    from tests.test_prometheus import _free_port, scrape_until

    port, done, rc = _free_port(), threading.Event(), []
    t = threading.Thread(target=lambda: rc.append(serve.serve_pid(reporting_loop, "127.0.0.1", port,
                                                                 stop=done.is_set)), daemon=True)
    t.start()
    try:
        info, text = scrape_until(port, "decodemon_model_info", reporting_loop, 30)
        assert info, text[-2000:]
        assert info[0].labels["model"] == f"qwen3 {SHOWN}"  # the value a scraper reads: the escapes, as text
        no_raw(text)
    finally:
        done.set()
        t.join(15)
    assert rc == [0]


def test_label_values_from_a_modified_recording_are_escaped(modified_recording):
    from decodemon.monitor.sources.collect import collect_recording

    snap = collect_recording(modified_recording).snapshot()
    hello = next(f for _, f in load_recording(modified_recording) if isinstance(f, wire.Hello))
    hello = msgspec.structs.replace(hello, argv=["/opt/engine\x1b]0;owned\x07"])  # its name: past the last /
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry()
    reg.register(collector.SnapshotCollector(lambda: [(collector.target_labels(hello, 7), snap)]))
    text = generate_latest(reg).decode()
    no_raw(text)
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples if s.labels.get("pid") == "7"]
    assert samples and all(s.labels["engine"] == "engine\\x1b]0;owned\\x07" for s in samples)
    assert any(s.labels.get("model") == f"qwen3 {SHOWN}" for s in samples)


def test_visible_all_escapes_every_string_inside_and_hands_back_what_needs_none():
    import dataclasses
    from collections import namedtuple

    import numpy as np

    from decodemon.monitor.safe_text import visible_all

    @dataclasses.dataclass(frozen=True)
    class Row:
        name: str
        n: int = 0

    Pair = namedtuple("Pair", "a b")
    plain = {"k": [Row("fine"), Pair("a", 1)], "gpu": wire.GpuInfo(index=0, name="H200", sm_count=1,
                                                                       mem_bandwidth_gbs=1.0)}
    assert visible_all(plain) is plain  # nothing to escape: the very object, so identity-keyed redraws hold
    evil = {f"k{EVIL}": (Row(EVIL, 3), Pair(EVIL, [EVIL])), "arr": np.array([EVIL, "ok"]),
            "gpu": wire.GpuInfo(index=0, name=EVIL, sm_count=1, mem_bandwidth_gbs=1.0)}
    shown = visible_all(evil)
    assert shown[f"k{SHOWN}"] == (Row(SHOWN, 3), Pair(SHOWN, [SHOWN]))
    assert shown["arr"].tolist() == [SHOWN, "ok"] and shown["gpu"].name == SHOWN
    assert evil["gpu"].name == EVIL  # the original is left as it was (--json gives the text back whole)
