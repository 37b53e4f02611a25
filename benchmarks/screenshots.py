"""The live screen on a GPU machine, saved as SVG, and the monitor's own CPU cost.

    source benchmarks/device_setup.sh && python benchmarks/screenshots.py OUTDIR
    python benchmarks/screenshots.py --replay docs/img    # any machine: the README's demo_replay.svg, redrawn
                                                          # from the bundled recordings (tests/test_words_one_meaning.py
                                                          # fails when the committed one drifts from it)

1. Two demo engines (eager, graph) on the one GPU; `compare` on both, live, headless at 160x50 for 12 s; the
   screen is saved as OUTDIR/h200_live_compare.svg.
2. The graphed engine alone, the app attached for 15 s at its default refresh: OUTDIR/h200_live_attach_graph.svg,
   and the monitor process's share of a core over that span in OUTDIR/monitor_cpu.json.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import resource
import sys
import time
from pathlib import Path

from decodemon.monitor.app import DecodemonApp

# the README's screenshot: `decodemon demo` with no GPU, the bundled H100 recordings side by side, paused this far in
REPLAY_AT_S = 6.0
REPLAY_SIZE = (160, 50)
REPLAY_SVG = Path(__file__).parents[1] / "docs" / "img" / "demo_replay.svg"


def out_dir() -> Path:
    """OUTDIR from the command line (default: out), made."""
    out = Path([a for a in sys.argv[1:] if a != "--replay"][0] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def start(mode):
    from decodemon.monitor.demo import spawn_engine

    return spawn_engine(["--mode", mode, "--tokens", "0"])


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def shoot(players, seconds, name, size=(160, 50)):
    app = DecodemonApp(players)
    async with app.run_test(size=size) as pilot:
        c0, t0 = cpu_s(), time.monotonic()
        await asyncio.sleep(seconds)
        c1, t1 = cpu_s(), time.monotonic()
        app.save_screenshot(filename=name, path=str(out_dir()))
        await pilot.press("q")
    return (c1 - c0) / (t1 - t0)


def replay_app() -> DecodemonApp:
    """`decodemon demo` with no GPU: the bundled H100 recordings side by side, paused REPLAY_AT_S in (a still
    the test can draw again and hold the committed screenshot to)."""
    from decodemon.monitor.demo import replay_players

    return DecodemonApp(replay_players(), start_at_s=REPLAY_AT_S, paused=True)


async def replay_svg() -> str:
    """The demo's screen at REPLAY_SIZE as SVG, as the README shows it."""
    app = replay_app()
    async with app.run_test(size=REPLAY_SIZE) as pilot:
        await pilot.pause()
        return app.export_screenshot()


def svg_lines(svg: str) -> list[str]:
    """The text an SVG screenshot shows, line by line (its runs joined by row), styles and ids left out."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for attrs, body in re.findall(r"<text([^>]*)>(.*?)</text>", svg, re.S):
        x, y = (float(re.search(fr'\b{k}="([-\d.]+)"', attrs).group(1)) for k in ("x", "y"))
        rows.setdefault(y, []).append((x, html.unescape(body).replace("\u00a0", " ")))
    return [re.sub(r"\s+$", "", "".join(t for _, t in sorted(runs))) for _, runs in sorted(rows.items())]


def replay_shot(out: Path) -> Path:
    """Write the README's demo_replay.svg into `out`."""
    path = out / "demo_replay.svg"
    path.write_text(asyncio.run(replay_svg()))
    return path


def main():
    if {"-h", "--help"} & set(sys.argv[1:]):
        return print(__doc__.strip())
    if "--replay" in sys.argv[1:2]:
        return print(replay_shot(out_dir()))
    res = {}
    (pe, eager), (pg, graph) = start("eager"), start("graph")
    from decodemon.monitor.player import LivePlayer

    res["compare_cpu_fraction"] = asyncio.run(shoot(
        [LivePlayer(eager, label=f"eager pid {eager}"), LivePlayer(graph, label=f"graph pid {graph}")],
        12, "h200_live_compare.svg"))
    pe.terminate()
    pe.wait(timeout=30)
    res["graph_alone_cpu_fraction"] = asyncio.run(shoot(
        [LivePlayer(graph, label=f"graph pid {graph}")], 15, "h200_live_attach_graph.svg", size=(120, 48)))
    pg.terminate()
    pg.wait(timeout=30)
    res["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    (out_dir() / "monitor_cpu.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
