"""Verdict panel: the binding ceiling in large type, a number for every candidate, remedy, falsification, history."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.diagnosis import ORDER
from decodemon.monitor.rolling import headline
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import latest_error, still_measured, tracing_unavailable

STATE_STYLE = {"binding": "bold red", "ruled_out": "green", "unknown": "yellow"}
CEILING_STYLE = {"launch": "bold white on red", "occupancy": "bold black on yellow", "bandwidth": "bold white on blue",
                 "comm": "bold white on magenta", "kernels": "bold black on cyan", "unknown": "bold white on grey37"}


class VerdictPanel(Panel):
    """Which ceiling binds the token, and the measurement that would prove it wrong."""

    DEFAULT_CSS = tcss(__file__)

    def show(self, s) -> None:
        """Draw one snapshot."""
        d, r = s.diagnosis, s.rolling
        self.border_title = "verdict"
        t = Text()
        ceiling, pending = headline(d, r)
        t.append(f"  {ceiling.upper()}  ", style=CEILING_STYLE.get(ceiling, "bold"))
        untraceable = tracing_unavailable(s) if s.window is None else None
        if pending:
            t.append(f"  pending: {pending}", style="yellow")
        elif s.ended:
            t.append("  stale: the source ended", style="yellow")
        elif untraceable:
            t.append(f"  no traced windows: {untraceable}", style="yellow")
        elif s.window is None:
            t.append("  provisional: no traced window yet", style="yellow")
        t.append("\n")
        if untraceable:
            t.append(still_measured(s) + "\n", style="dim")
            error = latest_error(s)
            if error:
                t.append(f"probe error: {error}\n", style="red")
        for k in ORDER:
            c = d.candidates[k]
            v = "?" if c.value is None else f"{c.value:.3g} {c.unit}"
            t.append(f"{k.upper():<10}", style="bold")
            t.append(f"{c.state.replace('_', ' '):<10}", style=STATE_STYLE[c.state])
            t.append(f"{v}\n")
        t.append("remedy: ", style="bold")
        t.append(d.remedy + "\n")
        t.append("prove it wrong: ", style="bold")
        t.append(d.falsify)
        for h in [c.text() for c in r.history][-3:]:
            t.append(f"\n· {h}", style="dim")
        self.put(t)
