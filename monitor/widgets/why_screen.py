"""Why screen (`v`): one source's verdict with every candidate's threshold and inputs, whatever the terminal's width;
it scrolls where the terminal is short."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Static

from decodemon.monitor.widgets.verdict import verdict_text


class WhyScreen(ModalScreen):
    """How the verdict of one snapshot was reached."""

    CSS_PATH = "why_screen.tcss"
    BINDINGS = [("escape,q,v", "app.pop_screen", "close")]

    def __init__(self, snap, side: str = "") -> None:
        super().__init__()
        self.snap, self.side = snap, side

    def compose(self) -> ComposeResult:
        """The reasoning in a bordered box named after its source."""
        box = VerticalScroll()
        where = f"{self.snap.label} ({self.side})" if self.side else self.snap.label
        box.border_title = Content(f"why · {where}")  # as it reads: a label is never Textual markup
        box.border_subtitle = "as of the key press · ↑ ↓ PgUp PgDn scroll · escape closes"
        with box:
            yield Static(id="why")

    def on_mount(self) -> None:
        """Draw at the box's width and give it focus, so the keys scroll it."""
        box = self.query_one(VerticalScroll)
        self.query_one("#why", Static).update(verdict_text(self.snap, max(20, box.content_size.width - 2), full=True))
        box.focus()
