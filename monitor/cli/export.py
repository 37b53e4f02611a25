"""`decodemon export SOURCE -o trace.json`: the traced windows as a trace for Perfetto, chrome://tracing and HTA."""

from __future__ import annotations


def add(sub) -> None:
    """Register the verb."""
    from decodemon.monitor.export import cli as export_cli

    export_cli.add_parser(sub).set_defaults(fn=run)


def run(a) -> int:
    """Write the trace."""
    from decodemon.monitor.export import cli as export_cli

    return export_cli.run(a)
