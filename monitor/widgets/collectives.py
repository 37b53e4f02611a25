"""Collectives panel: all-reduce calls per token, µs per call (kernel + launch gap), share of the step, time spent
waiting for a late peer ("none seen" on one GPU)."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.ceilings import peer_wait_named
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import tracing_unavailable
from decodemon.monitor.widgets.reasons import peer_wait


class CollectivesPanel(Panel):
    """NCCL kernels seen in the traced window."""

    DEFAULT_CSS = tcss(__file__)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self.border_title = "collectives"
        w = s.window
        t = Text()
        if w is None:
            t.append(tracing_unavailable(s) or "waiting for a traced window", style="dim")
        elif s.collective_window is None or not (s.inputs and s.inputs.collectives_per_token):  # none COMM priced
            t.append("none seen", style="bold")
            t.append(f"\n{s.model.tp_degree if s.model else 1} GPU(s): no all-reduce in the step", style="dim")
        else:
            ms = s.tokens.ms_per_token if s.tokens else None
            calls, own, gap, wait = s.collective_terms()  # as COMM priced them over the span
            us = s.collective_us_priced
            share = 100 * calls * us / 1e3 / ms if ms else None
            t.append(f"{calls:.0f} calls/token · {us:.1f} µs/call", style="bold")
            t.append(f" (kernel {own:.1f} + launch gap {gap:.1f})\n", style="dim")
            t.append(f"{calls * us / 1e3:.3f} ms/token" + (f" = {share:.1f}% of the step" if share else ""))
            if peer_wait_named(wait, ms):
                t.append(f"\n+{wait:.3f} ms/token waiting for a late peer", style="yellow")
            if peer_wait(s):  # both ranks traced in the same tokens: the wait is the tracing's, said where it shows
                t.append("\nranks traced in the same tokens run late by turns: the wait is not priced as COMM",
                         style="yellow")
        self.put(t)
