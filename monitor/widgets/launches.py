"""Launches-per-token panel: the launch bill, with graph launches told apart from kernel launches."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import num, spark
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import tracing_unavailable
from decodemon.monitor.render.text import counted, runtime_split
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
            t.append(f"{w.kernel_launch_calls_per_token:.0f} kernel launch calls{runtime_split(s)} · "
                     f"{counted(w.graph_launches_per_token, 'graph launch', 'graph launches')} · "
                     f"{counted(w.memcpys_per_token, 'copy', 'copies')}\n")
            per = s.diagnosis.us_per_kernel
            t.append(f"{num(per, '.2f')} µs {s.diagnosis.per_kernel_word} per kernel\n", style="yellow")
            if s.dropped_records:
                t.append(f"{s.dropped_records} records dropped or invalid\n", style="red")
            hist = (s.series or {}).get("kernels_per_token", ())
            if hist:
                t.append(f"kernels/{unit(s)} per traced window:\n", style="dim")
                t.append(spark(hist, 30, lo=0), style="cyan")
        self.put(t)
