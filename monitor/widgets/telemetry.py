"""Telemetry panel: recent GPU busy, SM active, DRAM %, ms/token, SM clock and power."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.render.text import unit
from decodemon.monitor.token_clock import clock_kind
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import num, spark
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import has_no_gpu, probe_field

ROWS = (("gpu_busy_pct", "GPU busy %", 0, 100), ("sm_active_pct", "SM active %", 0, 100),
        ("dram_pct", "DRAM %", 0, 100), ("ms_per_token", "ms/token", 0, None),
        ("sm_clock_mhz", "SM MHz", 0, None), ("power_w", "power W", 0, None))


class TelemetryPanel(Panel):
    """Sparklines over the last 30 s (PM counters are device-wide)."""

    DEFAULT_CSS = tcss(__file__)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s
        self.border_title = "telemetry · no GPU: ms/token only" if has_no_gpu(s) else \
            "telemetry · PM counters are device-wide"
        series = s.series or {}
        width = max(10, (self.content_size.width or 72) - 21)
        t = Text()
        for key, label, lo, hi in ROWS:
            vals = series.get(key, ())
            last = next((v for v in reversed(vals) if v == v), None)
            if key == "ms_per_token" and s.tokens_per_step is not None:
                label = "ms/step"  # a batched engine's marks are steps
            t.append(f"{label:<11}{num(last, '.4g'):>8} ", style="bold")
            t.append(spark(vals, width, lo, hi) + "\n", style="cyan")
        mark = unit(s)
        t.append(f"each bar ½ s, the number its latest: ms/{mark} its median (the header's is the "
                 f"{clock_kind(s.token_clock)} of the span), the others their mean\n", style="dim")
        from decodemon.monitor.probe_status import pm_silence  # with the feed, not the app

        pm_lost, pm_note = probe_field(s, "pm_lost"), probe_field(s, "pm_note")
        silent = pm_silence(s)
        if silent:
            t.append(silent, style="yellow")
        elif not s.pm:
            pm = "none: there is no GPU to sample" if has_no_gpu(s) else probe_field(s, "pm") or "not reported"
            t.append(f"PM sampling: {pm}", style="dim")
        elif pm_lost:
            t.append(f"PM samples lost: {pm_lost}", style="yellow")
        elif pm_note:
            t.append(f"note: {pm_note}", style="dim")
        self.put(t)
