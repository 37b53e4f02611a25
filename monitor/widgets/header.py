"""Header panel: who is watched, on what, how fast, and how far above the bandwidth floor."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from decodemon.monitor.render.text import left_out, rejected_text, token_bytes
from decodemon.monitor.token_clock import PROVISIONAL_STEPS, clock_kind
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import Redraw, num
from decodemon.monitor.widgets.probe_words import device_line
from decodemon.monitor.numbers import bandwidth_short
from decodemon.monitor.widgets.reasons import bytes_short, clock_span_words
from decodemon.monitor.widgets.status_bar import short_label


class HeaderPanel(Redraw, Static):
    """Process, device, tokens/s, ms/token, bandwidth floor and the ratio to it."""

    DEFAULT_CSS = tcss(__file__)

    def _append_whole(self, t: Text, sep: str, phrase: str, width: int, style: str = "") -> None:
        """Append `phrase` after `sep` where it fits on the line `t` has reached, else on the next line: a number
        is never wrapped away from the words that say what it is ("floor" | "0.294 ms")."""
        last = t.wrap(self.app.console, width)[-1].cell_len if t.plain else 0
        t.append(sep if last + len(sep) + len(phrase) <= width else "\n")
        t.append(phrase, style=style)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s  # redrawn at the new width on a resize
        t = Text()
        model = s.model.name if s.model else "model not reported"
        pid = "" if not s.pid or f"pid {s.pid}" in s.label else f"  pid {s.pid}"
        width = self.content_size.width or 200
        label = s.label if len(s.label) + len(pid) + len(model) + 2 <= width else short_label(s.label)
        t.append(label, style="bold")
        t.append(f"{pid}  {model}\n")
        t.append(device_line(s) + "\n", style="dim")
        tk = s.tokens
        batched = s.tokens_per_step is not None  # a step is the unit: its rate is steps/s, tokens/s is the total's
        unit = "step" if batched else "token"
        t.append(f"{num(tk.ms_per_token if tk else None, '.3f')} ms/{unit}", style="bold cyan")
        # the clock's own seconds where they are not the span's: the median and the mean are over those (the
        # candidates' inputs name the same seconds)
        span = clock_span_words(s)
        # a counted clock's ms/token is its seconds over its steps, a mean: said so (token_clock.MEAN_CLOCKS)
        kind = clock_kind(s.token_clock)
        t.append(f" {kind}  {num(tk.tokens_per_s if tk else None, '.1f')} {'steps' if batched else 'tok'}/s mean{span}")
        if tk:  # both from one clock, named, with the count behind them (the count every panel gives)
            t.append(f" ({tk.tokens} {'steps' if batched else 'tokens'} timed{left_out(s, short=True)}, "
                     f"{s.token_clock or 'no clock'})",
                     style="dim")
            if tk.tokens < PROVISIONAL_STEPS:  # kept whole: its number stays with its words
                self._append_whole(t, " ", f"provisional (<{PROVISIONAL_STEPS})",
                                   self.content_size.width or 200, style="yellow")
        width = self.content_size.width or 200
        if s.tokens_per_step is not None:  # a batched engine: a step makes a token per sequence in it
            self._append_whole(t, "  ", f"{s.tokens_per_step:g} tokens/step", width)
            self._append_whole(t, "  ", f"{num(s.throughput_tokens_per_s, '.1f')} tok/s in all", width)
        floor = s.diagnosis.bandwidth_floor_ms
        if floor and tk:
            i = s.inputs
            self._append_whole(t, "  ", f"floor {floor:.3f} ms", width)
            if i is not None and i.bytes_per_token and i.bandwidth_gbs and width >= 110:
                # narrower, the floor's parts are one key away (`v`), with every other candidate's
                t.append(f" = {i.bytes_per_token / 1e9:.3g} GB ({bytes_short(s)}) ÷ {i.bandwidth_gbs:.4g} GB/s "
                         f"({bandwidth_short(s.bandwidth_source)})", style="dim")
            self._append_whole(t, "  ", f"{tk.ms_per_token / floor:.1f}× floor", width, style="bold yellow")
        measured, model_b = token_bytes(s)  # a token's, a batched engine's step's ÷ its tokens
        if measured and model_b:  # the DRAM counters' bytes a token beside the model's own (both a token's)
            self._append_whole(t, "  ", f"{measured / 1e9:.3g} GB/token measured (PM DRAM), the model's "
                               f"{model_b / 1e9:.3g}" + (f" at depth {s.depth}, the latest" if s.depth else ""),
                               width, style="dim")
        if s.ended:
            t.append(f"\n■ {s.ended} (last data kept)", style="bold red")
        if s.rejected_frames:
            t.append(f"\n■ {rejected_text(s)}", style="bold red")
        elif s.other_pids:
            t.append(f"\nGPU shared with pid {', '.join(map(str, s.other_pids))}: PM figures are device-wide",
                     style="yellow")
        self.put(t)
