"""The monitor's own CPU cost, on CPU: the app on the graph H200 recording at real speed (4 refreshes a second).

    python scripts/monitor_cpu.py [--seconds 20] [--start 0]

Replaying goes through the same Session, snapshots and panels as a live attach (only the socket differs), so
this is the CPU-machine check of issue 4's "under 10% of one core"; scripts/h200_screenshot.py measures it live.
"""

import argparse
import asyncio
import resource
import time

from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.player import RecordingPlayer


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main(seconds, start, path):
    app = DecodemonApp([RecordingPlayer(path, "graph", loop=True)], start_at_s=start)
    async with app.run_test(size=(120, 48)) as pilot:
        await asyncio.sleep(1.0)
        c0, t0 = cpu_s(), time.monotonic()
        await asyncio.sleep(seconds)
        frac = (cpu_s() - c0) / (time.monotonic() - t0)
        await pilot.press("q")
    print(f"monitor CPU: {100 * frac:.1f}% of one core over {seconds:g} s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--start", type=float, default=0)
    ap.add_argument("--file", default="tests/data/h200_graph.dmon")
    a = ap.parse_args()
    asyncio.run(main(a.seconds, a.start, a.file))
