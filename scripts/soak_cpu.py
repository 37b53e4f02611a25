"""An hour attached, on CPU: memory in both processes must stay flat (ring buffers).

    python scripts/soak_cpu.py [--minutes 60] [--out docs/soak-cpu.json]

Two feeds at once, each into its own monitor `Session` with a snapshot taken
4 times a second (what the app does):
  live   - a tiny CPU demo engine (decodemon run), attached the whole time;
  replay - the committed eager H200 recording (1,863 kernels per token) looped
           at its real rate, frame times shifted each loop.
Every minute: RSS of the monitor and of the engine, frames seen, dropped
records. The JSON written at the end is what docs/reliability.md quotes.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

from decodemon.monitor.client import live_frames, recording_frames
from decodemon.monitor.session import Session
from decodemon.monitor.demo import spawn_engine

ROOT = Path(__file__).resolve().parents[1]


def rss_kb(pid) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--out", default=str(ROOT / "docs" / "soak-cpu.json"))
    a = ap.parse_args()
    eng, pid = spawn_engine(["--tiny", "--device", "cpu", "--tokens", "0"])
    stop = threading.Event()
    live, rep = Session("live"), Session("replay")
    lock = threading.Lock()
    counts = {"live_frames": 0, "replay_frames": 0, "replay_loops": 0}

    def run_live():
        for rx, _, f in live_frames(pid, stop=stop.is_set):
            with lock:
                live.add(rx, f)
                counts["live_frames"] += 1

    def run_replay():
        frames = [(rx, f) for rx, _, f in recording_frames(ROOT / "tests/data/h200_eager.dmon")][1:]
        span = frames[-1][0] + 1
        t0 = time.monotonic()
        loop = 0
        while not stop.is_set():
            for rx, f in frames:
                due = t0 + (loop * span + rx) / 1e9
                while time.monotonic() < due and not stop.is_set():
                    time.sleep(max(0.0, min(0.05, due - time.monotonic())))
                with lock:
                    rep.add(loop * span + rx, f)
                    counts["replay_frames"] += 1
            loop += 1
            counts["replay_loops"] = loop

    threads = [threading.Thread(target=run_live, daemon=True), threading.Thread(target=run_replay, daemon=True)]
    for t in threads:
        t.start()
    samples = []
    t_start = time.monotonic()
    next_sample = t_start
    while time.monotonic() - t_start < a.minutes * 60:
        with lock:
            sl, sr = live.snapshot(), rep.snapshot()
        if time.monotonic() >= next_sample:
            samples.append({"t_min": round((time.monotonic() - t_start) / 60, 2), "monitor_rss_kb": rss_kb("self"),
                            "engine_rss_kb": rss_kb(pid), **counts,
                            "live_tokens_seen": sl.tokens_total, "live_marks_held": len(live.feed.marks),
                            "replay_windows_in_memory": len(rep.feed.windows),
                            "dropped_records": sl.dropped_records + sr.dropped_records,
                            "replay_verdict": sr.rolling.ceiling})
            print(json.dumps(samples[-1]), flush=True)
            next_sample += 60
        time.sleep(0.25)
    stop.set()
    eng.terminate()
    eng.wait(timeout=30)
    first, last = samples[1] if len(samples) > 1 else samples[0], samples[-1]
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "minutes": a.minutes,
           "command": "python scripts/soak_cpu.py --minutes %g" % a.minutes, "samples": samples,
           "monitor_rss_growth_kb_after_first_minute": last["monitor_rss_kb"] - first["monitor_rss_kb"],
           "engine_rss_growth_kb_after_first_minute": last["engine_rss_kb"] - first["engine_rss_kb"]}
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}))


if __name__ == "__main__":
    main()
