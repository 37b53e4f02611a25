"""Launches-per-token panel: the launch bill, with graph launches told apart from kernel launches."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import num, spark
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import tracing_unavailable
from decodemon.monitor.render.text import counted
from decodemon.monitor.widgets.reasons import unit


class LaunchesPanel(Panel):
    """Kernels/token, host launch calls/token, graph launches/token and their history."""

    DEFAULT_CSS = tcss(__file__)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self.border_title = f"launches / {unit(s)}"
        w = s.window
        t = Text()
        if w is None:
            t.append(tracing_unavailable(s) or "waiting for a traced window", style="dim")
        else:
            t.append(f"{w.kernels_per_token:.0f}", style="bold cyan")
            t.append(f" kernels/{unit(s)}\n")
            aw = s.api_window
            calls = num(aw.kernel_launch_calls_per_token, '.0f') if aw is not None else "—"
            t.append(f"{calls} kernel launch calls · "
                     f"{counted(w.graph_launches_per_token, 'graph launch', 'graph launches')} · "
                     f"{counted(w.memcpys_per_token, 'copy', 'copies')}\n")
            if aw is not w:
                t.append("launch calls: " + (f"traced {s.api_window_age_s:.0f} s ago" if aw is not None
                                             else "not traced in this recording" if s.ended
                                             else "not traced yet (from an attach's second window on)")
                         + "\n", style="dim")
            per = s.diagnosis.us_per_kernel
            t.append(f"{num(per, '.2f')} µs idle per kernel\n", style="yellow")
            if aw is not None and not w.graph_launches_per_token:
                extra = w.kernels_per_token - aw.kernel_launch_calls_per_token
                if extra >= 1:  # kernels with no runtime launch call of their own
                    t.append(f"{extra:.0f} kernels/{unit(s)} more than launch calls (libraries launch some "
                             "through the driver)\n", style="dim")
            if s.dropped_records:
                t.append(f"{s.dropped_records} records dropped or invalid\n", style="red")
            hist = (s.series or {}).get("kernels_per_token", ())
            if hist:
                t.append(f"kernels/{unit(s)} per traced window:\n", style="dim")
                t.append(spark(hist, 30, lo=0), style="cyan")
        self.put(t)
