"""`decodemon grade SOURCE`: measure again and grade the latest open prediction of the same loop.

The grade is "right number, right reason", "right number, other reason" (the ceiling moved in a way nobody
predicted), "right number, reason unmeasured" (no ceiling measured to bind) or "wrong" (with how it missed), with
the new ceiling and the measured change (`decodemon.monitor.ledger`)."""

from __future__ import annotations

import os
import sys

from decodemon.monitor import ledger
from decodemon.monitor.cli._common import UsageError, live_seconds, print_json, say
from decodemon.monitor.cli.predict import add_source_opts, measure, read_ledger
from decodemon.monitor.safe_text import visible_lines


def add_parser(subparsers) -> None:
    """Register `grade`."""
    p = subparsers.add_parser("grade", help="measure again and grade the latest open prediction",
                              description="Measure SOURCE and grade the latest ungraded prediction of the same loop "
                                          "in the ledger; the grade is appended to it.")
    add_source_opts(p, json_help="print the grade entry as JSON")
    p.add_argument("--markdown", action="store_true", help="then print the ledger's entries for this label as Markdown")
    p.set_defaults(fn=run)


add = add_parser


def run(a) -> int:
    """Measure, grade, append, print the grade; exit 2 when there is no ledger at all, 3 when it holds no open
    prediction for the loop or this run cannot be held against it (ledger.NotGraded: it stays open)."""
    live_seconds(a, "grade", [a.source], None)  # --seconds on a recording: said before the ledger is read
    try:
        if not os.path.lexists(a.ledger):  # no ledger is a wrong path, not a loop with nothing measured
            raise UsageError(f"decodemon grade: no ledger at {a.ledger} (`decodemon predict` writes one; "
                             "--ledger PATH names another)")
        entries = read_ledger(a.ledger)
        if not ledger.open_predictions(entries, a.label):  # --label: its own, known before the attach
            say("grade", ledger.none_open(a.ledger, entries, a.label))
            return 3
        ledger.check_writable(a.ledger)  # before the attach, not after it
        summary, label = measure(a)
        todo = ledger.open_predictions(entries, label)
        if not todo:
            say("grade", ledger.none_open(a.ledger, entries, label))
            return 3
        g = ledger.grade(todo[-1], summary)
        ledger.append(a.ledger, g)
    except ledger.NotGraded as exc:  # the run measured, but cannot be held against the prediction: it stays open
        say("grade", str(exc))
        return 3
    except ledger.LedgerError as exc:
        raise UsageError(f"decodemon grade: {exc}") from None
    # the sentence goes beside --json's document, not into it (as predict's does)
    say("grade", f"{label}, prediction {g['prediction']}: {g['text']}", file=sys.stderr if a.json else sys.stdout)
    if a.json:
        print_json(g)
    if a.markdown:
        print(visible_lines(ledger.ledger_markdown(entries + [g], label, {**g["state"], "source": label})))
    return 0
