"""What every bordered panel shares: it takes focus (so `tab` reaches it and `z` fills the screen with it), shows
focus plainly, and names its source while it is maximised."""

from __future__ import annotations

from textual.content import Content
from textual.widgets import Static

from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import Redraw


class SourceNamed:
    """Mixin: the panel knows which source (and side of a comparison) it draws."""

    source_label = ""
    side = ""

    def name_source(self, maximized: bool) -> None:
        """Name the source in the border's subtitle while the panel fills the screen; clear it after."""
        where = f"{self.source_label} ({self.side})" if self.side else self.source_label
        # as it reads: a label is a path or what a target said, never Textual markup
        self.border_subtitle = Content(f"source: {where} · escape restores") if maximized else ""


class Panel(SourceNamed, Redraw, Static):
    """A focusable, bordered Static panel that draws one snapshot at a time."""

    DEFAULT_CSS = tcss(__file__)
    can_focus = True
