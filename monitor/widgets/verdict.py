"""Verdict panel: the binding ceiling in large type, a number for every candidate with its threshold and its inputs'
sources, the sentence that decides, remedy, falsification and history."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.ceilings import ORDER
from decodemon.monitor.rolling import headline
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import value_words
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import has_no_gpu, latest_error, still_measured, tracing_unavailable
from decodemon.monitor.widgets.reasons import decides, history_note, in_marks, inputs_line
from decodemon.probes import wire

STATE_STYLE = {"binding": "bold red", "ruled_out": "green", "unknown": "yellow"}
CEILING_STYLE = {"launch": "bold white on red", "occupancy": "bold black on yellow", "bandwidth": "bold white on blue",
                 "comm": "bold white on magenta", "kernels": "bold black on cyan", "unknown": "bold white on grey37"}
# narrower than this (an 80-column terminal, a side of a comparison on 160), the panel shows each candidate on one
# line and its threshold and inputs one key away (`v`); from WIDE_WIDTH on, a threshold fits beside its candidate
FULL_WIDTH = 90
WIDE_WIDTH = 110


def value_text(c) -> str:
    """A candidate's number and unit, or "?" where it has none."""
    return value_words(c.value, c.unit)


def verdict_text(s, width: int, full: bool | None = None) -> Text:
    """The verdict of one snapshot in `width` columns: each candidate's threshold and inputs beside it where `full`
    (by default, where the width allows), else one line per candidate and the key that shows the rest."""
    d, r = s.diagnosis, s.rolling
    wide = width >= WIDE_WIDTH
    full = width >= FULL_WIDTH if full is None else full
    t = Text()
    ceiling, pending = headline(d, r)
    t.append(f"  {ceiling.upper()}  ", style=CEILING_STYLE.get(ceiling, "bold"))
    untraceable = tracing_unavailable(s) if s.window is None else None
    if pending:
        t.append(f"  {pending}", style="yellow")
    elif s.ended and s.ended.startswith(wire.LENT_TO_ANOTHER):  # another monitor has the agent
        t.append(f"  not watched: {s.ended}", style="yellow")
    elif s.ended:
        t.append("  stale: the source ended", style="yellow")
    elif untraceable:
        t.append(f"  no traced windows: {untraceable}", style="yellow")
    elif s.window is None:
        t.append("  provisional: no traced window yet", style="yellow")
    t.append("\ndecides: ", style="bold")
    t.append(decides(s) + "\n")
    if d.edge:  # the verdict sits on a threshold: a span a little longer or shorter may read another
        t.append(in_marks(s, d.edge) + "\n", style="yellow")
    note = history_note(s)
    if note:
        t.append(note + "\n", style="yellow")
    if untraceable:
        t.append(still_measured(s) + "\n", style="dim")
        error = latest_error(s)
        if error:
            t.append(f"probe error: {error}\n", style="red")
    no_gpu = has_no_gpu(s)
    for k in ORDER:
        c = d.candidates[k]
        t.append(f"{k.upper():<10}", style="bold")
        t.append(f"{c.state.replace('_', ' '):<10}", style=STATE_STYLE[c.state])
        value = value_text(c)
        # the number and its unit's first word ("8.51 µs/launch", "72.1%") stay on one line: on the next one where
        # they do not fit beside the state
        if not full and c.value is not None and 20 + len(value_words(c.value, c.unit.split(" ")[0])) > width:
            value = "\n  " + value
        t.append(value)
        if full and not no_gpu:
            t.append(f"   threshold: {c.threshold}" if wide else f"\n  threshold: {c.threshold}", style="dim")
            t.append(f"\n{' ' * 10 if wide else '  '}← {in_marks(s, inputs_line(s, k))}", style="dim")
        t.append("\n")
    if not full and not no_gpu:
        t.append("v: each candidate's threshold and inputs, with their sources\n", style="dim")
    t.append("remedy: ", style="bold")
    t.append(in_marks(s, d.remedy) + "\n")
    t.append("prove it wrong: ", style="bold")
    t.append(in_marks(s, d.falsify))
    for h in [c.text() for c in r.history][-3:]:
        t.append(f"\n· {h}", style="dim")
    return t


class VerdictPanel(Panel):
    """Which ceiling binds the token, how each candidate was priced, and the measurement that would prove it wrong."""

    DEFAULT_CSS = tcss(__file__)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s
        self.border_title = "verdict"
        self.put(verdict_text(s, self.content_size.width or 200))
