"""Ratio bar of a comparison: B ÷ A for the figures where a ratio means something."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from decodemon.monitor.alike import differences
from decodemon.monitor.render.json import host_launch_calls
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import num


def _ratio(a, b) -> str:
    return f"{b / a:.2f}×" if a and b else "—"


def _source(s) -> str:
    """GPU busy's source in a word, so two sides read from different instruments say so."""
    if s.gpu_busy_pct is None:
        return ""
    return " (PM)" if s.busy_source.startswith("PM") else " (kernel share)"


class RatioBar(Static):
    """ms/token, host launch calls/token and GPU busy of the right source against the left one."""

    DEFAULT_CSS = tcss(__file__)

    def __init__(self, same_source: bool = False) -> None:
        super().__init__()
        self.same_source = same_source  # both sides name one recording (or one pid): alike.differences says so

    def show(self, a, b) -> None:
        """Draw the ratios of snapshot `b` to snapshot `a`."""
        ms_a = a.tokens.ms_per_token if a.tokens else None
        ms_b = b.tokens.ms_per_token if b.tokens else None
        # the host's launch calls, as `compare --json` counts them: kernel launch calls plus graph launches, from
        # the last window that traced them (a captured graph is one call, not none)
        calls_a, calls_b = host_launch_calls(a), host_launch_calls(b)
        t = Text()
        t.append(f"{b.label} ÷ {a.label}: ", style="bold")
        t.append(f"ms/token median {num(ms_a, '.2f')} → {num(ms_b, '.2f')} ({_ratio(ms_a, ms_b)})  ")
        t.append(f"host launch calls/token {num(calls_a, '.0f')} → {num(calls_b, '.0f')}  ")
        t.append(f"GPU busy {num(a.gpu_busy_pct, '.0f')}%{_source(a)} → {num(b.gpu_busy_pct, '.0f')}%{_source(b)}")
        # what the ratios hold besides a change of code, in `compare --json`'s `differ` words
        for why in (differences(a, b, self.same_source) or {}).values():
            t.append(f"\n⚠ {why}", style="yellow")
        self.update(t)
