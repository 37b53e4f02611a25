"""Status bar: each source's state (position and speed of a replay, live, or how the source ended)."""

from __future__ import annotations

import re

from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from decodemon.monitor.widgets import tcss


def short_label(label: str) -> str:
    """A source's label without its note in brackets (a path: its file name, without .dmon), for a line too narrow
    for the whole; a long name keeps its end, where the names of a group's files differ (…graph_rank0)."""
    name = label.split(" (", 1)[0].rsplit("/", 1)[-1].removesuffix(".dmon")
    return name if len(name) <= 16 else "…" + name[-15:]


def status_line(states, width: int = 0) -> str:
    """The states joined (each says for itself that it is paused or frozen); shorter labels, then tighter joins,
    then one state for sources that share it, where `width` (columns, 0: any) is too narrow for the whole line."""
    states = [(label, " ".join(status.split())) for label, status in states]
    tries = [("  ·  ", lambda lab: lab), ("  ·  ", short_label), (" · ", short_label)]
    line = ""
    for sep, name in tries:
        line = sep.join(f"{name(label)}: {status}" for label, status in states)
        if not width or len(line) <= width:
            return line
    for st in (states, [(label, re.sub(r"^\s*[\d.]+(/[\d.]+)? s,? ", "", status)) for label, status in states]):
        # a group's replays in one state: said once (their positions left out where they differ, too narrow)
        if len(st) > 1 and len({status for _, status in st}) == 1:
            line = ", ".join(short_label(label) for label, _ in st) + f": {st[0][1]}"
            if len(line) <= width:
                return line
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


class StatusBar(Static):
    """One line above the footer; set `states` (label, status), the line follows and fits the width."""

    DEFAULT_CSS = tcss(__file__)
    states: reactive[tuple] = reactive(tuple)
    line: reactive[str] = reactive("")

    def compute_line(self) -> str:
        """The states joined to fit the bar."""
        return status_line(self.states, self.content_size.width)

    def watch_line(self, line: str) -> None:
        """Show the new line, as it reads (labels and reasons are never Textual markup)."""
        self.update(Content(line))

    def on_resize(self) -> None:
        """Fit the line to the new width."""
        self.update(Content(status_line(self.states, self.content_size.width)))
