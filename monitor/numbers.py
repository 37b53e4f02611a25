"""A figure as the screen, `--json`'s words and the report say it: to 3 significant digits (4 where asked), and
never rounded onto a threshold it is not at. 1.9996× the floor is "1.9996×", not "2×": at 2× BANDWIDTH binds, and
a figure a hair past a rule must not read as the rule itself. A bandwidth says its source the one way everywhere
(`bandwidth_short`)."""

from __future__ import annotations

# the thresholds the candidates are held to (ceilings.py: BANDWIDTH 2× and 10×, COMM 10%, LAUNCH 20% and 50%,
# OCCUPANCY 25% and 50%, the counters' 3× near the floor)
EDGES = (2.0, 3.0, 10.0, 20.0, 25.0, 50.0)


def _off_edges(x: float, kind: str, n: int, most: int, edges: tuple[float, ...]) -> str:
    """`x` formatted `{n}{kind}`, with `n` raised (to `most`) while the text reads as an edge `x` is not."""
    s = f"{x:.{n}{kind}}"
    while n < most and float(s) in edges and float(s) != x:
        n += 1
        s = f"{x:.{n}{kind}}"
    return s


def said(x: float, digits: int = 3, edges: tuple[float, ...] = EDGES) -> str:
    """`x` to `digits` significant digits, with more (up to 7) where fewer would round it onto an edge it is not."""
    return _off_edges(x, "g", digits, 7, edges)


def said_pct(x: float) -> str:
    """A percentage to whole points, with decimals (up to 4) where whole points would round it onto an edge."""
    return _off_edges(x, "f", 0, 4, EDGES)


def bandwidth_short(source: str) -> str:
    """The bandwidth's source in a few words: measured copy (by whom) or spec figure."""
    if source.startswith("measured copy (decodemon"):
        return "decodemon's measured copy"
    if source.startswith("measured copy (the engine adapter") or source.startswith("measured copy (engine"):
        return "engine adapter's measured copy"
    if source.startswith("NVML peak") and "the copy measured" in source:  # a copy beside a busy loop, set aside
        return "spec: NVML peak, the measured copy set aside as low"
    if source.startswith("NVML peak"):
        return "spec: NVML peak, not measured"
    return source or "?"
