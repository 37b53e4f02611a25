"""`decodemon replay FILE ...`: play recordings in the app, or summarise them (`--json`).

Several files are the ranks of one tensor-parallel group, shown as the group (two runs side by side:
`decodemon compare`)."""

from __future__ import annotations

import argparse

from decodemon.monitor.cli._common import (UsageError, add_last, add_refresh, add_seconds, bounded, live_seconds,
                                           need_json_for_last, need_terminal, print_json, say, without_tokens)
from decodemon.monitor.sources.errors import CUT_SHORT


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("replay", help="play a recording in the app, or summarise it with --json",
                       description="Play .dmon recordings on a virtual clock (space pauses, arrows seek; the screen "
                                   "shows the last 5 s), or print the summary of the whole recording (--last S: of "
                                   "its last S seconds). Several files: one per rank of a tensor-parallel group.")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true",
                   help="print the summary of the whole recording instead of opening the app (its first key, "
                        "span, says what it covers; rolling_5s gives the last 5 s beside it)")
    add_last(p)
    p.add_argument("--speed", type=bounded("--speed", 0, 1000), default=None,
                   help="playback speed in the app (default 1)")
    p.add_argument("--at", type=bounded("--at", 0.0, 1e6, allow_zero=True), default=None, metavar="S",
                   help="start at this many seconds into the recording")
    p.add_argument("--paused", action="store_true", help="open paused (space plays)")
    add_seconds(p, None, argparse.SUPPRESS)  # refused in words: a recording is read whole (live_seconds)
    add_refresh(p)
    p.set_defaults(fn=run)


def run(a) -> int:
    """The summary (--json) or the app."""
    from decodemon.monitor.sources.collect import source_of

    for f in a.files:
        if source_of(f)[0] == "pid":
            raise UsageError(f"decodemon replay: {f}: replay takes recordings; to watch a live pid use "
                             f"`decodemon attach {f}`")
    if a.json and (a.at is not None or a.paused or a.speed is not None):
        raise UsageError("decodemon replay: --at, --paused and --speed place the app's playback; --json summarises the "
                         "whole recording, or its last S seconds with --last S (see `decodemon replay --help`)")
    live_seconds(a, "replay", a.files, None)
    need_json_for_last(a, "replay")
    snaps = None
    if a.json or len(a.files) > 1:
        from decodemon.monitor.sources.collect import collect_recording
        from decodemon.monitor.span import summary_snapshot

        snaps = []
        for f in a.files:  # each read to its end, then summarised
            sess = collect_recording(f)
            snaps.append(summary_snapshot(sess, a.last))
    if len(a.files) > 1:  # one recording per rank: the group view, as `attach --json` shows it live
        from decodemon.monitor.ranks import not_one_group

        why = not_one_group(snaps, a.files)
        if why is not None:
            raise UsageError(f"decodemon replay: {why}")
    if a.json:
        from decodemon.monitor.render import summary_json

        empty = without_tokens("replay", snaps)
        if empty is not None:
            return empty
        for f, snap in zip(a.files, snaps):  # its figures stand, over what the file holds: said once, on stderr
            if (snap.ended or "").startswith(CUT_SHORT):
                say("replay", f"{f}: {snap.ended}; the figures are of what it holds")
        out = summary_json(snaps[0])
        if len(snaps) > 1:
            from decodemon.monitor.ranks import combine

            out["group"] = combine(snaps)
            # the top level is one file's: said, so that the order of the files given is not a silent choice
            out["group"]["top_level"] = (f"the top level is {a.files[0]}'s alone, the first file given; each "
                                         "rank's figures are under ranks")
        print_json(out)
        return 0
    need_terminal("replay")
    from decodemon.monitor.app import run_app

    return run_app(a.files, speed=a.speed or 1.0, start_at_s=a.at, paused=a.paused, group=len(a.files) > 1,
                   refresh_s=a.refresh)
