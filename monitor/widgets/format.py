"""Small text helpers shared by the panels (no Textual imports)."""

from __future__ import annotations

import math

from decodemon.monitor.numbers import said

BLOCKS = " ▁▂▃▄▅▆▇█"


def num(x, spec: str = ".3g", none: str = "—") -> str:
    """Format a number, or a dash for None/NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, spec)


def value_words(value, unit: str) -> str:
    """A candidate's number with its unit, "?" where it has none: a % or × unit is written against its number, so a
    wrapped line never parts them, and a share past 100% (two counters sampled apart) reads as ≥100%."""
    if value is None:
        return "?"
    if unit.startswith("%") and round(value) > 100:
        return f"≥100{unit}"
    if unit.startswith(("%", "×")):
        return f"{said(value)}{unit}"
    return f"{said(value)} {unit}"


def spark(values, width: int, lo: float | None = None, hi: float | None = None) -> str:
    """A one-line sparkline of the last `width` values (NaN drawn as a space)."""
    vals = list(values)[-width:]
    real = [v for v in vals if v == v]
    if not real:
        return " " * len(vals)
    lo = min(real) if lo is None else lo
    hi = max(real) if hi is None else hi
    span = (hi - lo) or 1.0
    out = []
    for v in vals:
        if v != v:
            out.append(" ")
        else:
            out.append(BLOCKS[max(1, min(8, int(round((v - lo) / span * 8))))])
    return "".join(out)


def bar(fraction: float, width: int) -> str:
    """A horizontal bar of `width` cells filled to `fraction` (0..1)."""
    fraction = max(0.0, min(1.0, fraction))
    full = int(fraction * width)
    rest = fraction * width - full
    part = " ▏▎▍▌▋▊▉"[int(rest * 8)] if full < width else ""
    return ("█" * full + part).ljust(width)[:width]


class Redraw:
    """Mixin for Static panels: `put(text)` repaints only when the text changed; a resize redraws to scale."""

    _put_last = None
    _last = None

    def on_resize(self) -> None:
        """Redraw the last snapshot at the new width; its height is laid out again after this resize, which a
        layout asked for inside the resize does not do (the panel kept the height of its first, wider text)."""
        if self._last is not None:
            self.show(self._last)
            self.call_after_refresh(self._relayout)

    def _relayout(self) -> None:
        self.clear_cached_dimensions()
        self.refresh(layout=True)

    def put(self, text) -> None:
        """Update the panel if `text` differs from what it shows."""
        if text != self._put_last:
            self._put_last = text
            self.update(text)
