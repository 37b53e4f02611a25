"""`decodemon sweep "CMD {depth}" --depths 64,512,2048,8192`: the decode command at each depth, attached at each.

Prints the table, a terminal plot of the median ms/token against depth and one sentence on the divergence; with
-o DIR also writes sweep.json, sweep.md, sweep.svg, sweep.png and one recording per run (`--replay DIR` rebuilds
from those)."""

from __future__ import annotations

import argparse
from pathlib import Path

from decodemon.monitor.cli._common import (INTEGER, UsageError, add_probe, add_seconds, attach_settings, bounded,
                                           print_json, probe_flags, say)
from decodemon.monitor.safe_text import visible, visible_lines


DEFAULT_DEPTHS = (64, 512, 2048, 8192)
SECONDS = 15.0  # attached at each depth


def depth_list(text: str) -> list[int]:
    """'64,512,2048' → [64, 512, 2048]; each a whole number ≥ 1."""
    parts = [x for x in text.replace(" ", "").split(",") if x]
    if not all(INTEGER.fullmatch(x) for x in parts):  # int() also reads '1_000' and other scripts' digits
        raise argparse.ArgumentTypeError(f"--depths takes whole numbers in digits 0-9 separated by commas, not "
                                         f"{visible(text)!r}")
    out = [int(x) for x in parts]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"--depths takes depths of at least 1, not {text!r}")
    return out


def add_parser(subparsers) -> None:
    """Register `sweep`."""
    p = subparsers.add_parser("sweep", help="the decode command at several context depths, a table and a plot",
                              description="Start CMD (with {depth} where the depth goes) once per depth with the agent "
                                          "loaded, attach for --seconds, stop it; then the table and the plot of "
                                          "each depth's median ms/token, and which resource depth consumes.")
    p.add_argument("cmd", nargs="?", metavar="CMD", help='the decode command, e.g. "python loop.py --ctx {depth}"')
    p.add_argument("--depths", type=depth_list, default=None, metavar="D,D,...",
                   help="the depths, short to the shipping context (default 64,512,2048,8192)")
    p.add_argument("--reference", metavar="CMD", help="a reference command, run beside at each depth")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="write sweep.json, sweep.md, sweep.svg, sweep.png and each run's recording here")
    p.add_argument("--replay", metavar="DIR", help="rebuild a sweep from the recordings a sweep -o DIR kept")
    add_seconds(p, None, f"seconds attached at each depth (default {SECONDS:g}; the figures are the last 5 s)")
    p.add_argument("--start-timeout", type=bounded("--start-timeout", 0, 3600), default=180.0, metavar="S",
                   help="seconds a run may take to load its agent (default 180)")
    p.add_argument("--json", action="store_true", help="print the sweep as JSON instead of the table")
    add_probe(p)
    p.set_defaults(fn=run)


add = add_parser


def _outdir(path) -> Path:
    """The output folder, made if new (safe_write.make_dir: through no other user's link)."""
    from decodemon.monitor import safe_write

    if not str(path).strip():
        raise UsageError("decodemon sweep: -o is empty: give a directory")
    try:
        return safe_write.make_dir(path)
    except safe_write.Refused as exc:
        raise UsageError(f"decodemon sweep: {exc}") from None


def run(a) -> int:
    """Sweep (or rebuild one), print it, write it."""
    from decodemon.monitor import plots, sweep

    if bool(a.cmd) == bool(a.replay):
        raise UsageError("decodemon sweep: give a command with {depth}, or --replay DIR (see `decodemon sweep --help`)")
    if a.replay and a.depths is not None:
        raise UsageError("decodemon sweep: --depths is for a sweep that runs; a replay has the depths its "
                         "recordings hold")
    if a.replay and probe_flags(a):
        raise UsageError(f"decodemon sweep: {', '.join(probe_flags(a))} set the probe of each run of a sweep; a "
                         "replay reads the recordings it kept, made with the probe's settings of the time")
    if a.replay and a.seconds is not None:
        raise UsageError("decodemon sweep: --seconds is how long each run of a sweep is attached; a replay reads "
                         "the recordings it kept whole (see `decodemon sweep --help`)")
    a.depths = a.depths or list(DEFAULT_DEPTHS)
    a.seconds = a.seconds if a.seconds is not None else SECONDS
    try:
        for t in ([] if a.replay else [a.cmd] + ([a.reference] if a.reference else [])):
            sweep.argv_at(t, a.depths[0])
    except sweep.SweepError as exc:
        raise UsageError(f"decodemon sweep: {exc}") from None
    out = None
    # checked before a sweep runs (minutes) or a replay reads: a path it cannot write is one line now
    if a.output is not None:
        out = _outdir(a.output)
        from decodemon.monitor import safe_write

        for name in sweep.OUTPUT_NAMES:
            if (out / name).is_dir() and not (out / name).is_symlink():
                raise UsageError(f"decodemon sweep: cannot write {out / name}: it is a directory")
            try:
                safe_write.check(out / name)
            except safe_write.Refused as exc:
                raise UsageError(f"decodemon sweep: {exc}") from None
    try:
        if a.replay:
            result = sweep.replay(a.replay)
        else:
            result = sweep.sweep(a.cmd, a.depths, a.reference, a.seconds, attach_settings(a), out,
                                 runner=lambda *x, **k: sweep.run_point(*x, start_timeout_s=a.start_timeout, **k),
                                 on_point=_progress)
    except sweep.SweepError as exc:
        raise UsageError(f"decodemon sweep: {exc}") from None
    if a.json:
        print_json(result)
    else:
        md = sweep.markdown(result).splitlines()
        print(visible_lines("\n".join(line for line in md if line.startswith("|"))))
        print()
        print(visible_lines("\n".join(plots.sweep_lines(sweep.series_of(result["points"])))))
        print()
        print(visible_lines(result["divergence"]))
        for line in (x for x in md if x.startswith("The DRAM counters read otherwise")):
            print()
            print(visible_lines(line))
        if result.get("rebuilt_note"):
            print()
            print(visible_lines(f"Rebuilt: {result['rebuilt_note']}."))
    measured = any(p.get("ms_per_token") for p in result["points"])
    if out is not None and measured:  # a replay only reads its directory; -o says where to write (its recordings too)
        written = sweep.write_outputs(result, out, copy_from=a.replay)
        say("sweep", f"wrote {', '.join(str(p) for p in written)}")
    elif out is not None:
        say("sweep", f"no depth was measured; nothing written to {out}")
    return 0 if measured else 3


def _progress(pt: dict) -> None:
    if pt.get("error"):  # the error quotes the command's own stderr: say() shows its escapes as text
        say("sweep", f"{pt['command']} at depth {pt['depth']}: {pt['error']}")
    else:
        say("sweep", f"{pt['command']} at depth {pt['depth']}: median {pt['ms_per_token']:.4g} ms/token, "
                     f"{pt['verdict'].upper()}")
