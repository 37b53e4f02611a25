"""`decodemon exporter [PID ...] [--listen HOST:PORT]`: Prometheus metrics of the decode loops on this host whose
agent listens, and of the PIDs named."""

from __future__ import annotations


def add(sub) -> None:
    """Register the verb."""
    from decodemon.monitor import prometheus

    prometheus.add_parser(sub).set_defaults(fn=run)


def run(a) -> int:
    """Serve until Ctrl-C."""
    from decodemon.monitor import prometheus

    return prometheus.run(a)
