"""The charts as Canvas drawings: the depth sweep, ms/token over time, the per-token time budget.

Each takes plain values (no Session, no Snapshot) so a test can pin its picture; `decodemon.monitor.plots`
turns `summary_json` dicts and `Session` objects into those values.
"""

from __future__ import annotations

import math

from decodemon.monitor.plots.canvas import Canvas

CEILING_COLORS = {"bandwidth": "#1f77b4", "occupancy": "#9467bd", "launch": "#d62728", "comm": "#2ca02c",
                  "kernels": "#8c564b", "unknown": "#7f7f7f"}
SERIES_COLORS = ("#222222", "#ff7f0e", "#17becf", "#bcbd22")
BUDGET_COLORS = {"kernels": "#1f77b4", "collectives": "#2ca02c", "host late (launch)": "#d62728",
                 "short gaps": "#ff9896", "other idle": "#c7c7c7", "tracing": "#ffbb78", "unsplit idle": "#e7e7e7"}
W, H = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 50, 60


def nice_max(v: float) -> float:
    """The round number (1, 1.5, 2, 2.5, 3, 4, 5, 6 or 8 × 10^k) at or above `v`."""
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    return next(m * e for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * e >= v * (1 - 1e-9))


def _y_axis(c: Canvas, ymax: float, label: str) -> None:
    x0, y0, y1 = LEFT, H - BOTTOM, TOP
    c.line(x0, y0, x0, y1, "#444444")
    for k in range(6):
        v = ymax * k / 5
        y = y0 - (y0 - y1) * k / 5
        c.line(x0 - 4, y, W - RIGHT, y, "#e5e5e5" if k else "#444444")
        c.text(x0 - 8, y + 4, f"{v:.3g}", "#444444", 10, "end")
    c.text(14, TOP - 14, label, "#222222", 11)


def _ceiling_legend(c: Canvas, names) -> None:
    x = LEFT
    for name in names:
        c.circle(x + 4, H - 16, 4, CEILING_COLORS.get(name, "#7f7f7f"))
        c.text(x + 12, H - 12, name.upper(), "#222222", 10)
        x += 24 + 7 * len(name)


def sweep_chart(series: list[tuple[str, list[tuple[int, float, str]]]],
                title: str = "median ms/token against depth") -> Canvas:
    """Each depth's median ms/token against context depth (log x), one line per command, each point coloured and
    labelled by its ceiling. `series`: [(name, [(depth, median ms_per_token, ceiling), ...]), ...]."""
    c = Canvas(W, H)
    c.text(LEFT, 22, title, "#111111", 13)
    pts = [p for _, ps in series for p in ps if p[1] is not None]
    depths = sorted({max(int(p[0]), 1) for p in pts}) or [1]
    lo, hi = math.log2(depths[0]), math.log2(depths[-1])
    if hi - lo < 1:
        lo, hi = lo - 0.5, hi + 0.5
    ymax = nice_max(max((p[1] for p in pts), default=1.0) * 1.15)
    x_of = (lambda d: LEFT + 20 + (W - RIGHT - LEFT - 40) * (math.log2(max(d, 1)) - lo) / (hi - lo))
    y_of = (lambda v: (H - BOTTOM) - (H - BOTTOM - TOP) * v / ymax)
    _y_axis(c, ymax, "median ms/token")
    for d in depths:
        c.line(x_of(d), H - BOTTOM, x_of(d), H - BOTTOM + 4, "#444444")
        c.text(x_of(d), H - BOTTOM + 16, f"{d:,}", "#444444", 10, "middle")
    c.text(W - RIGHT, H - BOTTOM + 32, "context depth (log scale)", "#222222", 11, "end")
    for k, (name, ps) in enumerate(series):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        xy = [(x_of(d), y_of(v), ceil) for d, v, ceil in ps if v is not None]
        c.polyline([(x, y) for x, y, _ in xy], color, 2.0)
        for x, y, ceil in xy:
            c.circle(x, y, 5, CEILING_COLORS.get(ceil, "#7f7f7f"))
            c.text(x, y - 10, ceil.upper(), CEILING_COLORS.get(ceil, "#7f7f7f"), 10, "middle")
        c.line(W - RIGHT - 170, TOP + 14 + 16 * k, W - RIGHT - 150, TOP + 14 + 16 * k, color, 2.0)
        c.text(W - RIGHT - 144, TOP + 18 + 16 * k, name, "#222222", 10)
    _ceiling_legend(c, sorted({p[2] for p in pts}))
    return c


def timeline_chart(points: list[tuple[float, float]], changes: list[tuple[float, str]],
                   title: str = "ms/token over time") -> Canvas:
    """ms/token against seconds, with a dashed line and its words at each verdict change.
    `points`: [(t_s, ms_per_token)]; `changes`: [(t_s, 'LAUNCH → OCCUPANCY')]."""
    c = Canvas(W, H)
    c.text(LEFT, 22, title, "#111111", 13)
    t1 = max([p[0] for p in points] + [t for t, _ in changes] + [1.0])
    ymax = nice_max(max((p[1] for p in points), default=1.0) * 1.15)
    x_of = (lambda t: LEFT + (W - RIGHT - LEFT) * t / t1)
    y_of = (lambda v: (H - BOTTOM) - (H - BOTTOM - TOP) * v / ymax)
    _y_axis(c, ymax, "ms/token")
    xmax = nice_max(t1)
    step = xmax / 5
    k = 0
    while k * step <= t1 + 1e-9:
        x = x_of(k * step)
        c.line(x, H - BOTTOM, x, H - BOTTOM + 4, "#444444")
        c.text(x, H - BOTTOM + 16, f"{k * step:g}", "#444444", 10, "middle")
        k += 1
    c.text(W - RIGHT, H - BOTTOM + 32, "seconds", "#222222", 11, "end")
    c.polyline([(x_of(t), y_of(v)) for t, v in points], "#222222", 1.5)
    for i, (t, words) in enumerate(changes):
        x = x_of(t)
        after = words.split("→")[-1].strip().lower()
        color = CEILING_COLORS.get(after, "#7f7f7f")
        c.line(x, H - BOTTOM, x, TOP, color, 1.5, dash=True)
        c.text(x + 4, TOP + 12 + 14 * (i % 3), words, color, 10)
    return c


def budget_chart(bars: list[tuple[str, dict, float | None]], title: str = "where a token's time goes") -> Canvas:
    """One horizontal stacked bar per loop (kernels, collectives, launch gaps ...; ms per token), with a tick at
    its measured ms/token. `bars`: [(name, {part: ms}, ms_per_token), ...]."""
    h = TOP + 60 * len(bars) + 90
    c = Canvas(W, h)
    c.text(LEFT, 22, title, "#111111", 13)
    total = max([sum(v for v in parts.values() if v > 0) for _, parts, _ in bars] +
                [m or 0.0 for _, _, m in bars] + [1e-9])
    xmax = nice_max(total * 1.05)
    left, right = 110, W - RIGHT
    x_of = (lambda v: left + (right - left) * v / xmax)
    for k in range(6):
        v = xmax * k / 5
        c.line(x_of(v), TOP, x_of(v), TOP + 60 * len(bars), "#e5e5e5")
        c.text(x_of(v), TOP + 60 * len(bars) + 14, f"{v:.3g}", "#444444", 10, "middle")
    c.text(right, TOP + 60 * len(bars) + 30, "ms per token", "#222222", 11, "end")
    used = []
    for i, (name, parts, ms) in enumerate(bars):
        y = TOP + 60 * i + 14
        c.text(left - 8, y + 20, name, "#222222", 11, "end")
        x = 0.0
        for part, v in parts.items():
            if v <= 0:
                continue
            c.rect(x_of(x), y, x_of(x + v) - x_of(x), 30, BUDGET_COLORS.get(part, "#aaaaaa"))
            x += v
            used.append(part) if part not in used else None
        if ms:
            c.line(x_of(ms), y - 6, x_of(ms), y + 36, "#000000", 2.0)
            c.text(x_of(ms) + 4, y - 2, f"{ms:.3g} ms/token", "#000000", 10)
    lx, ly = LEFT, h - 24
    for part in used:
        c.rect(lx, ly - 9, 10, 10, BUDGET_COLORS.get(part, "#aaaaaa"))
        c.text(lx + 14, ly, part, "#222222", 10)
        lx += 30 + 7 * len(part)
    return c
