"""The Textual app: one source, or two side by side (compare and demo).

A worker thread ticks the players and computes snapshots four times a
second; each snapshot reaches the UI as a message that replaces any older
one still queued for the same pane, so the screen never falls behind the feed.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from decodemon.monitor.widgets.format import num
from decodemon.monitor.widgets.source_pane import SourcePane
from decodemon.monitor.widgets.timeline import TimelinePanel

# Seconds between screen refreshes (`--refresh`). The app's CPU is another process's work beside the decode thread,
# and on the H200's host that slowed an eager decode thread (+0.71% for a process busy 10% of a core, thirteenth
# session, scripts/h200_attached_cost.py). The app on the graph H200 recording used 7.0-7.6% of a core at 0.25 s,
# 4.7-5.2% at 0.5 s and 3.0-3.2% at 1 s on this repository's 2-core CPU machine (scripts/monitor_cpu.py
# --refresh, two runs each, fourteenth session). Keys redraw at once, whatever the refresh.
REFRESH_S = 0.5

HELP = """\
decodemon keys

  space   freeze the display (live) / pause (replay)
  ← →     seek 5 s back / forward (replay)
  [ ]     slower / faster (replay)
  + -     zoom the timeline in / out
  k       cycle the kernel sort (time, time × idle SMs, calls)
  tab     move focus between panels
  z       maximize the focused panel (escape to restore)
  s       export the screen as SVG
  d       write DIAGNOSIS.md for each source
  ?       this help
  q       quit

GPU busy, SM active and DRAM % come from PM counters, which cover the whole
GPU: when two engines share one GPU they are device-wide. Launches, kernel
times, grids and gaps come from traced windows and belong to one process.
"""


class SnapshotReady(Message):
    """A fresh snapshot for one pane; a newer one replaces it if it is still queued."""

    def __init__(self, index: int, snap, status: str) -> None:
        super().__init__()
        self.index, self.snap, self.status = index, snap, status

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SnapshotReady) and message.index == self.index


class HelpScreen(ModalScreen):
    """Keys and what the figures mean."""

    BINDINGS = [("escape,q,question_mark", "app.pop_screen", "close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > Static { width: 80; height: auto; border: round $accent; background: $surface; padding: 1 2; }
    """

    def compose(self) -> ComposeResult:
        yield Static(HELP)


class RatioBar(Static):
    """B ÷ A for the figures where a ratio means something."""

    DEFAULT_CSS = """
    RatioBar { height: auto; padding: 0 1; background: $panel; }
    """

    def show(self, a, b) -> None:
        def ratio(x, y):
            return f"{y / x:.2f}×" if x and y else "—"

        ta, tb = a.tokens, b.tokens
        wa, wb = a.api_window, b.api_window  # host launch calls: from the last window that traced them
        t = Text()
        t.append(f"{b.label} ÷ {a.label}: ", style="bold")
        t.append(f"ms/token {num(ta.ms_per_token if ta else None, '.2f')} → {num(tb.ms_per_token if tb else None, '.2f')} "
                 f"({ratio(ta.ms_per_token if ta else None, tb.ms_per_token if tb else None)})  ")
        t.append(f"host launch calls/token {num(wa.kernel_launch_calls_per_token if wa else None, '.0f')} → "
                 f"{num(wb.kernel_launch_calls_per_token if wb else None, '.0f')}  ")
        t.append(f"GPU busy {num(a.gpu_busy_pct, '.0f')}% → {num(b.gpu_busy_pct, '.0f')}%")
        self.update(t)


class GroupBar(Static):
    """One tensor-parallel group: who the others wait for, the all-reduce's price, every rank's verdict."""

    DEFAULT_CSS = """
    GroupBar { height: auto; padding: 0 1; background: $panel; }
    """

    def show(self, snaps) -> None:
        from decodemon.monitor.ranks import combine

        g = combine(snaps)
        self.group = g
        t = Text()
        t.append(f"TP={g['tp']}  ", style="bold")
        last = g.get("last_to_arrive_rank")
        ranks = {r["tp_rank"]: r for r in g["ranks"]}
        if last is not None and last in ranks:
            c = ranks[last]["collectives"]
            t.append(f"all-reduce {num(g['collective_us_per_call'], '.1f')} µs/call "
                     f"(kernel {num(c.get('kernel_us_per_call'), '.1f')} + launch gap "
                     f"{num(c.get('launch_gap_us_per_call'), '.1f')}) × {num(c.get('calls_per_token'), '.0f')}/token"
                     f" = {num(c.get('share_of_step_pct'), '.1f')}% of the step  ", style="bold")
            t.append(f"the others wait for rank {last}  ")
        else:
            t.append("all-reduce: waiting for a traced window on two ranks  ", style="dim")
        t.append("verdicts: " + ", ".join(f"rank {r['tp_rank']} {str(r['verdict']).upper()}" for r in g["ranks"]))
        self.update(t)


class DecodemonApp(App):
    """Watch one or two decode loops, or the ranks of one tensor-parallel group (`group=True`)."""

    CSS_PATH = "app.tcss"
    TITLE = "decodemon"
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("space", "freeze", "freeze/pause"),
        Binding("left", "seek(-5)", "-5 s", show=False),
        Binding("right", "seek(5)", "+5 s", show=False),
        Binding("left_square_bracket", "speed(0.5)", "slower", show=False),
        Binding("right_square_bracket", "speed(2)", "faster", show=False),
        Binding("plus,equals_sign", "zoom(2)", "zoom in", show=False),
        Binding("minus", "zoom(0.5)", "zoom out", show=False),
        Binding("z", "maximize", "maximize"),
        Binding("s", "svg", "SVG"),
        Binding("d", "diagnosis", "DIAGNOSIS.md"),
    ]

    def __init__(self, players, start_at_s: float | None = None, paused: bool = False, out_dir: str = ".",
                 quit_after_s: float | None = None, group: bool = False, refresh_s: float | None = None) -> None:
        super().__init__()
        self.players = players
        self.group = group
        self.start_at_s, self.start_paused = start_at_s, paused
        self.out_dir = Path(out_dir)
        self.quit_after_s = quit_after_s
        self.refresh_s = refresh_s or REFRESH_S
        self.frozen = False
        self._running = True

    def compose(self) -> ComposeResult:
        with Vertical():
            if self.group:
                yield GroupBar()
            elif len(self.players) == 2:
                yield RatioBar()
            with Horizontal(id="panes"):
                for _ in self.players:
                    yield SourcePane()
            yield Static(id="status")
        yield Footer()

    def on_mount(self) -> None:
        for p in self.players:
            if self.start_at_s is not None:
                p.seek(int(self.start_at_s * 1e9))
            p.paused = self.start_paused
            if getattr(p, "live", False):
                p.start()
        self.frozen = self.start_paused
        self._apply_all()  # deterministic first paint (tests, paused replays)
        if not self.start_paused:
            self._pump()
        if self.quit_after_s:
            self.set_timer(self.quit_after_s, self.exit)

    def _apply_all(self) -> None:
        for i, p in enumerate(self.players):
            self._apply(i, p.snapshot(), p.status())

    def _apply(self, i: int, snap, status: str) -> None:
        panes = list(self.query(SourcePane))
        panes[i].show(snap)
        if self.group and all(hasattr(p, "last") for p in panes):
            self.query_one(GroupBar).show([p.last for p in panes])
        elif len(self.players) == 2 and all(hasattr(p, "last") for p in panes):
            self.query_one(RatioBar).show(panes[0].last, panes[1].last)
        self.query_one("#status", Static).update(
            "  ·  ".join(f"{p.label}: {p.status()}" for p in self.players) + ("  ·  FROZEN" if self.frozen else ""))

    @work(thread=True, exclusive=True, group="pump")
    def _pump(self) -> None:
        last = time.monotonic()
        while self._running:
            time.sleep(self.refresh_s)
            now = time.monotonic()
            for i, p in enumerate(self.players):
                p.tick(now - last)
                if not self.frozen:
                    self.post_message(SnapshotReady(i, p.snapshot(), p.status()))
            last = now

    def on_snapshot_ready(self, m: SnapshotReady) -> None:
        self._apply(m.index, m.snap, m.status)

    def on_unmount(self) -> None:
        self._running = False
        for p in self.players:
            if getattr(p, "live", False):
                p.stop()

    # -- actions -------------------------------------------------------------------
    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_freeze(self) -> None:
        self.frozen = not self.frozen
        for p in self.players:
            p.paused = self.frozen
        if not self.frozen and self.start_paused:  # opened paused: the pump starts on the first play
            self.start_paused = False
            self._pump()
        self._apply_all()

    def action_seek(self, seconds: float) -> None:
        for p in self.players:
            if not getattr(p, "live", False):
                p.seek(p.clock_ns + int(seconds * 1e9))
        self._apply_all()

    def action_speed(self, factor: float) -> None:
        for p in self.players:
            if hasattr(p, "speed"):
                p.speed = max(0.125, min(64.0, p.speed * factor))
        self._apply_all()

    def action_zoom(self, factor: float) -> None:
        for tl in self.query(TimelinePanel):
            tl.zoom = int(max(1, min(64, tl.zoom * factor)))
        self._apply_all()

    def action_maximize(self) -> None:
        if self.focused is not None:
            self.screen.maximize(self.focused)

    def action_svg(self) -> None:
        path = self.save_screenshot(path=str(self.out_dir))
        self.notify(f"saved {path}")

    def action_diagnosis(self) -> None:
        from decodemon.monitor.report import diagnosis_markdown

        written = []
        for i, p in enumerate(self.players):
            name = "DIAGNOSIS.md" if len(self.players) == 1 else f"DIAGNOSIS-{i + 1}.md"
            path = self.out_dir / name
            path.write_text(diagnosis_markdown(p.snapshot()))
            written.append(str(path))
        self.notify("wrote " + ", ".join(written))


def run_app(specs, settings=None, speed: float = 1.0, loop: bool = False, labels=None, quit_after_s=None,
            start_at_s: float | None = None, paused: bool = False, group: bool = False,
            refresh_s: float | None = None) -> int:
    """Open the app on one or two sources (pids or recordings), or on the ranks of one group (`group`; `settings`
    may then be a list, one per rank)."""
    from decodemon.monitor.client import check_pid
    from decodemon.monitor.player import make_player

    for s in specs:
        if s.isdigit():
            check_pid(int(s))  # one clear line before the screen opens
    labels = labels or [None] * len(specs)
    each = settings if isinstance(settings, list) else [settings] * len(specs)
    players = [make_player(s, st, speed=speed, loop=loop, label=lab) for s, st, lab in zip(specs, each, labels)]
    DecodemonApp(players, quit_after_s=quit_after_s, start_at_s=start_at_s, paused=paused, group=group,
                 refresh_s=refresh_s).run()
    return 0
