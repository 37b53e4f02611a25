"""One source's column of panels."""

from __future__ import annotations

from textual.containers import Horizontal, VerticalScroll

from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.collectives import CollectivesPanel
from decodemon.monitor.widgets.header import HeaderPanel
from decodemon.monitor.widgets.kernels import KernelsPanel
from decodemon.monitor.widgets.launches import LaunchesPanel
from decodemon.monitor.widgets.panel import SourceNamed
from decodemon.monitor.widgets.serving import ServingPanel
from decodemon.monitor.widgets.telemetry import TelemetryPanel
from decodemon.monitor.widgets.timeline import TimelinePanel
from decodemon.monitor.widgets.verdict import VerdictPanel

PANELS = (HeaderPanel, ServingPanel, VerdictPanel, TimelinePanel, LaunchesPanel, CollectivesPanel, KernelsPanel,
          TelemetryPanel)


class SourcePane(VerticalScroll):
    """Header, serving (a batched engine's), verdict, timeline, launches, collectives, kernels and telemetry of one source.

    The pane itself takes no focus: `tab` moves between its panels, and `z` maximises the panel, not the column.
    """

    DEFAULT_CSS = tcss(__file__)
    can_focus = False

    def __init__(self, side: str = "", **kw) -> None:
        super().__init__(**kw)
        self.side = side  # "left" or "right" in a comparison: named when a panel of it fills the screen
        self.last = None

    def compose(self):
        """The panels, top to bottom."""
        yield HeaderPanel()
        yield ServingPanel()  # a batched engine's only
        yield VerdictPanel()
        yield TimelinePanel()
        with Horizontal():
            yield LaunchesPanel()
            yield CollectivesPanel()
        yield KernelsPanel()
        yield TelemetryPanel()

    def show(self, snap) -> None:
        """Hand one snapshot to every panel."""
        self.last = snap
        for cls in PANELS:
            panel = self.query_one(cls)
            if isinstance(panel, SourceNamed):
                panel.source_label, panel.side = snap.label, self.side
            panel.show(snap)
