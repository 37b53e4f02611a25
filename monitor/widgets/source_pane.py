"""One source's column of panels."""

from __future__ import annotations

from textual.containers import Horizontal, VerticalScroll

from decodemon.monitor.widgets.collectives import CollectivesPanel
from decodemon.monitor.widgets.header import HeaderPanel
from decodemon.monitor.widgets.kernels import KernelsPanel
from decodemon.monitor.widgets.launches import LaunchesPanel
from decodemon.monitor.widgets.telemetry import TelemetryPanel
from decodemon.monitor.widgets.timeline import TimelinePanel
from decodemon.monitor.widgets.verdict import VerdictPanel


class SourcePane(VerticalScroll):
    """Header, verdict, timeline, launches, collectives, kernels and telemetry of one source."""

    DEFAULT_CSS = """
    SourcePane { width: 1fr; height: 1fr; }
    SourcePane > Horizontal { height: auto; }
    """

    def compose(self):
        yield HeaderPanel()
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
        for cls in (HeaderPanel, VerdictPanel, TimelinePanel, LaunchesPanel, CollectivesPanel, KernelsPanel,
                    TelemetryPanel):
            self.query_one(cls).show(snap)
