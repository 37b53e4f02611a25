"""`decodemon predict SOURCE --change TEXT --expect -60%`: seal a prediction in the ledger before a change.

The write-it-down rule: which ceiling binds, what will change, and how much ms/token should move, written down
with the state measured at that moment, so that `decodemon grade` can later tell a win for the predicted reason
from a coincidence."""

from __future__ import annotations

import argparse
import re

from decodemon.monitor import ledger
from decodemon.monitor.cli._common import (UsageError, add_probe, add_seconds, add_source, attach_settings, bounded,
                                           live_seconds, print_json, say)
from decodemon.monitor.safe_text import visible

LIVE_SECONDS = 10.0


def _label(text: str) -> str:
    """A loop's name: 1 to 256 printable characters, not only spaces."""
    if not text.strip() or len(text) > 256 or not text.isprintable():
        raise argparse.ArgumentTypeError(f"--label takes a name of 1 to 256 printable characters, not "
                                         f"{visible(text)!r}")
    return text


def add_source_opts(p, json_help: str = "print the sealed entry as JSON") -> None:
    """SOURCE, --ledger, --label, --json and --seconds: what predict and grade share."""
    add_source(p)
    p.add_argument("--ledger", default=ledger.DEFAULT_PATH, metavar="PATH",
                   help=f"the ledger file (default ./{ledger.DEFAULT_PATH})")
    p.add_argument("--label", metavar="NAME", type=_label,
                   help="what names this loop across runs (default: its script or -m module)")
    p.add_argument("--json", action="store_true", help=json_help)
    add_seconds(p, None, f"a pid: seconds to measure (default {LIVE_SECONDS:g}); a recording is read whole")
    add_probe(p)


def measure(a) -> tuple[dict, str]:
    """Collect SOURCE; (its summary_json, the loop's label)."""
    from decodemon.monitor.render import summary_json
    from decodemon.monitor.sources.collect import collect, source_of
    from decodemon.monitor.span import summary_snapshot

    kind, _ = source_of(a.source)
    seconds = live_seconds(a, a.command, [a.source], LIVE_SECONDS if kind == "pid" else None)
    sess = collect(a.source, attach_settings(a), seconds)
    summary = summary_json(summary_snapshot(sess))  # the whole span measured, as replay and report summarise it
    summary = ledger.with_recording(summary, a.source) if kind == "file" else summary
    fallback = f"pid {a.source}" if kind == "pid" else str(a.source)
    argv = sess.feed.hello.argv if sess.feed.hello else ()
    return summary, a.label or ledger.loop_label(argv, fallback)


def read_ledger(path) -> list[dict]:
    """The ledger's entries; each line that is not one is named on stderr (and left in the file)."""
    entries, problems = ledger.read(path)
    for line in problems:
        say("", f"decodemon: {line}")
    return entries


def add_parser(subparsers) -> None:
    """Register `predict`."""
    p = subparsers.add_parser("predict", help="seal a prediction in the ledger before a change",
                              description="Measure SOURCE and append a sealed prediction to the ledger: the ceiling "
                                          "that binds, the change, and the expected ms/token change.")
    add_source_opts(p)
    p.add_argument("--change", required=True, metavar="TEXT", help='what you will change, e.g. "capture a graph"')
    p.add_argument("--expect", required=True, metavar="CHANGE",
                   help="the expected ms/token change (-60%%) or the ms/token expected after it (3.9ms)")
    p.add_argument("--ceiling", metavar="NAME", help="the ceiling the change acts on (default: the measured one)")
    p.add_argument("--then", metavar="NAME", help="the ceiling you expect to bind after the change")
    p.add_argument("--tolerance", type=bounded("--tolerance", 0, ledger.MAX_TOLERANCE_PCT, allow_zero=True), default=ledger.DEFAULT_TOLERANCE_PCT, metavar="POINTS",
                   help=f"percentage points the measured change may miss by (default {ledger.DEFAULT_TOLERANCE_PCT:g})")
    # `--expect -60%` as the value it is, not an unknown option (argparse takes only plain numbers so)
    p._negative_number_matcher = re.compile(r"^-\d*\.?\d+(%|ms)?$")
    p.set_defaults(fn=run)


add = add_parser


def run(a) -> int:
    """Measure, seal, append, and say what was sealed."""
    if not a.change.strip():
        raise UsageError("decodemon predict: --change says what you will change, e.g. \"capture a graph\"; it is "
                         "empty")
    live_seconds(a, "predict", [a.source], None)  # --seconds on a recording: said before the ledger is read
    try:
        ledger.parse_expect(a.expect)  # a typo costs no attach
        read_ledger(a.ledger)
        ledger.check_writable(a.ledger)  # before the attach, not after it
        summary, label = measure(a)
        if not summary.get("ms_per_token"):  # nothing measured to predict a change from (exit 3)
            from decodemon.monitor.sources.errors import NothingMeasured

            raise NothingMeasured(f"{label}: no ms/token measured, so there is nothing to predict a change from")
        entry = ledger.prediction(summary, label, a.change, a.expect, a.ceiling, a.then, a.tolerance)
        ledger.append(a.ledger, entry)
        already = [ledger.pred_id(e) for e in ledger.open_predictions(ledger.read(a.ledger)[0], label)][:-1]
    except ledger.LedgerError as exc:
        raise UsageError(f"decodemon predict: {exc}") from None
    st = entry["state"]
    ceiling = entry["ceiling"].upper()
    binds = ("no ceiling named" if ceiling == "UNKNOWN" else f"{ceiling} named by you" if a.ceiling and
             ceiling != st["verdict"].upper() else f"{ceiling} binds")
    say("predict", f"sealed {ledger.pred_id(entry)} for {label}: {binds} "
                   f"(measured {st['verdict'].upper()}, {st['ms_per_token']:.4g} {ledger.unit_words(st)[0]}); "
                   f"{a.change} → {entry['expect_pct']:+.1f}% ± {a.tolerance:g}; in {a.ledger}")
    if already:  # grade (and the next attach or report) grades the newest open one of the loop
        say("predict", f"{label} has {len(already)} older open prediction{'s' if len(already) > 1 else ''} "
                       f"({', '.join(already)}): the next grade takes this newest one; the older stay open")
    if a.json:
        print_json(entry)
    return 0
