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
  kernel       its name (in full where the panel is wide enough);
               two that share a name carry a tag, <template
               arguments>, else <grid N>, else <#N>, as in --json's
               `label` and DIAGNOSIS
  calls        calls of it per token
  µs/call      its mean duration in µs, a call
  share        its part of the traced window's kernel time (not of
               the step); "time" sorts by it
  grid/SMs     thread blocks against the GPU's SMs (red: under a quarter
               of the SMs get a block, yellow: under all of them)
  warps        warp occupancy limit: the warps an SM can hold at its
               block size, registers and shared memory, as a share of
               the most warps an SM can hold, with blocks enough to
               fill it (a grid of fewer blocks than SMs keeps fewer;
               not the OCCUPANCY ceiling, the grid against the SMs)

words, each with one meaning:
  traced       read from a traced window: CUPTI's records of one
               process's kernels and launch calls over a few tokens,
               which tracing stretches
  kernel       one piece of GPU work; kernels/token counts them,
               however they were launched
  launch       a host call that starts GPU work: a kernel launch call
               starts one kernel, a graph launch replays a whole
               CUDA graph (a graphed step: 1 launch, ~1,800 kernels);
               the runtime's and the driver's calls alike (libraries
               such as cuBLAS launch through the driver)
  GPU busy     the share of the step the GPU runs a kernel: PM's
               counter where PM samples (device-wide), else the
               kernel share stands in; its source is named beside it
  kernel share  the traced kernels' time (their union: kernels that
               run at once count once) ÷ the loop's ms/token (its
               median, or a counted clock's mean; --json
               kernel_share_of_step_pct): the busy
               LAUNCH's idle and OCCUPANCY's 50% rule read where a
               window is traced, PM's GPU busy where none is
  traced-token busy  the traced kernels' union over the traced tokens'
               own time from their first kernel (a traced graph
               launch's instrumenting before it left out), which
               tracing stretches, so it reads lower (--json
               traced_token_busy_pct; traced_gpu_busy_pct is its
               older name); over only the PM samples inside the
               traced tokens, beside PM's: pm_vs_window's
               window_gpu_busy_pct
  engine       the program being watched (its decode loop); the
               engine adapter is decodemon's code inside it. The
               floor's bandwidth is decodemon's measured copy (a
               device copy decodemon timed on this GPU and driver),
               else the engine adapter's measured copy (one the
               engine timed itself, per engine: two on one GPU can
               read a few % apart), else NVML's peak (a spec figure)

SM active and DRAM % come from PM counters, which cover the whole GPU:
when two engines share one GPU they are device-wide. Launches, kernel
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
