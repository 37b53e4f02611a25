"""Timeline panel: one token to scale, CPU launch calls over GPU kernels, so the idle between kernels shows."""

from __future__ import annotations

import numpy as np
from rich.text import Text
from textual.reactive import reactive

from decodemon.monitor.analysis.agreement import busy_disagreement, kernels_past_step
from decodemon.monitor.ceilings import peer_wait_named
from decodemon.monitor.render.text import observer_parts
from decodemon.monitor.token_clock import clock_kind
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import num
from decodemon.monitor.widgets.panel import Panel
from decodemon.monitor.widgets.probe_words import probe_field, tracing_unavailable
from decodemon.monitor.widgets.reasons import in_marks

SHADES = " ░▒▓█"


def coverage(intervals, span_ns: int, cells: int) -> np.ndarray:
    """Fraction of each of `cells` equal slices of [0, span_ns) covered by the intervals."""
    cov = np.zeros(cells)
    if span_ns <= 0 or cells <= 0:
        return cov
    w = span_ns / cells
    for a, b in np.asarray(intervals).reshape(-1, 2).tolist():
        a, b = max(a, 0), min(b, span_ns)
        if b <= a:
            continue
        i0, i1 = int(a // w), min(int((b - 1) // w), cells - 1)
        for i in range(i0, i1 + 1):
            lo, hi = i * w, (i + 1) * w
            cov[i] += (min(b, hi) - max(a, lo)) / w
    return np.clip(cov, 0, 1)


def render_rows(timeline, cells: int, zoom: int = 1) -> tuple[str, str, float]:
    """(cpu row, gpu row, span in ms) drawn with shades: blank is whitespace the GPU spent idle."""
    span = max(1, timeline.token_ns // max(1, zoom))

    def row(iv):
        cov = coverage(iv, span, cells)
        return "".join(SHADES[0 if c <= 0 else min(4, 1 + int(c * 3.999))] for c in cov)

    return row(timeline.cpu), row(timeline.gpu), span / 1e6


def nvtx_row(timeline, cells: int, zoom: int = 1) -> str:
    """The token's NVTX ranges as labelled bars, `[name====]`, to the same scale as the rows: outermost first, an
    inner range only where nothing is drawn yet."""
    span = max(1, timeline.token_ns // max(1, zoom))
    row = [" "] * cells
    for name, a, b in timeline.nvtx:
        i0, i1 = int(a / span * cells), min(cells, max(int(a / span * cells) + 1, int(b / span * cells)))
        if i0 >= cells or any(c != " " for c in row[i0:i1]):
            continue  # an inner range under one already drawn, or past the zoomed span
        bar = list(("[" + name)[: i1 - i0].ljust(i1 - i0, "="))
        if i1 - i0 > 1:
            bar[-1] = "]"
        row[i0:i1] = bar
    return "".join(row)


STRETCHED = 1.3  # a traced token this many times the median step is said to be stretched


class TimelinePanel(Panel):
    """CPU row over GPU row for the latest traced token, to scale; `+`/`-` zoom into its start."""

    DEFAULT_CSS = tcss(__file__)
    zoom: reactive[int] = reactive(1)  # ×N: the first 1/N of the token across the panel

    def validate_zoom(self, zoom: int) -> int:
        """Keep the zoom between ×1 and ×64."""
        return int(max(1, min(64, zoom)))

    def watch_zoom(self) -> None:
        """Redraw the last snapshot at the new zoom."""
        if self._last is not None:
            self.show(self._last)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s
        self.border_title = in_marks(s, "timeline · latest traced token")
        w = s.window
        if w is not None and not w.apis_traced and s.api_window is not None:
            # the latest window traced kernels only (Attach.api_every): draw the latest one with its launch calls
            w = s.api_window
            self.border_title = in_marks(s, f"timeline · latest token with its launch calls traced, "
                                               f"{s.api_window_age_s:.0f} s ago")
        t = Text()
        for key, words in (("trace_paused", "windows paused"), ("window_budget", "window budget")):
            if probe_field(s, key):
                t.append(f"{words}: {probe_field(s, key)}\n", style="yellow")
        if w is None or w.timeline is None:
            t.append(tracing_unavailable(s) or "no traced window yet", style="dim")
            self.put(t)
            return
        cells = max(20, (self.content_size.width or 72) - 5)
        key = (id(w), cells, self.zoom)
        if key != getattr(self, "_rows_key", None):  # rows are redrawn only for a new window, width or zoom
            self._rows_key, self._rows = key, render_rows(w.timeline, cells, self.zoom)
        cpu, gpu, span_ms = self._rows
        t.append("CPU ", style="bold blue")
        # the calls' times are what is missing; their count comes from the kernels' correlation ids
        untraced = ("launch calls' times not traced in this recording (counted from the kernels)"
                    if s.api_window is None and s.ended else
                    "launch calls' times not traced in this window (one window of every few traces them: they cost "
                    "the loop more; counted from the kernels)")
        t.append((cpu if w.apis_traced else untraced) + "\n",
                 style="blue" if w.apis_traced else "dim")
        t.append("GPU ", style="bold green")
        t.append(gpu + "\n", style="green")
        if w.timeline.nvtx:  # NVTX ranges pushed from Python: the outermost level, named
            t.append("NVTX", style="bold magenta")
            t.append(nvtx_row(w.timeline, cells, self.zoom) + "\n", style="magenta")
        right = f"{span_ms:.2f} ms"
        t.append("    0 ms" + " " * max(1, cells - 4 - len(right)) + right, style="dim")
        if self.zoom > 1:
            t.append(f"  (zoom ×{self.zoom})", style="dim")
        if w.tracing_head_ms:
            t.append(f"\ndrawn from the first kernel: the traced cudaGraphLaunch took {w.tracing_head_ms:.2f} ms "
                     "(CUPTI instrumenting the graph; µs untraced)", style="dim")
        drawn_ms, median = w.timeline.token_ns / 1e6, (s.tokens.ms_per_token if s.tokens else None)
        if median and drawn_ms > STRETCHED * median:  # the figures above it are the untraced loop's, this is not
            t.append(in_marks(s, f"\nthe traced token took {drawn_ms:.3g} ms against the {median:.3g} ms "
                                 f"{clock_kind(s.token_clock)} "
                                 "step: tracing stretched it, so its gaps are wider than untraced ones"), style="dim")
        g = w.gap_ms_per_token
        total = sum(g.values()) or 1e-9
        t.append(in_marks(s, f"\nGPU busy {num(s.gpu_busy_pct, '.0f')}% from {s.busy_source}"))
        past = kernels_past_step(s)
        if past:
            t.append(f"\n⚠ {past}", style="yellow")
        elif s.kernel_share_pct is not None and s.pm:
            i = s.inputs
            waited = bool(i) and peer_wait_named(i.collective_wait_ms_per_token, i.ms_per_token)
            t.append(f" · kernel share {s.kernel_share_pct:.0f}% of the step (traced"
                     + ("; NCCL waiting for a peer counted as idle)" if waited else ")"), style="dim")
            apart = busy_disagreement(s.pm.get("gpu_busy_pct"), s.kernel_share_pct, s.pm_check)
            if apart:
                t.append(f"\n⚠ {apart}", style="yellow")
        t.append("\nidle gaps: ")
        # each share kept with its words (a no-break space): a wrapped line never starts with a bare "0%"
        # a window that traced no launch calls' times does not measure the host's lateness (--json's null)
        parts = [] if "unsplit" in g else [("host launched late", "host_late", "bold red")]
        parts += [("short", "short", ""), ("other", "other", "")]
        if "unsplit" in g:  # no launch calls traced: the host's lateness is not measured, not 0%
            parts.append(("not split (no launch calls' times traced)", "unsplit", "dim"))
        if g.get("tracing"):
            parts.append(("tracing", "tracing", "dim"))
        for n, (words, key, style) in enumerate(parts):
            t.append((" · " if n else "") + f"{words}\u00a0{100 * g[key] / total:.0f}%", style=style)
        for i, part in enumerate(observer_parts(s.observer)):
            t.append(("\n" if i == 0 else "") + part, style="dim")
        self.put(t)
