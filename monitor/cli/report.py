"""`decodemon report SOURCE`: DIAGNOSIS.md for a pid or a recording (to stdout, or a file with -o)."""

from __future__ import annotations


from decodemon.monitor.cli._common import (UsageError, add_last, add_probe, add_seconds, add_source, attach_settings,
                                           live_seconds, print_json, say, without_tokens)

LIVE_SECONDS = 10.0


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("report", help="write DIAGNOSIS.md for a pid or a recording",
                       description="The binding ceiling, a number per candidate, the predicted win and how to "
                                   "prove it wrong, as Markdown, over the whole recording or the seconds watched "
                                   "(--last S: their last S seconds); its first lines say what it covers.")
    add_source(p)
    p.add_argument("-o", "--output", metavar="FILE", help="write the Markdown here instead of stdout")
    p.add_argument("--json", action="store_true", help="print the JSON summary (with -o, the file is written too)")
    add_seconds(p, None, f"a pid only: seconds to watch, all of them reported (default {LIVE_SECONDS:g}); "
                          "refused for a recording, which is read whole (--last S for its last seconds)")
    add_last(p, "the report")
    p.add_argument("--ledger", default=None, metavar="PATH",
                   help="the prediction ledger to grade and include (default ./decodemon.ledger.jsonl, if there)")
    p.add_argument("--label", metavar="NAME", type=label_type,
                   help="the loop's name in the ledger, as given to `predict --label` (default: its script or -m "
                        "module)")
    add_probe(p)
    p.set_defaults(fn=run)


def label_type(text: str) -> str:
    """`--label`, checked as predict and grade check it."""
    from decodemon.monitor.cli.predict import _label

    return _label(text)


def grade_in_ledger(verb: str, ledger_path, sess, summary: dict, source: str, label: str | None = None):
    """The next attach or report of a loop grades its open prediction in the ledger (if there is a ledger);
    returns (the ledger's path, the loop's label), or None without a ledger. `label`: the loop's name as sealed
    (`predict --label`); by default its script or -m module. Open predictions of other loops only are named."""
    from pathlib import Path

    from decodemon.monitor import ledger

    path = Path(ledger_path or ledger.DEFAULT_PATH)
    if not path.exists():
        return None
    argv = sess.feed.hello.argv if sess.feed.hello else ()
    label = label or ledger.loop_label(argv, source)
    if verb == "report" and not str(source).isdigit():  # a recording: which one, whatever span of it was read
        summary = ledger.with_recording(summary, source)
    try:
        graded, problems = ledger.grade_open(path, summary, label)
    except ledger.NotGraded as exc:  # what was measured stands, and its report is written; only the ledger is
        for line in ledger.read(path)[1]:  # not graded (its prediction stays open); its skipped lines said too
            say(verb, line)
        say(verb, f"the ledger is not graded: {exc}")
        return (path, label) if verb == "report" else None
    except ledger.LedgerError as exc:  # the ledger file itself: bad input, as any other (attach: said, not graded)
        if verb == "attach":
            say(verb, str(exc))
            return None
        raise UsageError(f"decodemon {verb}: {exc}") from None
    for line in problems:
        say(verb, line)
    if graded is not None:
        say(verb, f"graded the open prediction in {path}: {ledger.grade_words(graded)}")
    else:
        others = sorted({e["source"] for e in ledger.open_predictions(ledger.read(path)[0])} - {label})
        if others:
            say(verb, f"no open prediction for {label} in {path}; open ones are for {', '.join(others)} "
                      "(--label NAME picks one)")
    return path, label


def _with_ledger(a, sess, summary: dict, md: str) -> str:
    """Grade the loop's open prediction with what was just measured, and add the ledger to the report."""
    from decodemon.monitor import ledger

    found = grade_in_ledger("report", a.ledger, sess, summary, str(a.source), a.label)
    if found is None:
        return md
    path, label = found
    entries, _ = ledger.read(path)
    return md.rstrip("\n") + "\n\n" + ledger.ledger_markdown(entries, label, ledger.state_of(summary)).rstrip("\n") + "\n"


def run(a) -> int:
    """Collect the source, then print or write its report."""
    from decodemon.monitor.render import diagnosis_markdown, summary_json
    from decodemon.monitor.safe_text import visible_lines
    from decodemon.monitor.safe_write import check_output, write_text_whole
    from decodemon.monitor.sources.collect import collect, source_of

    if a.json and a.output == "-":
        raise UsageError("decodemon report: --json and -o - would both print to standard output: give -o FILE, "
                         "or leave -o out (see `decodemon report --help`)")
    if a.output is not None:
        from decodemon.monitor import ledger

        # before a pid is attached; the ledger it may grade (the default one too) is an input as well
        check_output(a.output, inputs=[a.source, getattr(a, "ledger", None) or ledger.DEFAULT_PATH])
    kind, _ = source_of(a.source)
    seconds = live_seconds(a, "report", [a.source], LIVE_SECONDS if kind == "pid" else None)
    from decodemon.monitor.span import summary_snapshot

    sess = collect(a.source, attach_settings(a), seconds)
    snap = summary_snapshot(sess, a.last)
    empty = without_tokens("report", [snap])
    if empty is not None:
        return empty
    if a.json:
        print_json(summary_json(snap))
    md = _with_ledger(a, sess, summary_json(snap), diagnosis_markdown(snap))
    if a.output:
        write_text_whole(a.output, md)
        if a.output != "-":
            say("report", f"wrote {a.output} ({snap.diagnosis.ceiling.upper()})")
    elif not a.json:
        print(visible_lines(md), end="")  # it ends in its one newline
    return 0
