"""`decodemon demo`: eager vs CUDA-graphed side by side, live on a GPU or from the bundled H100 recordings."""

from __future__ import annotations

from decodemon.monitor.cli._common import UsageError, add_refresh, add_seconds, bounded, need_terminal, print_json

JSON_SECONDS = 10.0


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("demo", help="eager vs graphed, live on a GPU or from bundled H100 recordings",
                       description="The demo engine eager and CUDA-graphed side by side: live with an NVIDIA GPU, "
                                   "otherwise the H100 recordings shipped with decodemon, looping.")
    p.add_argument("--replay", action="store_true", help="play the bundled recordings even with a GPU")
    p.add_argument("--json", action="store_true", help="print both summaries and the ratios, as `compare --json`")
    p.add_argument("--tokens", type=bounded("--tokens", 0, 1e9, True, allow_zero=True), default=None,
                   help="live only: tokens each engine decodes (default 0: until stopped); refused with the "
                        "recordings")
    p.add_argument("--speed", type=bounded("--speed", 0, 1000), default=None,
                   help="the recordings' app only: playback speed (default 1); refused live and with --json")
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


def check_options(a) -> None:
    """UsageError in one line for an option the demo would ignore: --tokens with the recordings, --speed live or
    with --json, --refresh with --json (no app), --seconds with the recordings' JSON (they are summarised whole)."""
    if a.json and a.refresh is not None:
        raise UsageError("decodemon demo: --refresh is the app's screen refresh, and --json draws no app: drop "
                         "--refresh or --json")
    if a.json and a.speed is not None:
        raise UsageError("decodemon demo: --speed plays the recordings in the app, and --json draws no app: drop "
                         "--speed or --json")
    if a.tokens is None and a.speed is None and not (a.json and a.seconds is not None):
        return
    from decodemon.monitor import demo

    live = demo.live(a.replay)
    why = "--replay plays the bundled recordings" if a.replay else "with no GPU here the bundled recordings play"
    if not live and a.tokens is not None:
        raise UsageError(f"decodemon demo: --tokens sets what the live engines decode, and {why}: drop --tokens")
    if not live and a.json and a.seconds is not None:
        raise UsageError(f"decodemon demo: --seconds with --json is how long the live engines are watched, and "
                         f"{why}, summarised whole: drop --seconds")
    if live and a.speed is not None:
        raise UsageError("decodemon demo: --speed is the recordings' playback speed, and with a GPU the demo runs "
                         "live: add --replay to play the recordings, or drop --speed")


def run(a) -> int:
    """The app, or the JSON."""
    check_options(a)
    tokens, speed = a.tokens or 0, a.speed or 1.0
    if a.json:
        print_json(demo_json(a.replay, tokens, a.seconds or JSON_SECONDS))
        return 0
    need_terminal("demo", "add --json for both summaries instead")
    from decodemon.monitor.demo import run_demo

    return run_demo(replay=a.replay, tokens=tokens, speed=speed, seconds=a.seconds, refresh_s=a.refresh)
