"""`decodemon exporter [PID ...] [--listen HOST:PORT]`: Prometheus metrics of the decode loops on this host whose
agent listens, and of the PIDs named."""

from __future__ import annotations

import argparse
import sys

MIN_SCAN_S = 0.1


def add(sub) -> None:
    """Register the verb."""
    add_parser(sub).set_defaults(fn=run)


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `exporter` verb to a `decodemon` subparsers action; return its parser."""
    from decodemon.monitor.exporter.serve import SCAN_EVERY_S, parse_address

    doc = "serve Prometheus metrics of every decode loop on this host whose agent listens, and of the PIDs named"
    p = subparsers.add_parser("exporter", help=doc, description=doc + ".")
    p.add_argument("--listen", type=parse_address, default=("127.0.0.1", 9464), metavar="HOST:PORT",
                   help="where to serve /metrics (default 127.0.0.1:9464; :PORT for every interface)")
    p.add_argument("--scan", type=float, default=SCAN_EVERY_S, metavar="S",
                   help=f"seconds between looks for new processes (default {SCAN_EVERY_S:g})")
    p.add_argument("pids", nargs="*", type=int, metavar="PID",
                   help="also watch these processes (besides every process whose agent already listens)")
    p.add_argument("--inject", action="store_true",
                   help="load the agent into a PID named here that has none (never into any other process)")
    p.set_defaults(run=run)
    return p


def run(args) -> int:
    """`decodemon exporter`: serve until Ctrl-C."""
    host, port = args.listen
    if not MIN_SCAN_S <= args.scan <= 3600:  # a scan is a look through /proc: never a busy loop
        print(f"decodemon exporter: --scan must be in [{MIN_SCAN_S:g}, 3600], got {args.scan:g}", file=sys.stderr)
        return 2
    from decodemon.monitor.sources.errors import SourceError
    from decodemon.monitor.sources.pids import require_process
    from decodemon.monitor.exporter.scan import Exporter
    from decodemon.monitor.exporter.serve import run_exporter

    for pid in args.pids:
        try:
            require_process(pid)
        except SourceError as exc:
            print(f"decodemon exporter: {exc}", file=sys.stderr)
            return 2
    if args.inject and not args.pids:
        print("decodemon exporter: --inject loads the agent only into the PIDs named; name them "
              "(decodemon exporter PID ... --inject)", file=sys.stderr)
        return 2
    return run_exporter(host, port, scan_every_s=args.scan, exporter=Exporter(pids=args.pids, inject=args.inject))
