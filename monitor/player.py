"""Feeding sessions: a live attach, or a recording played on a virtual clock (play, pause, seek, speed).

UI-free: a player owns a `Session`, runs in a worker thread, and hands out
frozen snapshots on request. The app never touches a session.
"""

from __future__ import annotations

import threading

from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.sources.live import live_frames
from decodemon.monitor.sources.recording import recording_frames
from decodemon.monitor.session import Session
from decodemon.probes import wire


class RecordingPlayer:
    """A recording on a virtual clock. Seeking back replays the frames from the start (they are a few MB)."""

    live = False

    def __init__(self, path: str, label: str | None = None, speed: float = 1.0, loop: bool = False) -> None:
        self.path, self.label, self.speed, self.loop = path, label or path, speed, loop
        self.frames = [(rx, fr) for rx, _, fr in recording_frames(path)]
        self.end_ns = self.frames[-1][0] if self.frames else 0
        # a loop's pass: the recording's length, or longer where players shown side by side pass together (the
        # shorter holds its end until the longer ends: `in_step`)
        self.period_ns = self.end_ns
        self.paused = False
        self._lock = threading.Lock()
        self._previous = None  # a loop's finished pass: shown until the new pass has a traced window
        self._reset()

    def _reset(self, looped: bool = False) -> None:
        self._previous = self.session if looped else None
        self.session = Session(label=self.label)
        self._i = 0
        self.clock_ns = 0
        self.pass_ns = 0  # the loop's clock: past end_ns while a player in step with a longer one holds its end

    def _advance_to(self, t_ns: int) -> None:
        while self._i < len(self.frames) and self.frames[self._i][0] <= t_ns:
            self.session.add(*self.frames[self._i])
            self._i += 1
        self.clock_ns = t_ns

    def seek(self, t_ns: int) -> None:
        """Jump to `t_ns` since the recording began."""
        with self._lock:
            t_ns = max(0, min(int(t_ns), self.end_ns))
            if t_ns < self.clock_ns:
                self._reset()
            self._advance_to(t_ns)
            self.pass_ns = t_ns

    def tick(self, dt_s: float) -> None:
        """Advance the virtual clock by `dt_s` of wall time at the current speed."""
        with self._lock:
            if self.paused:
                return
            t = self.pass_ns + int(dt_s * self.speed * 1e9)
            if t > self.period_ns and self.loop:
                self._reset(looped=True)
                t = 0
            self.pass_ns = t
            self._advance_to(min(t, self.end_ns))

    def snapshot(self):
        """The session's snapshot at the current clock; while a loop's new pass has no traced window yet, the
        last pass's end (a looping screen does not blank between passes)."""
        with self._lock:
            if self._previous is not None and not self.session.metrics:
                return self._previous.snapshot(at_rx_ns=self.end_ns)
            self._previous = None
            return self.session.snapshot(at_rx_ns=self.clock_ns)

    def status(self) -> str:
        """Position, speed and state for the status bar."""
        # to 10 ms: an --at a little short of the end is told apart from it (and from --last's span, which ends there)
        if self.clock_ns >= self.end_ns and not self.loop:
            return f"{self.end_ns / 1e9:.2f} s, end of recording"
        state = "paused" if self.paused else f"playing ×{self.speed:g}"
        # to 0.1 ms within 10 ms of the end: the last frames come within a few ms (a batch of marks, PM's last
        # samples, the bye), and each changes the figures, so no two positions that show different ones read alike
        nd = 4 if self.end_ns - self.clock_ns < 10_000_000 else 2
        return f"{self.clock_ns / 1e9:6.{nd}f}/{self.end_ns / 1e9:.{nd}f} s {state}"


def in_step(players: list) -> list:
    """Recording players that loop side by side, made to pass together: each pass lasts as long as the longest
    recording's, so the sides start again at one instant instead of drifting apart pass after pass."""
    period = max((p.period_ns for p in players if not p.live), default=0)
    for p in players:
        if not p.live:
            p.period_ns = period
    return players


class LivePlayer:
    """A live attach read in a worker thread; frames go into the session as they arrive."""

    live = True

    def __init__(self, pid: int, settings: wire.Attach | None = None, label: str | None = None) -> None:
        self.pid, self.settings, self.label = pid, settings, label or f"pid {pid}"
        self.session = Session(label=self.label)
        self.paused = False  # a frozen display; collection continues
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"decodemon-live-{pid}", daemon=True)

    def start(self) -> None:
        """Begin reading."""
        self.thread.start()

    def _run(self) -> None:
        try:
            for rx, _, frame in live_frames(self.pid, self.settings, stop=self._stop.is_set):
                with self._lock:
                    self.session.add(rx, frame)
        except (SourceError, wire.WireError, OSError) as exc:
            self.error = str(exc)
            with self._lock:
                self.session.add(self.session.feed.last_rx_ns, wire.Bye(reason=str(exc)))

    def stop(self) -> None:
        """Detach."""
        self._stop.set()

    def tick(self, dt_s: float) -> None:
        """Nothing to advance: the clock is the target's."""

    def seek(self, t_ns: int) -> None:
        """Live sources cannot seek."""

    def snapshot(self):
        """The session's snapshot now."""
        with self._lock:
            return self.session.snapshot()

    def status(self) -> str:
        """Live state for the status bar: live (frozen), or how the source ended once it has."""
        with self._lock:
            ended = self.session.feed.bye
        if ended:
            return f"ended: {ended}"
        return "live, frozen" if self.paused else "live"


def make_player(spec: str, settings=None, speed: float = 1.0, loop: bool = False, label: str | None = None):
    """A player for a pid (digits) or a recording path."""
    if spec.isdigit():
        return LivePlayer(int(spec), settings, label)
    return RecordingPlayer(spec, label, speed=speed, loop=loop)


def make_players(specs, settings=None, speed: float = 1.0, loop: bool = False, labels=None) -> list:
    """A player for each spec, in step (`in_step`); `settings` is one Attach for all, or a list with one per
    spec."""
    labels = labels or [None] * len(specs)
    each = settings if isinstance(settings, list) else [settings] * len(specs)
    return in_step([make_player(s, st, speed=speed, loop=loop, label=lab) for s, st, lab in zip(specs, each, labels)])
