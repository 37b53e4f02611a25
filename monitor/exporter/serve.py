"""The HTTP side: /metrics served from a daemon thread, and the loops that serve one pid (`serve_pid`, for
`attach --prometheus`) or every process the scan finds (`run_exporter`, for `decodemon exporter`)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.exporter.collector import SnapshotCollector
from decodemon.monitor.exporter.scan import Exporter
from decodemon.monitor.exporter.watch import Watch
from decodemon.probes import wire

SCAN_EVERY_S = 5.0
IDLE_CONNECTION_S = 10.0


def parse_address(text: str) -> tuple[str, int]:
    """HOST:PORT (or :PORT for every interface, [v6]:PORT) into (host, port); ArgumentTypeError otherwise."""
    host, sep, port = str(text).rpartition(":")
    bad = argparse.ArgumentTypeError(f"give the address as HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464), not {text!r}")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise bad
    if host.startswith("[") or host.endswith("]") or ":" in host:  # IPv6 only in brackets, both of them
        if not (host.startswith("[") and host.endswith("]")) or host.count("[") != 1 or host.count("]") != 1:
            raise bad
        import ipaddress

        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise bad from None
        host = host[1:-1]
    return (host or "0.0.0.0"), int(port)


def start_server(collector: SnapshotCollector, host: str, port: int):
    """Serve `collector` on http://host:port/metrics in a daemon thread; return the server (`shutdown()` ends
    it). SourceError with one line when the address cannot be bound."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise SourceError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    # a connection that sends nothing is closed after this long, not kept with a thread for ever
    server.RequestHandlerClass.timeout = IDLE_CONNECTION_S
    server.handle_error = _request_failed
    return server


def _request_failed(request, client_address) -> None:
    """A request that ended in an error: an idle or dropped connection closes quietly (a slow client is not news),
    anything else is one line, never a traceback."""
    exc = sys.exc_info()[1]
    if isinstance(exc, (TimeoutError, ConnectionError)):
        return
    who = client_address[0] if isinstance(client_address, tuple) and client_address else "a client"
    print(f"decodemon exporter: a request from {who} failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def serve_pid(pid: int, host: str, port: int, settings: wire.Attach | None = None, seconds: float | None = None,
              stop: Callable[[], bool] | None = None) -> int:
    """Attach to `pid` and serve its metrics until it ends, `seconds` pass, `stop()` is true or Ctrl-C; return
    the exit code (0, or 2 with one line on stderr when the address or the pid cannot be used)."""
    from decodemon.monitor.sources.pids import check_pid

    try:
        check_pid(pid)
        watch = Watch(pid, settings)
        server = start_server(SnapshotCollector(lambda: [t for t in [watch.served()] if t is not None]), host, port)
    except SourceError as exc:
        print(f"decodemon attach: {exc}", file=sys.stderr)
        return 2
    print(f"decodemon: serving pid {pid}'s metrics on http://{host}:{port}/metrics (Ctrl-C ends)", file=sys.stderr)
    watch.start()
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while watch.running and not (stop and stop()) and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        watch.stop()
        server.shutdown()
    if watch.ended and not watch.latest:
        print(f"decodemon attach: {watch.ended}", file=sys.stderr)
        return 2
    return 0


def run_exporter(host: str, port: int, settings: wire.Attach | None = None, scan_every_s: float = SCAN_EVERY_S,
                 stop: Callable[[], bool] | None = None, exporter: Exporter | None = None) -> int:
    """Serve the metrics of every attachable process until `stop()` is true or Ctrl-C; the exit code."""
    exporter = exporter or Exporter(settings)
    try:
        server = start_server(SnapshotCollector(exporter.series), host, port)
    except SourceError as exc:
        print(f"decodemon exporter: {exc}", file=sys.stderr)
        return 2
    print(f"decodemon exporter: serving http://{host}:{port}/metrics (Ctrl-C ends)", file=sys.stderr)
    try:
        while not (stop and stop()):
            exporter.scan()
            t_next = time.monotonic() + scan_every_s
            while time.monotonic() < t_next and not (stop and stop()):
                time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    finally:
        exporter.stop()
        server.shutdown()
    return 0
