"""`decodemon report SOURCE`: DIAGNOSIS.md for a pid or a recording (to stdout, or a file with -o)."""

from __future__ import annotations

import sys

from decodemon.monitor.cli._common import add_probe, add_seconds, attach_settings, print_json, without_tokens


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("report", help="write DIAGNOSIS.md for a pid or a recording",
                       description="The binding ceiling, a number per candidate, the predicted win and how to "
                                   "prove it wrong, as Markdown.")
    p.add_argument("source", metavar="SOURCE", help="a pid or a .dmon recording")
    p.add_argument("-o", "--output", metavar="FILE", help="write the Markdown here instead of stdout")
    p.add_argument("--json", action="store_true", help="print the JSON summary (with -o, the file is written too)")
    add_seconds(p, 10.0, "a pid: seconds to watch (default 10)")
    add_probe(p)
    p.set_defaults(fn=run)


def run(a) -> int:
    """Collect the source, then print or write its report."""
    from decodemon.monitor.render import diagnosis_markdown, summary_json
    from decodemon.monitor.sources import check_output, collect, source_of, write_text_whole

    if a.output:
        check_output(a.output)  # before a pid is attached for seconds
    kind, _ = source_of(a.source)
    snap = collect(a.source, attach_settings(a), a.seconds if kind == "pid" else None).snapshot()
    empty = without_tokens("report", [snap])
    if empty is not None:
        return empty
    if a.json:
        print_json(summary_json(snap))
    md = diagnosis_markdown(snap)
    if a.output:
        write_text_whole(a.output, md)
        print(f"decodemon report: wrote {a.output} ({snap.diagnosis.ceiling.upper()})", file=sys.stderr)
    elif not a.json:
        print(md)
    return 0
