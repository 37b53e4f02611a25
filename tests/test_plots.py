"""The plots: SVG pinned against reviewed baselines, the PNG rasteriser's file, and the terminal renderings.

A baseline that is missing is written when DECODEMON_UPDATE_SNAPSHOTS=1 and the test then fails, so a new picture
is looked at (render its PNG) before it is committed."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

import pytest

from tests.conftest import REC
from decodemon.monitor import plots
from decodemon.monitor.plots.png import GLYPHS
from decodemon.monitor.render import summary_json
from decodemon.monitor.sources.collect import collect

SNAP = Path(__file__).parent / "baselines" / "plots"  # not under __snapshots__: syrupy would call them unused

SWEEP = [("candidate", [(64, 3.1, "launch"), (512, 3.3, "launch"), (2048, 5.0, "occupancy"),
                        (8192, 12.0, "bandwidth")]),
         ("reference", [(64, 2.0, "bandwidth"), (512, 2.1, "bandwidth"), (2048, 2.4, "bandwidth"),
                        (8192, 3.0, "bandwidth")])]
TIMELINE = ([(0.25 + 0.5 * i, 20.0 + (i % 3) if i < 24 else 3.9 + 0.1 * (i % 2)) for i in range(48)],
            [(0.8, "LAUNCH"), (12.3, "LAUNCH → OCCUPANCY")])


@pytest.fixture(scope="module")
def budget_bars():
    bars = []
    for name, key in (("eager", "eager"), ("graphed", "graph")):
        parts, ms = plots.budget_of(summary_json(collect(REC[key]).snapshot()))
        bars.append((name, parts, ms))
    return bars


def matches_baseline(name: str, svg: str) -> bool:
    path = SNAP / name
    if not path.exists():
        if os.environ.get("DECODEMON_UPDATE_SNAPSHOTS") == "1":
            path.write_text(svg)
        pytest.fail(f"no baseline {path}: render it, look at it, commit it")
    return path.read_text() == svg


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, RGB rows with their filter bytes) of a PNG this package wrote."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        n = struct.unpack(">I", data[pos:pos + 4])[0]
        tag, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0] == zlib.crc32(tag + body)
        chunks[tag] = body
        pos += 12 + n
    w, h = struct.unpack(">II", chunks[b"IHDR"][:8])
    return w, h, zlib.decompress(chunks[b"IDAT"])


def test_sweep_svg_matches_its_baseline():
    svg = plots.sweep_chart(SWEEP).svg()
    assert matches_baseline("sweep.svg", svg)
    assert svg.count("<circle") == 8 + 3  # eight points, three ceilings in the legend
    assert "OCCUPANCY" in svg and "context depth (log scale)" in svg
    # each point is its depth's median token: the title and the y axis say so, in the SVG and in the PNG's drawing
    assert ">median ms/token against depth</text>" in svg and ">median ms/token</text>" in svg
    texts = [it[3] for it in plots.sweep_chart(SWEEP).items if it[0] == "text"]
    assert "median ms/token" in texts and not any(t.startswith("ms/token") for t in texts)


def test_timeline_svg_marks_each_verdict_change(budget_bars):
    svg = plots.timeline_chart(*TIMELINE).svg()
    assert matches_baseline("timeline.svg", svg)
    assert svg.count('stroke-dasharray="4 3"') == 2 and "LAUNCH → OCCUPANCY" in svg


def test_budget_svg_eager_against_graphed(budget_bars):
    svg = plots.budget_chart(budget_bars).svg()
    assert matches_baseline("budget_eager_vs_graph.svg", svg)
    eager, graph = budget_bars[0][1], budget_bars[1][1]
    # eager: most of the token is the host launching late; graphed: that part is gone
    assert eager["host late (launch)"] > 4 * eager["kernels"] and graph["host late (launch)"] == 0
    assert "20.4 ms/token" in svg and "3.91 ms/token" in svg


def test_png_is_a_valid_file_of_the_same_drawing(budget_bars):
    canvas = plots.budget_chart(budget_bars)
    w, h, raw = read_png(plots.png_bytes(canvas))
    assert (w, h) == (canvas.width, canvas.height) and len(raw) == h * (1 + 3 * w)
    pixels = {raw[i:i + 3] for y in range(h) for i in range(y * (1 + 3 * w) + 1, (y + 1) * (1 + 3 * w), 3)}
    assert bytes.fromhex("d62728") in pixels and bytes.fromhex("1f77b4") in pixels  # launch red, kernels blue


def test_every_glyph_has_seven_rows_of_five_bits():
    assert all(len(rows) == 7 and all(0 <= r < 32 for r in rows) for rows in GLYPHS.values())
    assert set("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ.,-+/%:()") <= set(GLYPHS)


def test_terminal_renderings(budget_bars):
    sweep = plots.sweep_lines(SWEEP)
    assert "OCCUPANCY" in sweep[-2] and sweep[-1].count("BANDWIDTH") == 4
    assert [ln.strip() for ln in sweep[:2]] == ["median", "ms/token ┬"]  # the y axis named above its top
    assert sweep[1].index("┬") == sweep[2].index("│")
    top = next(ln for ln in sweep if "│" in ln and ("*" in ln or "o" in ln.split("│")[-1]))
    assert top.strip().startswith("12 │") and top.endswith("* 12")  # the deepest candidate point is the highest
    eager, graph = plots.budget_lines(budget_bars)[:2]
    assert eager.count("H") > 30 and graph.count("H") == 0 and "3.91 ms/token" in graph
    tl = plots.timeline_lines(*TIMELINE)
    assert tl[2].count("│") == 2 and tl[-1].endswith("LAUNCH → OCCUPANCY")


def test_timeline_of_a_recording_marks_when_the_verdict_was_named():
    points, changes = plots.timeline_of(collect(REC["eager"]))
    assert len(points) > 30 and all(15 < ms < 35 for _, ms in points)
    assert [w for _, w in changes] == ["LAUNCH"] and 0 < changes[0][0] < points[-1][0]


def test_the_terminal_sweep_plot_puts_each_point_on_the_row_labelled_nearest_it_and_writes_its_value():
    # 31.96 beside points up to 71: on 10 rows of 7.5 each, a row labelled by its floor would read 29.8 for it
    lines = plots.sweep_lines([("candidate", [(64, 12.9, "unknown"), (1024, 20.1, "unknown"),
                                              (8192, 31.96, "unknown")]),
                               ("reference", [(64, 70.2, "launch"), (8192, 71.0, "launch")])])
    rows = [(float(ln.split("│")[0]), ln.split("│")[1]) for ln in lines if "│" in ln]
    labels = [label for label, _ in rows]
    hits = [(label, row) for label, row in rows if "*" in row]
    assert len(hits) == 3
    for (label, row), v in zip(sorted(hits, key=lambda h: h[1].index("*")), (12.9, 20.1, 31.96)):
        assert abs(label - v) == min(abs(x - v) for x in labels)  # no other row's label is nearer the point
        assert f"* {v:.4g}" in row
    assert any(ln.startswith("*candidate ") for ln in lines)  # the legend names the command whole
