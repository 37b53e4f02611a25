"""Serving panel, for a batched engine only: the step as the unit. A step makes one token of every request in it, so
each request's inter-token latency is the step, and the engine's total rate is the batch over the step."""

from __future__ import annotations

from rich.text import Text

from decodemon.monitor.rolling import headline
from decodemon.monitor.token_clock import clock_kind
from decodemon.monitor.widgets.reasons import span_words
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.panel import Panel


def serving_lines(s) -> Text:
    """The serving view of one snapshot (a batched engine's: `tokens_per_step` set)."""
    t = Text()
    tk = s.tokens
    if tk is None:
        t.append("waiting for the engine's steps", style="dim")
        return t
    t.append(f"step {tk.ms_per_token:.2f} ms", style="bold")
    t.append(f" ({clock_kind(s.token_clock)} of {tk.tokens} steps; p90 {tk.ms_per_token_p90:.2f}, "
             f"p99 {tk.ms_per_token_p99:.2f})\n", style="dim")
    t.append(f"batch {s.tokens_per_step:g} tokens/step", style="bold")
    t.append(" (the requests each step ran)  ", style="dim")
    total = s.throughput_tokens_per_s
    t.append(f"{total:.1f} tok/s in all" if total is not None else "tok/s in all: -", style="bold")
    # the rate is over the seconds the span's steps cover, as the header names them; the count is every token
    # since the source began
    over = f"over {tk.span_s:.1f} s of steps; " if tk.span_s else f"over the last {span_words(s)}; " if span_words(s) \
        else ""
    t.append(f" ({over}{s.tokens_total} tokens since the start)\n", style="dim")
    t.append(f"per request: a token every {tk.ms_per_token:.2f} ms (the step), {tk.ms_per_token_p99:.2f} at p99; ")
    ft = getattr(s, "first_token", None)
    if ft and ft["requests"]:
        t.append(f"first token after {ft['median_ms']:.1f} ms", style="bold")
        t.append(f" (median of {ft['requests']} requests, p90 {ft['p90_ms']:.1f})\n", style="dim")
    elif ft:
        t.append("no request began in the last 5 s (time to first token: -)\n")
    else:
        t.append("time to first token not seen (the engine is watched by its steps, not its requests)\n")
    ceiling, pending = headline(s.diagnosis, s.rolling)
    t.append("verdict on the step: ")
    t.append(ceiling.upper(), style="bold")
    if pending:
        t.append(f" ({pending})", style="yellow")
    return t


class ServingPanel(Panel):
    """Step, batch, total tokens/s, each request's latency and the verdict; hidden for a batch-1 loop."""

    DEFAULT_CSS = tcss(__file__)

    def show(self, s) -> None:
        """Draw one snapshot."""
        batched = getattr(s, "tokens_per_step", None) is not None
        self.display = batched
        if not batched:
            return
        self.border_title = "serving"
        self.put(serving_lines(s))
