"""Prometheus metrics of watched decode loops, through the standard client library (`prometheus_client`).

    decodemon attach PID --prometheus HOST:PORT   one process        serve_pid
    decodemon exporter --listen HOST:PORT          every attachable   run_exporter
                                                   process on the host

    live_frames --> Session --(every second)--> Snapshot --> Watch.latest
                                                                 |  a scrape
                                      SnapshotCollector.collect -+--> /metrics

A `Watch` attaches to one pid on a thread of its own and keeps the latest `Snapshot` (plain values); the custom
collector turns the snapshots there are into gauges at each scrape: a scrape reads values already computed and
touches neither the agent's socket nor the analysis.
Names follow the exporter conventions: base units (`_seconds`, `_bytes`, `_ratio` for a fraction of 1) and the
labels pid, engine (the engine's program) and gpu (the device's index; absent without a GPU).

An agent serves one monitor at a time: the exporter yields, so `decodemon attach` to a process it watches is served
and the exporter watches again as soon as it is free (asking twice a second). Meanwhile its series hold their last
values and `decodemon_watch_up` is 0. The agent counts tokens only for the monitor attached, so those made
meanwhile are estimated when the exporter has the agent back: the time between the last token it counted and the
first it counts again (the engine's clock; at most the time it was away, so a loop idle while watched adds none),
at the rate measured on either side. `decodemon_tokens_total` adds them and never decreases, and
`decodemon_tokens_estimated_total` says how many of its tokens were estimated, not counted.

It watches only what it is told to: this user's processes whose agent already listens (the process holds a
listening `<pid>.sock`: monitor/agent_socket.find), each proven at its attach by the agent's Hello (the same pid)
and the process's start time (the same process as the one found, not a pid reused since); llama-servers serving
/slots (watched from outside: monitor/outside.py); and the pids named on its command line. It loads an agent into
none of them unless told to (`--inject`, named pids only).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

import msgspec

from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.sources.live import live_frames
from decodemon.monitor.sources.pids import start_time
from decodemon.monitor.rolling import headline
from decodemon.monitor.safe_text import visible
from decodemon.probes import wire

LABELS = ("pid", "engine", "gpu")
VERDICTS = ("bandwidth", "comm", "launch", "occupancy", "unknown")
SNAPSHOT_EVERY_S = 1.0
SCAN_EVERY_S = 5.0
RETRY_AFTER_S = 30.0  # a process whose watch failed is tried again after this
REATTACH_EVERY_S = 0.5  # a watch lent to another monitor asks for the agent again this often until it is free
RATE_SPAN_S = 10.0  # the rate that estimates a lent stretch's tokens: over at most this much of either side
# a lent stretch is at most the time the watch was away plus this: the marks a step aside leaves unsent (up to an
# agent tick's) and a loaded host's delays; the rest of a longer one is the loop idle while watched
LENT_SLACK_S = 1.0


def _ratio(pct):
    return None if pct is None else pct / 100.0


def _pm(key):
    return lambda s: _ratio(s.pm.get(key)) if s.pm else None


# (name, help, value from a Snapshot or None when not measured)
GAUGES = (
    ("decodemon_seconds_per_token", "Median time per token on the engine's clock (a batched engine: per step, "
     "decodemon_tokens_per_step tokens in it).",
     lambda s: s.tokens.ms_per_token / 1e3 if s.tokens else None),
    ("decodemon_tokens_per_second", "Tokens per second over the mean token (a batched engine: every sequence's "
     "tokens, all steps together).",
     lambda s: s.throughput_tokens_per_s if s.tokens_per_step is not None else
     (s.tokens.tokens_per_s if s.tokens else None)),
    ("decodemon_tokens_per_step", "A batched engine's tokens per step (one per sequence in it).",
     lambda s: s.tokens_per_step),
    ("decodemon_launches_per_token", "Kernels per token in the latest traced window.",
     lambda s: s.window.kernels_per_token if s.window else None),
    ("decodemon_gpu_busy_ratio", "Fraction of the time the GPU ran work (PM counters, else traced kernels).",
     lambda s: _ratio(s.gpu_busy_pct)),
    ("decodemon_sm_active_ratio", "Fraction of cycles the SMs were active (PM counters).", _pm("sm_active_pct")),
    ("decodemon_dram_ratio", "DRAM throughput as a fraction of its peak (PM counters).", _pm("dram_pct")),
    ("decodemon_bytes_per_token", "Bytes read per token: weights plus the KV cache touched.",
     lambda s: s.bytes_per_token),
    ("decodemon_probe_cost_ratio", "Share of the loop's time the traced windows cost the decode thread.",
     lambda s: _ratio((s.observer or {}).get("share_of_loop_pct"))),
)


def target_labels(hello: wire.Hello | None, pid: int) -> dict:
    """pid, engine and gpu labels of a watched process, from the agent's hello."""
    engine = Path(hello.argv[0]).name if hello and hello.argv else ""
    gpu = str(hello.gpu.index) if hello and hello.gpu else ""
    return {"pid": str(pid), "engine": engine, "gpu": gpu}


@dataclasses.dataclass(frozen=True)
class Currency:
    """What a scrape says of a watch besides its snapshot."""

    up: bool  # the snapshot is of the attach the watch holds now (not held from before another monitor's)
    age_s: float  # seconds since the snapshot was taken
    tokens_estimated: int = 0  # of the snapshot's tokens_total, those estimated for another monitor's attaches


def _add(family, label_values: list, value: float) -> None:
    """One sample, its label values escaped (visible()): prometheus_client escapes quotes, backslashes and line
    breaks, not ESC, and a target's program or model name would reach the terminal of whoever curls /metrics."""
    family.add_metric([visible(v) for v in label_values], value)


def metric_families(targets: Iterable[tuple]) -> list:
    """The gauges of every (labels, Snapshot) or (labels, Snapshot, Currency): one family per metric, one sample
    per process."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    given = list(targets)
    targets = [(t[0], t[1]) for t in given]
    currency = [(t[0], t[2]) for t in given if len(t) > 2 and t[2] is not None]
    out = []
    for name, doc, value in GAUGES:
        fam = GaugeMetricFamily(name, doc, labels=LABELS)
        for labels, snap in targets:
            v = value(snap)
            if v is not None:
                _add(fam, [labels[k] for k in LABELS], float(v))
        out.append(fam)
    tokens = CounterMetricFamily("decodemon_tokens", "Tokens made since the process was first watched: counted while "
                                 "watched, estimated while another monitor had the agent; never decreases.",
                                 labels=LABELS)
    ceiling = GaugeMetricFamily("decodemon_ceiling_value", "Each ceiling's number, in the unit its label names.",
                                labels=LABELS + ("ceiling", "unit"))
    verdict = GaugeMetricFamily("decodemon_verdict", "1 for the binding ceiling (the rolling verdict), else 0.",
                                labels=LABELS + ("ceiling",))
    info = GaugeMetricFamily("decodemon_model_info", "The model the engine reported (value 1).",
                             labels=LABELS + ("model", "dtype", "tp_degree"))
    for labels, snap in targets:
        lv = [labels[k] for k in LABELS]
        _add(tokens, lv, float(snap.tokens_total))
        for c_name, c in snap.diagnosis.candidates.items():
            if c.value is not None:
                _add(ceiling, lv + [c_name, c.unit], float(c.value))
        for v_name in VERDICTS:
            _add(verdict, lv + [v_name], 1.0 if headline(snap.diagnosis, snap.rolling)[0] == v_name else 0.0)
        if snap.model is not None:
            _add(info, lv + [snap.model.name, snap.model.dtype, str(snap.model.tp_degree)], 1.0)
    out += [tokens, ceiling, verdict, info]
    if currency:
        estimated = CounterMetricFamily("decodemon_tokens_estimated", "Of decodemon_tokens_total, the tokens made "
                                        "while another monitor had the agent: estimated, not counted.", labels=LABELS)
        up = GaugeMetricFamily("decodemon_watch_up", "1 while the series are current, 0 while they hold their last "
                               "values (another monitor has the agent, or the watch ended).", labels=LABELS)
        age = GaugeMetricFamily("decodemon_snapshot_age_seconds", "Seconds since the series were last updated.",
                                labels=LABELS)
        for labels, cur in currency:
            lv = [labels[k] for k in LABELS]
            _add(estimated, lv, float(cur.tokens_estimated))
            _add(up, lv, 1.0 if cur.up else 0.0)
            _add(age, lv, cur.age_s)
        out += [estimated, up, age]
    return out


class SnapshotCollector:
    """A custom collector: at each scrape, the gauges of the latest snapshots `targets()` returns."""

    def __init__(self, targets: Callable[[], Iterable[tuple[dict, object]]]) -> None:
        self._targets = targets

    def collect(self):
        """The metric families of the current snapshots."""
        return metric_families(self._targets())

    def describe(self):
        """Nothing ahead of time: the families depend on the processes watched."""
        return []


def _token_points(feed):
    """(engine-clock ns, tokens counted up to and including it) at each point the feed's token count moved at: its
    marks (a batched engine's step counts its tokens), else its step counts; None without either."""
    import numpy as np

    if feed.tokens_seen and len(feed.marks):
        v = feed.marks.view()
        return v[0].astype(np.float64), np.cumsum(v[3]).astype(np.float64)
    if feed.steps_seen and len(feed.counts):
        c = feed.counts_since()
        return c["t_ns"], c["steps"] - c["steps"][0]
    return None


def _span(t, counted, at_end: bool) -> tuple[float, float]:
    """(tokens, seconds) over at most RATE_SPAN_S of the points' clock at their end (else their start)."""
    import numpy as np

    if len(t) < 2:
        return 0.0, 0.0
    if at_end:
        i = int(np.searchsorted(t, t[-1] - RATE_SPAN_S * 1e9))
        return float(counted[-1] - counted[i]), float(t[-1] - t[i]) / 1e9
    j = int(np.searchsorted(t, t[0] + RATE_SPAN_S * 1e9, side="right")) - 1
    return float(counted[j] - counted[0]), float(t[j] - t[0]) / 1e9


class Watch:
    """One pid attached on a thread of its own; `latest` is its newest Snapshot (None before the first).
    `inject`: load an agent into it if it has none (otherwise only an agent already there is watched).
    `reattach`: while another monitor has the agent, ask again until it is free (the exporter's watches); the
    tokens made meanwhile are estimated at the next attach (`_estimate_lent`)."""

    def __init__(self, pid: int, settings: wire.Attach | None = None, every_s: float = SNAPSHOT_EVERY_S,
                 inject: bool = False, reattach: bool = False) -> None:
        self.pid, self.settings, self.every_s, self.inject = pid, settings, every_s, inject
        self.reattach = reattach
        self.started = start_time(pid)  # the process found: its Hello must come from it
        self._held = (None, 0, 0.0)  # (latest Snapshot, its tokens estimated, time.monotonic() it was taken)
        self.current = False  # the latest snapshot is of the attach this watch holds now
        self.labels = target_labels(None, pid)
        self.ended: str | None = None  # why the attach ended (None while it runs)
        self.lent: str | None = None  # why another monitor holds the agent now (None while this watch holds it)
        self.tokens_before = 0  # tokens in this watch's attaches before the current one, and those lent between
        self.tokens_estimated = 0  # of tokens_before, those estimated for the time another monitor had the agent
        # the token count's last point before the agent was lent: (engine-clock ns, the (tokens, seconds) of the rate
        # at the attach's end, time.monotonic() the attach ended); None while no lent stretch waits for its estimate
        self._lent_from: tuple | None = None
        self.attaches = 0  # attaches that got the agent's hello
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"decodemon-watch-{pid}", daemon=True)

    def start(self) -> "Watch":
        """Attach in the background."""
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Detach and wait for the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def latest(self):
        """The newest Snapshot (None before the first)."""
        return self._held[0]

    def served(self) -> tuple[dict, object, Currency] | None:
        """(labels, latest Snapshot, Currency: whether it is current, its age, its tokens estimated), or None
        before the first snapshot."""
        snap, estimated, at = self._held
        if snap is None:
            return None
        up = self.running and self.current and self.lent is None
        return self.labels, snap, Currency(up=up, age_s=max(0.0, time.monotonic() - at), tokens_estimated=estimated)

    @property
    def running(self) -> bool:
        """Whether the attach is still going."""
        return self._thread.is_alive()

    def _run(self) -> None:
        """Attach; with `reattach`, while the process lives and was only lent to another monitor, attach again once
        it is free."""
        inject = self.inject
        while not self._stop.is_set():
            why = self._attach_once(inject)
            inject = False  # the agent loaded at the first attach is there for the next
            if why is None or not (self.reattach and _lent(why)) or self._stop.is_set():
                break
            self.lent, self.ended = why, None
            if self._stop.wait(REATTACH_EVERY_S):
                break
            if start_time(self.pid) != self.started:
                self.ended = f"pid {self.pid} went away while another monitor was attached"
                break
        if self.ended is None:
            self.ended = "stopped"

    def _attach_once(self, inject: bool) -> str | None:
        """One attach, from connect to Bye; the Bye's reason (None: the process is not the one found). The latest
        snapshot carries the tokens of the attaches before and those estimated for the time the agent was lent
        between, and one of this attach replaces the one held only once it has a token clock, so a series stays
        continuous across another monitor's attach."""
        from decodemon.monitor.session import Session

        sess = Session(label=f"pid {self.pid}")
        before, estimated = self.tokens_before, self.tokens_estimated
        last, hello_at = 0.0, None
        try:
            for rx, _payload, frame in live_frames(self.pid, self.settings, None, stop=self._stop.is_set,
                                                   inject=inject):
                if isinstance(frame, wire.Hello):
                    why = self.not_the_process(frame)
                    if why is not None:
                        self.ended = why
                        return None
                    self.labels = target_labels(frame, self.pid)
                    self.attaches += 1
                    hello_at = time.monotonic()
                sess.add(rx, frame)
                now = time.monotonic()
                if now - last >= self.every_s or isinstance(frame, wire.KernelWindow):
                    if self._lent_from is not None and (lent := self._estimate_lent(sess.feed, hello_at)) is not None:
                        before, estimated = before + lent, estimated + lent
                    self._publish(sess.snapshot(), before, estimated)
                    last = now
            self.ended = sess.feed.bye or "detached"
        except (SourceError, wire.WireError, OSError) as exc:
            self.ended = str(exc)
        except Exception as exc:  # a frame the analysis cannot take ends this watch, not the exporter
            self.ended = f"{type(exc).__name__}: {exc}"
        left_at = time.monotonic()
        if sess.feed.tokens_seen or sess.feed.steps_seen:
            if self._lent_from is not None and (lent := self._estimate_lent(sess.feed, hello_at)) is not None:
                before, estimated = before + lent, estimated + lent
            snap = sess.snapshot()
            self._publish(snap, before, estimated)
            self.tokens_before, self.tokens_estimated = before + snap.tokens_total, estimated
            points = _token_points(sess.feed)
            if points is not None and len(points[0]):
                self._lent_from = (float(points[0][-1]), _span(*points, at_end=True), left_at)
        self.current = False
        return self.ended

    def _estimate_lent(self, feed, hello_at: float | None) -> int | None:
        """The tokens made while the agent was lent, between the last point of the count before and the first of
        this attach (`feed`'s), at the rate over both sides; None until this attach has two points to time."""
        points = _token_points(feed)
        if points is None or len(points[0]) < 2:
            return None
        t, counted = points
        t_from, (n_before, s_before), left_at = self._lent_from
        self._lent_from = None
        n_after, s_after = _span(t, counted, at_end=False)
        if s_before + s_after <= 0:
            return 0
        lent_s = (float(t[0]) - t_from) / 1e9
        if hello_at is not None:
            lent_s = min(lent_s, hello_at - left_at + LENT_SLACK_S)
        # the first point of this attach is counted in it
        return max(0, round((n_before + n_after) / (s_before + s_after) * lent_s - float(counted[0])))

    def _publish(self, snap, tokens_before: int, estimated: int = 0) -> None:
        """Make `snap` the latest, its token count added to the attaches' before (`estimated` of them for the
        agent lent between); one with no token clock yet does not replace a snapshot held from an attach before,
        and the count never goes below the one published."""
        held = self.latest
        if held is not None and tokens_before and snap.tokens is None:
            return
        total = tokens_before + snap.tokens_total
        if held is not None:
            total = max(total, held.tokens_total)
        if total != snap.tokens_total:
            snap = dataclasses.replace(snap, tokens_total=total)
        self._held, self.current, self.lent = (snap, estimated, time.monotonic()), True, None

    def not_the_process(self, hello: wire.Hello) -> str | None:
        """Why `hello` is not from the process this watch was started on (another pid, or the pid reused by a
        process started since), or None when it is."""
        if hello.pid != self.pid:
            return f"the agent at pid {self.pid}'s socket says it is pid {hello.pid}"
        if self.started is None or start_time(self.pid) != self.started:
            return f"pid {self.pid} is not the process found (it ended, or its pid was reused)"
        return None


def _lent(reason: str) -> bool:
    """Whether an attach ended because another monitor has the agent (stepped aside for it, or found it busy)."""
    return reason.startswith(wire.LENT_TO_ANOTHER)


MIN_SCAN_S = 0.1
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


_SOCK_NAME = re.compile(r"/([0-9]{1,7})\.sock$")


def _named_sockets(directory: Path | None) -> set[int]:
    """The pids that `<pid>.sock` names: in `directory`, or (None) in this user's socket directory and among the
    listening Unix sockets of this network namespace (an agent in a private directory is found there)."""
    d = Path(directory) if directory is not None else wire.socket_dir()
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    out = {int(m.group(1)) for n in names if (m := _SOCK_NAME.search("/" + n))}
    if directory is None:
        try:
            lines = Path("/proc/self/net/unix").read_text().splitlines()[1:]
        except OSError:
            lines = []
        for line in lines:
            parts = line.split(None, 7)
            if len(parts) == 8 and int(parts[3], 16) & 0x10000 and (m := _SOCK_NAME.search(parts[7])):
                out.add(int(m.group(1)))
    return out


def attachable_pids(directory: Path | None = None) -> list[int]:
    """This user's processes whose own agent listens (each holds its listening `<pid>.sock`), named in
    `directory` (default: this user's socket directory and this host's listening sockets). A socket left by a
    process that is gone, or by one whose pid another process has since, names no attachable process."""
    from decodemon.monitor.sources import agent_socket

    pids = []
    for pid in sorted(_named_sockets(directory)):
        if agent_socket.target_uid(pid) == os.getuid() and agent_socket.find(pid) is not None:
            pids.append(pid)
    return pids


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


class Exporter:
    """Every attachable process on the host, and the `pids` named, each under a Watch; `scan()` starts new ones
    and drops ended ones. An agent is loaded only into a named pid, and only with `inject`."""

    def __init__(self, settings: wire.Attach | None = None, directory: Path | None = None,
                 only: Callable[[int], bool] | None = None, pids: Iterable[int] = (), inject: bool = False) -> None:
        # the exporter yields: a user's attach to a process it watches is served, and it watches again after
        self.settings = msgspec.structs.replace(settings or wire.Attach(), yields=True)
        self.directory, self.only = directory, only
        self.named, self.inject = tuple(pids), inject
        self.scans = 0
        self.watches: dict[int, Watch] = {}
        self._ended_at: dict[int, float] = {}
        self._said: set[int] = set()  # named pids whose failed watch was said on stderr
        self._lock = threading.Lock()

    def scan(self) -> None:
        """Attach to processes not yet watched; forget ended watches (retried after RETRY_AFTER_S if alive)."""
        now = time.monotonic()
        from decodemon.monitor.sources.outside import servers

        named = [p for p in self.named if Path(f"/proc/{p}").exists()]
        found = [p for p in attachable_pids(self.directory) + servers() if self.only is None or self.only(p)]
        with self._lock:
            for pid, w in list(self.watches.items()):
                if not w.running:
                    del self.watches[pid]
                    self._ended_at[pid] = now
                    if pid in self.named and not w.attaches and pid not in self._said:  # asked for, never watched
                        self._said.add(pid)
                        print(f"decodemon exporter: pid {pid} is not watched: {w.ended}; tried again every "
                              f"{RETRY_AFTER_S:g} s", file=sys.stderr)
            for pid in dict.fromkeys(named + found):
                if pid not in self.watches and now - self._ended_at.get(pid, -RETRY_AFTER_S) >= RETRY_AFTER_S:
                    inject = self.inject and pid in self.named
                    self.watches[pid] = Watch(pid, self.settings, inject=inject, reattach=True).start()
            self.scans += 1

    def targets(self) -> list[tuple[dict, object]]:
        """(labels, latest Snapshot) of every watched process that has one."""
        with self._lock:
            return [(w.labels, w.latest) for w in self.watches.values() if w.latest is not None]

    def series(self) -> list[tuple[dict, object, Currency]]:
        """(labels, latest Snapshot, Currency) of every watched process that has a snapshot: what is served."""
        with self._lock:
            return [t for t in (w.served() for w in self.watches.values()) if t is not None]

    def stop(self) -> None:
        """Detach from every process."""
        with self._lock:
            watches, self.watches = list(self.watches.values()), {}
        for w in watches:
            w.stop()


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


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `exporter` verb to a `decodemon` subparsers action; return its parser."""
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


def add_prometheus_option(p) -> None:
    """`--prometheus HOST:PORT` for `attach`: serve the process's metrics there instead of the app."""
    p.add_argument("--prometheus", type=parse_address, default=None, metavar="HOST:PORT",
                   help="serve this process's metrics for Prometheus at HOST:PORT/metrics instead of the app")


def run(args) -> int:
    """`decodemon exporter`: serve until Ctrl-C."""
    host, port = args.listen
    if not MIN_SCAN_S <= args.scan <= 3600:  # a scan is a look through /proc: never a busy loop
        print(f"decodemon exporter: --scan must be in [{MIN_SCAN_S:g}, 3600], got {args.scan:g}", file=sys.stderr)
        return 2
    from decodemon.monitor.sources.pids import require_process

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
