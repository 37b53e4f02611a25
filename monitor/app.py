"""The Textual app: one source, or two side by side (compare and demo), or the ranks of one group.

A worker thread ticks the players and computes snapshots; each snapshot reaches the UI as a message that replaces
any older one still queued for the same pane, so the screen never falls behind the feed. The worker never touches
a widget.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Footer

from decodemon.monitor.safe_text import visible, visible_all
from decodemon.monitor.widgets.group_bar import GroupBar
from decodemon.monitor.widgets.help_screen import HelpScreen
from decodemon.monitor.widgets.kernels import KernelsPanel, next_sort
from decodemon.monitor.widgets.panel import SourceNamed
from decodemon.monitor.widgets.ratio_bar import RatioBar
from decodemon.monitor.widgets.source_pane import SourcePane
from decodemon.monitor.widgets.status_bar import StatusBar
from decodemon.monitor.widgets.timeline import TimelinePanel

__all__ = ["DecodemonApp", "GroupBar", "HelpScreen", "RatioBar", "SnapshotReady", "run_app"]

# Seconds between screen refreshes (`--refresh`). The app's CPU is another process's work beside the decode thread,
# and a busy neighbour slows an eager decode loop measurably. On the graph H200 recording the app used 7.0-7.6% of
# a core at 0.25 s, 4.7-5.2% at 0.5 s and 3.0-3.2% at 1 s (a 2-core machine). Keys redraw at once, whatever the
# refresh.
REFRESH_S = 0.5


class SnapshotReady(Message):
    """A fresh snapshot for one pane; a newer one replaces it if it is still queued."""

    def __init__(self, index: int, snap, status: str) -> None:
        super().__init__()
        self.index, self.snap, self.status = index, snap, status

    def can_replace(self, message: Message) -> bool:
        """A newer snapshot of the same pane replaces a queued one."""
        return isinstance(message, SnapshotReady) and message.index == self.index


def file_slug(label: str) -> str:
    """A source's label as a file-name part: `eager (H200)` → `eager-H200`, `/x/h200_graph.dmon` → `h200_graph`."""
    name = Path(label).name if "/" in label else label
    name = name[:-len(".dmon")] if name.endswith(".dmon") else name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:40] or "source"


def source_slugs(labels) -> list[str]:
    """One distinct file-name part per source (the side's number is added where two labels read the same)."""
    slugs = [file_slug(label) for label in labels]
    return [f"{s}-{i + 1}" if slugs.count(s) > 1 else s for i, s in enumerate(slugs)]


def sides(n: int) -> list[str]:
    """What each pane is called when a panel of it fills the screen: left/right in a comparison."""
    return ["left", "right"] if n == 2 else [f"pane {i + 1}" for i in range(n)] if n > 2 else [""]


class DecodemonApp(App):
    """Watch one or two decode loops, or the ranks of one tensor-parallel group (`group=True`)."""

    CSS_PATH = "app.tcss"
    TITLE = "decodemon"
    AUTO_FOCUS = None  # no panel stands out until `tab` picks one; every key works without focus
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("space", "freeze", "pause"),  # short words: the footer fits 80 columns
        # priority: a focused table or scroll view would take the arrows for its cursor, and seeking would stop
        Binding("left", "seek(-5)", "-5 s", show=False, priority=True),
        Binding("right", "seek(5)", "+5 s", show=False, priority=True),
        Binding("left_square_bracket", "speed(0.5)", "slower", show=False),
        Binding("right_square_bracket", "speed(2)", "faster", show=False),
        Binding("plus,equals_sign", "zoom(2)", "zoom in", show=False),
        Binding("minus", "zoom(0.5)", "zoom out", show=False),
        Binding("k", "sort_kernels", "sort"),
        Binding("z", "maximize", "max"),
        Binding("s", "svg", "SVG"),
        Binding("d", "diagnosis", "diag"),
        Binding("v", "why", "why"),
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
        self._stopping = threading.Event()

    def compose(self) -> ComposeResult:
        """Bars, the panes side by side, the status line and the footer."""
        with Vertical():
            if self.group:
                yield GroupBar()
            elif len(self.players) == 2:
                yield RatioBar(same_source=_one_source(self.players))
            with Horizontal(id="panes"):
                for side in sides(len(self.players)):
                    yield SourcePane(side=side)
            yield StatusBar()
        yield Footer()

    def on_mount(self) -> None:
        """Position the players, paint once, and start the worker."""
        for p in self.players:
            if self.start_at_s is not None:
                p.seek(round(self.start_at_s * 1e9))  # the last frame at --at its own end, not 1 ns before it
            p.paused = self.start_paused
            if getattr(p, "live", False):
                p.start()
        self.frozen = self.start_paused
        self.watch(self.screen, "maximized", self._maximized_changed, init=False)
        self._apply_all()  # deterministic first paint (tests, paused replays)
        if not self.start_paused:
            self._pump()
        if self.quit_after_s:
            self.set_timer(self.quit_after_s, self.exit)

    def _apply_all(self) -> None:
        for i, p in enumerate(self.players):
            self._apply(i, p.snapshot())

    def _apply(self, i: int, snap) -> None:
        # what the target supplied (a model's, kernel's or GPU's name, argv, a reason) reaches every panel as text:
        # its escape sequences shown, never sent to the terminal (the panels keep Textual markup out of it too)
        snap = visible_all(snap)
        panes = list(self.query(SourcePane))
        panes[i].show(snap)
        lasts = [p.last for p in panes]
        if None not in lasts:
            if self.group:
                self.query_one(GroupBar).show(lasts)
            elif len(self.players) == 2:
                self.query_one(RatioBar).show(*lasts)
        bar = self.query_one(StatusBar)
        bar.states = tuple((visible(p.label), visible(p.status())) for p in self.players)

    @work(thread=True, exclusive=True, group="pump")
    def _pump(self) -> None:
        last = time.monotonic()
        while not self._stopping.wait(self.refresh_s):
            now = time.monotonic()
            for i, p in enumerate(self.players):
                p.tick(now - last)
                if not self.frozen:
                    self.post_message(SnapshotReady(i, p.snapshot(), p.status()))
            last = now

    def on_snapshot_ready(self, m: SnapshotReady) -> None:
        """Draw the worker's snapshot."""
        self._apply(m.index, m.snap)

    def on_unmount(self) -> None:
        """Stop the worker and detach from live sources."""
        self._stopping.set()
        for p in self.players:
            if getattr(p, "live", False):
                p.stop()

    def _maximized_changed(self, before, after) -> None:
        for w in (before, after):
            if isinstance(w, SourceNamed):
                w.name_source(w is after)

    # -- actions -------------------------------------------------------------------
    def action_help(self) -> None:
        """Open the help screen."""
        self.push_screen(HelpScreen())

    def action_freeze(self) -> None:
        """Freeze the display of a live source, pause a replay; again to go on."""
        self.frozen = not self.frozen
        for p in self.players:
            p.paused = self.frozen
        if not self.frozen and self.start_paused:  # opened paused: the pump starts on the first play
            self.start_paused = False
            self._pump()
        self._apply_all()

    def action_seek(self, seconds: float) -> None:
        """Move every replay by `seconds`."""
        for p in self.players:
            if not getattr(p, "live", False):
                p.seek(p.clock_ns + round(seconds * 1e9))
        self._apply_all()

    def action_speed(self, factor: float) -> None:
        """Multiply every replay's speed by `factor` (×1/8 to ×64)."""
        for p in self.players:
            if hasattr(p, "speed"):
                p.speed = max(0.125, min(64.0, p.speed * factor))
        self._apply_all()

    def action_zoom(self, factor: float) -> None:
        """Zoom every timeline by `factor`."""
        for tl in self.query(TimelinePanel):
            tl.zoom = int(tl.zoom * factor)

    def action_sort_kernels(self) -> None:
        """Next kernel sort, on every source at once so the sides stay comparable."""
        for table in self.query(KernelsPanel):
            table.sort = next_sort(table.sort)

    def action_maximize(self) -> None:
        """Fill the screen with the focused panel (escape restores)."""
        if self.focused is None:
            self.notify("tab to a panel first: z maximises the focused one")
            return
        self.screen.maximize(self.focused, container=False)

    def action_why(self) -> None:
        """Open how the verdict was reached (the focused side's, else the first): each candidate's threshold and
        inputs with their sources."""
        from decodemon.monitor.widgets.why_screen import WhyScreen

        panes = list(self.query(SourcePane))
        pane = next((p for p in panes if self.focused is not None and self.focused in p.walk_children()), panes[0])
        if pane.last is None:
            self.notify("no figures yet: v shows how the verdict was reached once the source has reported")
            return
        self.push_screen(WhyScreen(pane.last, pane.side))

    def _labels_shown(self) -> list[str]:
        shown = self.screen.maximized
        if isinstance(shown, SourceNamed) and shown.source_label:
            return [shown.source_label]
        return [p.label for p in self.players]

    def action_svg(self) -> None:
        """Save the screen as SVG, named after the sources on it, and say where."""
        name = f"decodemon-{'-vs-'.join(source_slugs(self._labels_shown()))}-{time.strftime('%Y%m%d-%H%M%S')}.svg"
        path = self.out_dir.absolute() / name
        from decodemon.monitor.safe_write import Refused, write_text_whole

        try:
            write_text_whole(path, self.export_screenshot())  # never through a link another user planted
        except (Refused, OSError) as exc:
            self.notify(visible(exc), severity="error", markup=False)
            return
        self.notify(visible(f"saved {path}"), markup=False)

    def action_diagnosis(self) -> None:
        """Write DIAGNOSIS-<source>.md for each source, and say where."""
        from decodemon.monitor.render.markdown import diagnosis_markdown
        from decodemon.monitor.safe_write import Refused, write_text_whole

        written = []
        for p, slug in zip(self.players, source_slugs(p.label for p in self.players)):
            path = self.out_dir.absolute() / f"DIAGNOSIS-{slug}.md"
            try:
                write_text_whole(path, diagnosis_markdown(p.snapshot()))  # never through another user's link
            except (Refused, OSError) as exc:
                self.notify(visible(exc), severity="error", markup=False)
                return
            written.append(f"{path} (of {p.label})")
        self.notify(visible("wrote " + "; ".join(written)), markup=False)


def _one_source(players) -> bool:
    """Both players read one recording, or watch one pid."""
    from decodemon.monitor.alike import same_source

    specs = [str(getattr(p, "path", None) or getattr(p, "pid", None) or "") for p in players]
    return all(specs) and same_source(*specs)


def run_app(specs, settings=None, speed: float = 1.0, loop: bool = False, labels=None, quit_after_s=None,
            start_at_s: float | None = None, paused: bool = False, group: bool = False,
            refresh_s: float | None = None) -> int:
    """Open the app on one or two sources (pids or recordings), or on the ranks of one group (`group`; `settings`
    may then be a list, one per rank). A pid is checked by the verb that takes it (`check_pid`), before this."""
    from decodemon.monitor.player import make_players

    DecodemonApp(make_players(specs, settings, speed=speed, loop=loop, labels=labels), quit_after_s=quit_after_s,
                 start_at_s=start_at_s, paused=paused, group=group, refresh_s=refresh_s).run()
    return 0
