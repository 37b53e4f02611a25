"""On `decodemon demo`'s bundled recordings: each word means one thing on the screen, in `--json`, in DIAGNOSIS and
in help; no line contradicts its neighbour; kernels that share a name are told apart the same way everywhere; and the
README's screenshot is what the app draws now."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from decodemon.monitor.ceilings import SHORT_KERNEL_US
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.render.markdown import diagnosis_markdown
from decodemon.monitor.widgets.help_screen import HELP
from decodemon.monitor.widgets.verdict import VerdictPanel
from tests.conftest import DATA, cli
from tests.test_screens_reasoning import _app, texts

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import screenshots  # noqa: E402

EAGER, GRAPH = DATA / "h200_eager.dmon", DATA / "h200_graph.dmon"


def _line(text: str, name: str) -> str:
    """The inputs line ("← ...") under candidate `name` in the verdict panel's text."""
    lines = text.splitlines()
    at = next(n for n, ln in enumerate(lines) if ln.startswith(name.upper()))
    return next(ln for ln in lines[at + 1:] if ln.strip().startswith("←"))


def test_occupancys_threshold_source_line_and_help_read_the_same_instrument_first():
    for path in (EAGER, GRAPH):
        s, t = texts(path, 10.0, size=(200, 50))
        thr = s.diagnosis.candidates["occupancy"].threshold
        assert thr.startswith("kernel share ≥50% of the step (traced kernels' time ÷ ms/token; with no traced "
                              "window, PM's GPU busy)")
        line = _line(t[VerdictPanel], "occupancy")
        share = line.index(f"kernel share {s.kernel_share_pct:.0f}% of the step")
        assert "its 50% rule reads this" in line
        if s.pm:  # the graphed side: PM's busy is said too, after the figure the rule reads
            assert line.index(f"GPU busy {s.inputs.gpu_busy_pct:.0f}% from PM counters") > share
    assert ("LAUNCH's idle and OCCUPANCY's 50% rule read where a\n               window is traced, PM's GPU busy where "
            "none is") in HELP


def test_launch_divides_by_kernels_and_never_calls_a_graphed_kernel_a_launch():
    s, t = texts(EAGER, 10.0)
    assert f"÷ {s.inputs.kernels_per_token:.0f} kernels/token (traced; each launched by the host)" in t[VerdictPanel]
    g, t = texts(GRAPH, 10.0)
    line = _line(t[VerdictPanel], "launch")
    assert "each a launch" not in line and "launches" not in line.split("÷")[-1]
    assert f"÷ {g.inputs.kernels_per_token:.0f} kernels/token (traced; replayed in 1 graph launch" in line
    assert "over 1864 kernels = 0 µs each" in g.diagnosis.candidates["launch"].detail
    assert "- 0.00 µs idle per kernel, over 1864 kernels/token (replayed in graph launches" in diagnosis_markdown(g)


def test_kernel_share_and_traced_token_busy_are_two_names_for_two_figures():
    j = json.loads(cli("replay", EAGER, "--json").stdout)
    assert j["gpu_busy_pct"] == j["kernel_share_of_step_pct"]  # no PM: the kernel share stands in
    assert 18.5 <= j["kernel_share_of_step_pct"] <= 19.5  # 19% on the screen; 19.3 over the whole recording
    assert j["gpu_busy_source"] == "the kernel share (traced kernel time ÷ ms/token)"
    assert j["traced_token_busy_pct"] == j["traced_gpu_busy_pct"]  # the old key kept, the same figure
    assert j["traced_token_busy_pct"] < j["kernel_share_of_step_pct"]  # the traced token: stretched by tracing
    g = json.loads(cli("replay", GRAPH, "--json").stdout)
    # PM against the kernels over the same samples: a figure of its own, under a name of its own
    assert set(g["pm_vs_window"]) == {"samples", "pm_gpu_busy_pct", "window_gpu_busy_pct", "over"}
    assert g["pm_vs_window"]["over"].startswith(f"the {g['pm_vs_window']['samples']} PM samples wholly inside")
    for words in ("kernel_share_of_step_pct", "traced_token_busy_pct", "traced_gpu_busy_pct is its\n               "
                  "older name"):
        assert words in HELP
    s, t = texts(EAGER, 10.0)
    assert "(traced)" not in " ".join(t.values())


def _holds(a: float, b: float, rel: float = 0.02) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def test_every_equals_in_the_bandwidth_chain_holds():
    for path in (EAGER, GRAPH):
        s, t = texts(path, 10.0)
        line = _line(t[VerdictPanel], "bandwidth")
        m = re.search(r"([\d.]+) ms/token \(.*?\) ÷ floor ([\d.]+) ms = ([\d.]+)×; floor ([\d.]+) ms = ([\d.]+) "
                      r"GB/token \(.*?\) ÷ ([\d.]+) GB/s", line)
        assert m, line
        ms, floor, ratio, floor2, gb, gbs = map(float, m.groups())
        assert _holds(ms / floor, ratio) and floor == floor2 and _holds(gb / gbs * 1e3, floor), line


def test_each_bandwidth_source_is_named_for_who_measured_it():
    for path in (EAGER, GRAPH):
        s, t = texts(path, 10.0)
        assert s.bandwidth_source.startswith("measured copy (the engine adapter's")
        assert "(engine adapter's measured copy)" in _line(t[VerdictPanel], "bandwidth")
    assert "decodemon's measured copy" in HELP and "the engine adapter's measured copy" in HELP


def test_the_header_and_bandwidths_source_name_one_statistic_the_same_way():
    from decodemon.monitor.widgets.header import HeaderPanel

    s, t = texts(GRAPH, 1.5)  # the first frames: the clock's seconds are not yet the span's
    tk = s.tokens
    assert tk.span_s < 0.8 * s.span_s
    assert f"mean over {tk.span_s:.1f} s ({tk.tokens} tokens timed" in t[HeaderPanel]
    assert f"(median over {tk.span_s:.1f} s, {tk.tokens} tokens timed" in _line(t[VerdictPanel], "bandwidth")


def test_help_says_once_what_each_word_means():
    glossary = HELP[HELP.index("words, each with one meaning:"):]
    for word in ("traced", "kernel", "launch", "GPU busy", "kernel share", "traced-token busy", "engine"):
        assert len(re.findall(rf"^  {re.escape(word)}  ", glossary, re.M)) == 1, word


def test_kernels_that_share_a_name_are_told_apart_alike_everywhere():
    j = json.loads(cli("replay", EAGER, "--json").stdout)
    rows = j["kernels"]
    labels = [r["label"] for r in rows]
    assert len(set(labels)) == len(labels)
    assert sum(r["name"] == "native::elementwise_kernel" for r in rows) == 3  # `name` kept
    assert "native::elementwise_kernel<direct_copy,BFloat16>" in labels
    s, _ = texts(EAGER, 10.0)
    md = diagnosis_markdown(s)
    table = md[md.index("## Kernels that leave"):]
    for r in sorted(s.window.kernels, key=lambda r: -r.idle_sm_us_per_token)[:5]:
        assert f"`{r.label}`" in table
    # the hot small grids the OCCUPANCY detail lists are the table's rows, by their labels and grids
    detail = s.diagnosis.candidates["occupancy"].detail
    by_label = {r.label: r for r in s.window.kernels}
    listed = re.findall(r"(?:grids: |, )(\S+) grid=(\d+) \((\d+) µs/token\)", detail)
    assert listed
    for label, grid, us in listed:
        assert by_label[label].grid_blocks == int(grid) and round(by_label[label].us_per_token) == int(us)
        assert by_label[label].us_mean >= SHORT_KERNEL_US
    short = [r for r in s.window.kernels
             if r.grid_coverage_pct < 25 and not r.is_collective and r.us_mean < SHORT_KERNEL_US]
    assert (f"not listed: {len(short)} kernels of calls under {SHORT_KERNEL_US:g} µs "
            f"({sum(r.us_per_token for r in short):.0f} µs/token), held by their fixed latency") in detail
    assert "native::elementwise_kernel<BFloat16,Mul>" not in detail  # 2/132, 498 µs/token: a short call, said why


def test_the_kernels_panel_shows_the_labels():
    from decodemon.monitor.widgets.kernels import KernelsPanel

    async def cells():
        app = _app(EAGER, 10.0)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            table = app.query_one(KernelsPanel)
            return [str(table.get_row_at(n)[0]) for n in range(table.row_count)]

    shown = asyncio.run(cells())
    assert "native::elementwise_kernel<BFloat16,Mul>" in shown and len(set(shown)) == len(shown)


def test_the_readmes_screenshot_is_what_the_demo_draws_now():
    """docs/img/demo_replay.svg is redrawn by `python benchmarks/screenshots.py --replay docs/img`: its text is the
    app's now, line for line (pixels and styles aside)."""
    now = screenshots.svg_lines(asyncio.run(screenshots.replay_svg()))
    committed = screenshots.svg_lines(screenshots.REPLAY_SVG.read_text())
    assert committed == now, "docs/img/demo_replay.svg drifted: python benchmarks/screenshots.py --replay docs/img"


def test_kernels_of_one_short_name_that_are_not_mangled_are_labelled_by_their_full_names():
    from decodemon.monitor.analysis.names import kernel_tags, tagged

    names = [("k1 [x]", "[x]", 8), ("k2 [x]", "[x]", 8), ("solo", "solo", 4)]
    assert [tagged(s, t, f) for (f, s, _), t in zip(names, kernel_tags(names))] == ["k1 [x]", "k2 [x]", "solo"]
    alike = [("_ZN2at6native6kernelILi4EEEvv", "native::kernel", 2),
             ("_ZN2at6native6kernelILi8EEEvv", "native::kernel", 4)]
    assert kernel_tags(alike) == ["grid 2", "grid 4"]  # no template word tells them apart: their grids do
