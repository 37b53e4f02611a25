"""The README's demo screenshot: `decodemon demo` from the bundled H200 recordings, as a CPU machine shows it.

    python scripts/readme_screenshots.py   # writes docs/img/demo_replay.svg
"""

import asyncio
from pathlib import Path

from decodemon.monitor.app import DecodemonApp
from decodemon.monitor.demo import bundled_recordings
from decodemon.monitor.player import RecordingPlayer


async def main():
    a, b = bundled_recordings()
    players = [RecordingPlayer(a, "eager (H200 recording)", loop=True),
               RecordingPlayer(b, "graph (H200 recording)", loop=True)]
    app = DecodemonApp(players, start_at_s=6.0)
    async with app.run_test(size=(160, 48)) as pilot:
        await asyncio.sleep(2.0)
        out = Path(__file__).resolve().parents[1] / "docs" / "img"
        app.save_screenshot(filename="demo_replay.svg", path=str(out))
        await pilot.press("q")


if __name__ == "__main__":
    asyncio.run(main())
