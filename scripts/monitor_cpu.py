"""The monitor's own CPU and memory, on CPU: the app on the graph H200 recording at real speed, at the app's refresh
(REFRESH_S: 0.25 s until the fourteenth session, 0.5 s since) or `--refresh S`.

    python scripts/monitor_cpu.py [--seconds 20] [--warmup 5] [--endless] [--refresh S]

Replaying goes through the same Session, snapshots and panels as a live attach (only the socket differs), so
this is the CPU-machine check of issue 4's "under 10% of one core"; scripts/h200_soak.py measures it live.
`--endless` does not start the recording over at its end: it plays it again with every frame's receive time
shifted, into the same session, as a long live attach fills the monitor's rings (what the H200 soak showed).
"""

import argparse
import asyncio
import resource
import time

from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.player import RecordingPlayer


class EndlessPlayer(RecordingPlayer):
    """The recording over and over into one session, receive times shifted by a loop's length each time."""

    def _advance_to(self, t_ns: int) -> None:
        span = self.end_ns + 1
        while True:
            loop, i = divmod(self._i, len(self.frames))
            rx, frame = self.frames[i]
            if loop * span + rx > t_ns:
                break
            self.session.add(loop * span + rx, frame)
            self._i += 1
        self.clock_ns = t_ns

    def seek(self, t_ns: int) -> None:
        with self._lock:
            self._advance_to(max(int(t_ns), self.clock_ns))

    def tick(self, dt_s: float) -> None:
        with self._lock:
            if not self.paused:
                self._advance_to(self.clock_ns + int(dt_s * self.speed * 1e9))


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024


async def main(a):
    cls = EndlessPlayer if a.endless else RecordingPlayer
    player = cls(a.file, "graph", speed=a.speed, **({} if a.endless else {"loop": True}))
    if a.endless and a.prefill_s:  # as after a long attach: rings full
        player.seek(int(a.prefill_s * 1e9))
    app = DecodemonApp([player], start_at_s=a.start if not a.prefill_s else None,
                       **({"refresh_s": a.refresh} if a.refresh else {}))
    async with app.run_test(size=(160, 50)) as pilot:
        await asyncio.sleep(a.warmup)
        c0, t0, m0 = cpu_s(), time.monotonic(), rss_mb()
        await asyncio.sleep(a.seconds)
        frac = (cpu_s() - c0) / (time.monotonic() - t0)
        m1 = rss_mb()
        await pilot.press("q")
    print(f"monitor CPU: {100 * frac:.1f}% of one core over {a.seconds:g} s; RSS {m0:.1f} → {m1:.1f} MB; "
          f"{player.session.feed.tokens_seen} tokens fed")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=5)
    ap.add_argument("--start", type=float, default=0)
    ap.add_argument("--speed", type=float, default=1.0)
    ap.add_argument("--endless", action="store_true")
    ap.add_argument("--prefill-s", type=float, default=0, help="--endless: feed this many seconds before the screen")
    ap.add_argument("--file", default="tests/data/h200_graph.dmon")
    ap.add_argument("--refresh", type=float, default=None, help="seconds between refreshes (default: the app's)")
    asyncio.run(main(ap.parse_args()))
