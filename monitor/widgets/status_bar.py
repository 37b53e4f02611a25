"""Status bar: each source's state (position and speed of a replay, live, or how the source ended)."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from decodemon.monitor.widgets import tcss


def short_label(label: str) -> str:
    """A source's label cut to its first word (a path to its file name), for a line too narrow for the whole."""
    name = label.rsplit("/", 1)[-1]
    return name.split(" ", 1)[0][:16]


def status_line(states, frozen: bool, width: int = 0) -> str:
    """The states joined, FROZEN while the display is held; shorter labels, then tighter joins, where `width`
    (columns, 0: any) is too narrow for the whole line."""
    tail = "  ·  FROZEN" if frozen else ""
    tries = [("  ·  ", lambda lab: lab), ("  ·  ", short_label), (" · ", short_label)]
    line = ""
    for sep, name in tries:
        line = sep.join(f"{name(label)}: {' '.join(status.split())}" for label, status in states) + (
            sep + "FROZEN" if frozen else "")
        if not width or len(line) <= width:
            return line
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


class StatusBar(Static):
    """One line above the footer; set `states` (label, status) and `frozen`, the line follows and fits the width."""

    DEFAULT_CSS = tcss(__file__)
    states: reactive[tuple] = reactive(tuple)
    frozen: reactive[bool] = reactive(False)
    line: reactive[str] = reactive("")

    def compute_line(self) -> str:
        """The states joined to fit the bar, and FROZEN while the display is held."""
        return status_line(self.states, self.frozen, self.content_size.width)

    def watch_line(self, line: str) -> None:
        """Show the new line."""
        self.update(line)

    def on_resize(self) -> None:
        """Fit the line to the new width."""
        self.update(status_line(self.states, self.frozen, self.content_size.width))
