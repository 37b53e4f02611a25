"""`decodemon record PID -o FILE`: attach for some seconds and write what arrived as a `.dmon` recording.

The file appears only once the recording is whole and holds at least one token (`sources.collect_pid`)."""

from __future__ import annotations

from decodemon.monitor.cli._common import (add_last, add_pid, add_probe, add_seconds, attach_settings,
                                           need_json_for_last, print_json, resolve_pid, say)


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("record", help="attach and write a .dmon recording",
                       description="Attach to a decode loop for --seconds and write a recording that `decodemon "
                                   "replay` plays back. A record that measured no token leaves no file.")
    add_pid(p)
    p.add_argument("-o", "--output", metavar="FILE",
                   help="the recording to write (.dmon; default decodemon-PID-YYYYmmdd-HHMMSS.dmon here)")
    add_seconds(p, 20.0, "seconds to record (default 20; Ctrl-C stops early and keeps the file)")
    p.add_argument("--json", action="store_true",
                   help="also print the JSON summary of the whole recording (span, its first key, says so)")
    add_last(p)
    add_probe(p)
    p.set_defaults(fn=run)


def counted(snap) -> str:
    """The count behind the rate, named with its clock: "412 tokens (mark_token)", "96 GPU steps (kernel
    period)"."""
    clock = snap.token_clock or "no clock"
    unit = "tokens" if clock in ("mark_token", "mark_bursts") or clock.startswith("nvtx_range") else "steps"
    return f"{snap.tokens_total} {unit} ({clock})"


def run(a) -> int:
    """Record, then say what was written."""
    from decodemon.monitor.safe_write import check_recording_output
    from decodemon.monitor.sources.collect import collect_pid

    pid = resolve_pid(a)
    need_json_for_last(a, "record")
    if a.output is None:  # py-spy's habit: a name made of what and when
        import time

        a.output = f"decodemon-{pid}-{time.strftime('%Y%m%d-%H%M%S')}.dmon"
    check_recording_output(a.output)  # before attaching: a bad path costs the target nothing
    try:
        sess = collect_pid(pid, attach_settings(a), a.seconds, record_to=a.output)
    except KeyboardInterrupt:  # the recording is kept whole, ending with the interrupt's Bye
        import os

        if os.path.isfile(a.output):
            say("record", f"stopped by an interrupt: what arrived before it is kept in {a.output}")
        raise
    snap = sess.snapshot()
    say("record", f"{counted(snap)}, {snap.windows_seen} traced windows written to {a.output}")
    if a.json:
        from decodemon.monitor.render import summary_json
        from decodemon.monitor.span import summary_snapshot

        summary = summary_json(summary_snapshot(sess, a.last))
        print_json({"span": summary.pop("span"), "recording": str(a.output), **summary})
    return 0
