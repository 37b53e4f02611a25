"""Collectives panel: all-reduce calls per token, µs per call, share of the step ("none seen" on one GPU)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from decodemon.monitor.widgets.format import Redraw


class CollectivesPanel(Redraw, Static):
    """NCCL kernels seen in the traced window."""

    DEFAULT_CSS = """
    CollectivesPanel { height: auto; border: round $primary; padding: 0 1; width: 1fr; }
    """

    def show(self, s) -> None:
        """Draw one snapshot."""
        self.border_title = "collectives"
        w = s.window
        t = Text()
        if w is None:
            t.append("waiting for a traced window", style="dim")
        elif not w.collective_calls_per_token:
            t.append("none seen", style="bold")
            t.append(f"\n{s.model.tp_degree if s.model else 1} GPU(s): no all-reduce in the step", style="dim")
        else:
            ms = s.tokens.ms_per_token if s.tokens else None
            share = 100 * w.collective_ms_per_token / ms if ms else None
            t.append(f"{w.collective_calls_per_token:.0f} calls/token · {w.collective_us_per_call:.1f} µs/call\n",
                     style="bold")
            t.append(f"{w.collective_ms_per_token:.3f} ms/token" + (f" = {share:.1f}% of the step" if share else ""))
        self.put(t)
