"""One pid attached on a thread of its own, its latest snapshot kept for the scrapes (`Watch`).

An agent serves one monitor at a time: a watch that yields asks for the agent again until it is free. Of the
tokens made meanwhile, those the agent sent another monitor are counted (its hello says how many it sent over every
attach); those made while no monitor had it are estimated from the rate on either side (`Watch._lent`).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.exporter.collector import Currency, target_labels
from decodemon.probes import wire

SNAPSHOT_EVERY_S = 1.0
REATTACH_EVERY_S = 0.5  # a watch lent to another monitor asks for the agent again this often until it is free
RATE_SPAN_S = 10.0  # the rate that estimates a lent stretch's tokens: over at most this much of either side
# a lent stretch is at most the time the watch was away plus this: the marks a step aside leaves unsent (up to an
# agent tick's) and a loaded host's delays; the rest of a longer one is the loop idle while watched
LENT_SLACK_S = 1.0



def _start_time(pid: int):
    """sources.pids.start_time, imported when a watch first asks (a replay never loads the live sources)."""
    from decodemon.monitor.sources.pids import start_time

    return start_time(pid)


def _live_frames(*args, **kw):
    """sources.live.live_frames, imported when a watch attaches."""
    from decodemon.monitor.sources.live import live_frames

    return live_frames(*args, **kw)

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
    tokens made meanwhile are counted and estimated at the next attach (`_lent`)."""

    def __init__(self, pid: int, settings: wire.Attach | None = None, every_s: float = SNAPSHOT_EVERY_S,
                 inject: bool = False, reattach: bool = False) -> None:
        self.pid, self.settings, self.every_s, self.inject = pid, settings, every_s, inject
        self.reattach = reattach
        self.started = _start_time(pid)  # the process found: its Hello must come from it
        self._held = (None, 0, 0.0)  # (latest Snapshot, its tokens estimated, time.monotonic() it was taken)
        self.current = False  # the latest snapshot is of the attach this watch holds now
        self.labels = target_labels(None, pid)
        self.ended: str | None = None  # why the attach ended (None while it runs)
        self.lent: str | None = None  # why another monitor holds the agent now (None while this watch holds it)
        self.tokens_before = 0  # tokens in this watch's attaches before the current one, and those lent between
        self.tokens_estimated = 0  # of tokens_before, those estimated for the time no monitor had the agent
        self.tokens_others = 0  # of tokens_before, those the agent sent other monitors while it was lent, by its count
        # the token count's last point before the agent was lent: (engine-clock ns, the (tokens, seconds) of the rate
        # at the attach's end, time.monotonic() the attach ended, the agent's (tokens sent, seconds marked, attaches
        # that marked) over every attach up to then, None where its hello did not say); None while no lent stretch
        # waits for its count
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
            if _start_time(self.pid) != self.started:
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
        last, hello_at, sent, first_mark = 0.0, None, None, None
        try:
            for rx, _payload, frame in _live_frames(self.pid, self.settings, None, stop=self._stop.is_set,
                                                   inject=inject):
                if isinstance(frame, wire.Hello):
                    why = self.not_the_process(frame)
                    if why is not None:
                        self.ended = why
                        return None
                    self.labels = target_labels(frame, self.pid)
                    self.attaches += 1
                    hello_at = time.monotonic()
                    if frame.tokens_shipped is not None and frame.marked_s is not None:
                        sent = (frame.tokens_shipped, frame.marked_s, frame.attaches_marked or 0)
                elif first_mark is None and isinstance(frame, wire.TokenMarks) and len(frame.t_ns.data):
                    first_mark = float(frame.t_ns.array()[0])
                sess.add(rx, frame)
                now = time.monotonic()
                if now - last >= self.every_s or isinstance(frame, wire.KernelWindow):
                    if self._lent_from is not None and (lent := self._lent(sess.feed, hello_at, sent)) is not None:
                        before, estimated, self.tokens_others = (before + sum(lent), estimated + lent[1],
                                                                 self.tokens_others + lent[0])
                    self._publish(sess.snapshot(), before, estimated)
                    last = now
            self.ended = sess.feed.bye or "detached"
        except (SourceError, wire.WireError, OSError) as exc:
            self.ended = str(exc)
        except Exception as exc:  # a frame the analysis cannot take ends this watch, not the exporter
            self.ended = f"{type(exc).__name__}: {exc}"
        left_at = time.monotonic()
        if sess.feed.tokens_seen or sess.feed.steps_seen:
            if self._lent_from is not None and (lent := self._lent(sess.feed, hello_at, sent)) is not None:
                before, estimated, self.tokens_others = (before + sum(lent), estimated + lent[1],
                                                         self.tokens_others + lent[0])
            snap = sess.snapshot()
            self._publish(snap, before, estimated)
            self.tokens_before, self.tokens_estimated = before + snap.tokens_total, estimated
            points = _token_points(sess.feed)
            if points is not None and len(points[0]):
                t_last = float(points[0][-1])
                if sent is not None and first_mark is not None:  # the agent's count, with this attach's marks
                    sent = (sent[0] + sess.feed.batch_tokens_seen, sent[1] + (t_last - first_mark) / 1e9, sent[2] + 1)
                else:
                    sent = None
                self._lent_from = (t_last, _span(*points, at_end=True), left_at, sent)
        self.current = False
        return self.ended

    def _lent(self, feed, hello_at: float | None, sent: tuple | None) -> tuple[int, int] | None:
        """The tokens made while the agent was lent, between the last point of the count before and the first of
        this attach (`feed`'s): (those the agent sent other monitors, by its count; those estimated at the rate
        over both sides for the rest of the stretch, when no monitor had it); None until this attach has two points
        to time. `sent`: the agent's (tokens sent, seconds marked, attaches that marked) at this attach's hello, None
        where it did not say (every token of the stretch is then estimated)."""
        points = _token_points(feed)
        if points is None or len(points[0]) < 2:
            return None
        t, counted = points
        t_from, (n_before, s_before), left_at, sent_before = self._lent_from
        self._lent_from = None
        lent_s = (float(t[0]) - t_from) / 1e9
        if hello_at is not None:
            lent_s = min(lent_s, hello_at - left_at + LENT_SLACK_S)
        others = firsts = 0
        if sent is not None and sent_before is not None:  # what other monitors got is counted, not estimated
            others = max(0, int(sent[0] - sent_before[0]))
            lent_s -= max(0.0, sent[1] - sent_before[1])
            # each other attach's first mark ends a token of the moments between, which it counted
            firsts = max(0, int(sent[2] - sent_before[2])) if len(sent) > 2 and len(sent_before) > 2 else 0
        n_after, s_after = _span(t, counted, at_end=False)
        if s_before + s_after <= 0 or lent_s <= 0:
            return others, 0
        # the first point of this attach is counted in it, as each other attach's first is in its count
        return others, max(0, round((n_before + n_after) / (s_before + s_after) * lent_s
                                    - float(counted[0]) * (1 + firsts)))

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
        if self.started is None or _start_time(self.pid) != self.started:
            return f"pid {self.pid} is not the process found (it ended, or its pid was reused)"
        return None


def _lent(reason: str) -> bool:
    """Whether an attach ended because another monitor has the agent (stepped aside for it, or found it busy)."""
    return reason.startswith(wire.LENT_TO_ANOTHER)

