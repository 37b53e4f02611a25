"""Telemetry panel: recent GPU busy, SM active, DRAM %, ms/token, SM clock and power."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from decodemon.monitor.widgets.format import Redraw, num, spark

ROWS = (("gpu_busy_pct", "GPU busy %", 0, 100), ("sm_active_pct", "SM active %", 0, 100),
        ("dram_pct", "DRAM %", 0, 100), ("ms_per_token", "ms/token", 0, None),
        ("sm_clock_mhz", "SM MHz", 0, None), ("power_w", "power W", 0, None))


class TelemetryPanel(Redraw, Static):
    """Sparklines over the last 30 s (PM counters are device-wide)."""

    DEFAULT_CSS = """
    TelemetryPanel { height: auto; border: round $primary; padding: 0 1; }
    """

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s
        self.border_title = "telemetry · PM counters are device-wide"
        series = s.series or {}
        width = max(10, (self.content_size.width or 72) - 21)
        t = Text()
        for key, label, lo, hi in ROWS:
            vals = series.get(key, ())
            last = next((v for v in reversed(vals) if v == v), None)
            t.append(f"{label:<11}{num(last, '.4g'):>8} ", style="bold")
            t.append(spark(vals, width, lo, hi) + "\n", style="cyan")
        if not s.pm:
            t.append(f"PM sampling: {s.probe.get('pm', 'not reported')}", style="dim")
        elif s.probe.get("pm_lost"):
            t.append(f"PM samples lost: {s.probe['pm_lost']}", style="yellow")
        elif s.probe.get("pm_note"):
            t.append(f"note: {s.probe['pm_note']}", style="dim")
        self.put(t)
