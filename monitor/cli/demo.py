"""`decodemon demo`: eager vs CUDA-graphed side by side, live on a GPU or from the bundled H200 recordings."""

from __future__ import annotations

from decodemon.monitor.cli._common import add_refresh, add_seconds, bounded, need_terminal, print_json

JSON_SECONDS = 10.0


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("demo", help="eager vs graphed, live on a GPU or from bundled H200 recordings",
                       description="The demo engine eager and CUDA-graphed side by side: live with an NVIDIA GPU, "
                                   "otherwise the H200 recordings shipped with decodemon, looping.")
    p.add_argument("--replay", action="store_true", help="play the bundled recordings even with a GPU")
    p.add_argument("--json", action="store_true", help="print both summaries and the ratios, as `compare --json`")
    p.add_argument("--tokens", type=bounded("--tokens", 0, 1e9, True, allow_zero=True), default=0,
                   help="live: tokens each engine decodes (default 0: until stopped)")
    p.add_argument("--speed", type=bounded("--speed", 0, 1000), default=1.0, help="recordings: playback speed")
    add_seconds(p, None, f"quit after this many seconds (live --json: watch this long, default {JSON_SECONDS:g})")
    add_refresh(p)
    p.set_defaults(fn=run)


def demo_json(replay: bool, tokens: int, seconds: float) -> dict:
    """`compare --json` of the two demo loops: the bundled recordings, or the live engines for `seconds`."""
    from decodemon.monitor import demo
    from decodemon.monitor.cli.compare import collect_both, compare_json

    if not demo.live(replay):
        return compare_json(*collect_both(demo.bundled_recordings(), None, None))
    with demo.demo_engines(tokens) as pids:
        return compare_json(*collect_both(pids, demo.demo_settings(), seconds))


def run(a) -> int:
    """The app, or the JSON."""
    if a.json:
        print_json(demo_json(a.replay, a.tokens, a.seconds or JSON_SECONDS))
        return 0
    need_terminal("demo", "add --json for both summaries instead")
    from decodemon.monitor.demo import run_demo

    return run_demo(replay=a.replay, tokens=a.tokens, speed=a.speed, seconds=a.seconds, refresh_s=a.refresh)
