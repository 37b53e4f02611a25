"""Help screen: the keys, and which figures are device-wide."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """\
decodemon keys

  space  freeze the display (live) / pause (replay)
  ← →    seek 5 s back / forward (replay), whichever panel has focus
  [ ]    slower / faster (replay)
  + -    zoom the timeline in / out
  k      cycle the kernel sort (time, time × idle SMs, calls)
  tab    move focus between panels (the focused one: a double border)
  z      maximize the focused panel, named with its source (escape:
         back)
  s      export the screen as SVG, named after the sources shown
  d      write DIAGNOSIS-<source>.md for each source
  v      how the verdict was reached: each candidate's threshold and
         inputs with their sources, whatever the width, for the side
         whose panel has focus (tab moves through each side's panels;
         escape: back)
  ?      this help (↑ ↓, PgUp PgDn, Home End scroll it; escape, q or ?
         close it)
  q      quit

hot kernels, column by column:
  kernel       its name (in full where the panel is wide enough)
  calls        launches of it per token
  µs           its mean duration in µs
  share        its part of the traced window's kernel time
  grid/SMs     thread blocks against the GPU's SMs (red: under a quarter
               of the SMs get a block, yellow: under all of them)
  occ          theoretical occupancy: the warps an SM can hold at its
               block size, registers and shared memory, as a share of
               the most warps an SM can hold

SM active and DRAM % come from PM counters, which cover the whole GPU:
when two engines share one GPU they are device-wide. GPU busy comes
from PM too where it samples, else from the traced kernels' time over
ms/token; the screen names its source beside it. Launches, kernel
times, grids and gaps come from traced windows and belong to one
process.
"""


class HelpScreen(ModalScreen):
    """Keys and what the figures mean."""

    CSS_PATH = "help_screen.tcss"
    BINDINGS = [("escape,q,question_mark", "app.pop_screen", "close")]

    def compose(self) -> ComposeResult:
        """The help text in a box that scrolls where the terminal is short (80×24)."""
        with VerticalScroll():
            yield Static(HELP)

    def on_mount(self) -> None:
        """Give the box focus, so the arrows, PgUp/PgDn and Home/End scroll it."""
        self.query_one(VerticalScroll).focus()
