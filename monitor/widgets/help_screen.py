"""Help screen: the keys, and which figures are device-wide."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
decodemon keys

  space   freeze the display (live) / pause (replay)
  ← →     seek 5 s back / forward (replay), whichever panel has focus
  [ ]     slower / faster (replay)
  + -     zoom the timeline in / out
  k       cycle the kernel sort (time, time × idle SMs, calls)
  tab     move focus between panels (the focused one has a double border)
  z       maximize the focused panel, named with its source (escape restores)
  s       export the screen as SVG, named after the sources shown
  d       write DIAGNOSIS-<source>.md for each source
  ?       this help
  q       quit

GPU busy, SM active and DRAM % come from PM counters, which cover the whole
GPU: when two engines share one GPU they are device-wide. Launches, kernel
times, grids and gaps come from traced windows and belong to one process.
"""


class HelpScreen(ModalScreen):
    """Keys and what the figures mean."""

    CSS_PATH = "help_screen.tcss"
    BINDINGS = [("escape,q,question_mark", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        """The help text in a box."""
        yield Static(HELP)
