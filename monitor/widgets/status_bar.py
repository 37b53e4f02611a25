"""Status bar: each source's state (position and speed of a replay, live, or how the source ended)."""

from __future__ import annotations

from textual.reactive import reactive
from textual.widgets import Static

from decodemon.monitor.widgets import tcss


class StatusBar(Static):
    """One line above the footer; set `states` (label, status) and `frozen`, the line follows."""

    DEFAULT_CSS = tcss(__file__)
    states: reactive[tuple] = reactive(tuple)
    frozen: reactive[bool] = reactive(False)
    line: reactive[str] = reactive("")

    def compute_line(self) -> str:
        """The states joined, and FROZEN while the display is held."""
        return "  ·  ".join(f"{label}: {status}" for label, status in self.states) + (
            "  ·  FROZEN" if self.frozen else "")

    def watch_line(self, line: str) -> None:
        """Show the new line."""
        self.update(line)
