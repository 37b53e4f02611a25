"""The live screen on a GPU machine, saved as SVG, and the monitor's own CPU cost.

    source benchmarks/device_setup.sh && python benchmarks/screenshots.py OUTDIR
    python benchmarks/screenshots.py --replay OUTDIR      # any machine: the README's demo_replay.svg

1. Two demo engines (eager, graph) on the one GPU; `compare` on both, live, headless at 160x50 for 12 s; the
   screen is saved as OUTDIR/h200_live_compare.svg.
2. The graphed engine alone, the app attached for 15 s at its default refresh: OUTDIR/h200_live_attach_graph.svg,
   and the monitor process's share of a core over that span in OUTDIR/monitor_cpu.json.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path

from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.player import LivePlayer
from decodemon.monitor.demo import spawn_engine

OUT = Path([a for a in sys.argv[1:] if a != "--replay"][0] if len(sys.argv) > 1 else "out")
OUT.mkdir(parents=True, exist_ok=True)


def start(mode):
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
        app.save_screenshot(filename=name, path=str(OUT))
        await pilot.press("q")
    return (c1 - c0) / (t1 - t0)


def replay_shot():
    """`decodemon demo` with no GPU: the bundled H200 recordings side by side, 6 s in, at 160x50."""
    from decodemon.monitor.demo import bundled_recordings
    from decodemon.monitor.player import make_player

    eager, graph = bundled_recordings()
    players = [make_player(eager, label="eager (H200)"), make_player(graph, label="graph (H200)")]
    asyncio.run(shoot(players, 6, "demo_replay.svg"))


def main():
    if "--replay" in sys.argv[1:2]:
        return replay_shot()
    res = {}
    (pe, eager), (pg, graph) = start("eager"), start("graph")
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
    (OUT / "monitor_cpu.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
