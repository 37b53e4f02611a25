"""`decodemon export SOURCE -o trace.json`: the traced windows of a recording or a live attach as a trace for
Perfetto, chrome://tracing and HTA."""

from __future__ import annotations

from decodemon.monitor.cli._common import add_source, bounded, live_seconds, say
from decodemon.probes import wire

HELP = "write the traced windows as a trace for Perfetto, chrome://tracing and HTA"
LIVE_SECONDS = 10.0


def _seconds(text: str) -> float:
    return bounded("--seconds", 0, 86400)(text)


def _window(text: str) -> int:
    return bounded("--window", 0, 2**63 - 1, integer=True)(text)


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("export", help=HELP, description=HELP + ". Chrome's Trace Event Format (JSON) "
                       "in PyTorch Kineto's flavour; a name ending in .gz is gzipped.")
    add_source(p, what="a .dmon recording, or the pid of a loop to attach to")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the trace to write (.json or .json.gz)")
    p.add_argument("--window", type=_window, default=None, metavar="ID",
                   help="only the traced window with this id (default: every window kept)")
    p.add_argument("--seconds", "--duration", dest="seconds", type=_seconds, default=None, metavar="S",
                   help=f"for a pid: seconds to attach (default {LIVE_SECONDS:g}); a recording is read whole")
    p.set_defaults(fn=run, run=run)


def live_settings() -> wire.Attach:
    """What a live export asks the probe for: the launch calls in every window, so each has its CPU lane."""
    return wire.Attach(api_every=1)


def run(a) -> int:
    """Read the source, write its trace to `a.output`. A bad source or output (SourceError, 2) and a source
    with nothing to export (NothingToExport, 3) are `decodemon`'s to report, as for every verb."""
    from decodemon.monitor.export.trace import export, write_trace
    from decodemon.monitor.safe_write import check_output

    seconds = live_seconds(a, "export", [a.source], LIVE_SECONDS)  # a recording ignores it: it is read whole
    check_output(a.output, inputs=[a.source])  # before an attach, not after it
    trace = export(a.source, a.window, live_settings(), seconds)
    path = write_trace(trace, a.output)
    n = sum(1 for e in trace["traceEvents"] if e.get("cat") == "kernel")
    nw = len(trace["decodemon"]["windows"])
    say("export", f"wrote {path}: {nw} traced window{'s' if nw != 1 else ''}, {n} kernels "
                  "(open it in https://ui.perfetto.dev or chrome://tracing)")  # as record and report do
    return 0
