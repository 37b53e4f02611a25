"""The same charts as lines of text for a terminal: the sweep (median ms/token per depth), ms/token over time, the
time budget."""

from __future__ import annotations

import math

BLOCKS = "▁▂▃▄▅▆▇█"
MARKERS = "*o+x"
BUDGET_CHARS = {"kernels": "K", "collectives": "C", "host late (launch)": "H", "short gaps": "s",
                "other idle": ".", "tracing": "t", "unsplit idle": "u"}


def sweep_lines(series: list[tuple[str, list[tuple[int, float, str]]]], rows: int = 10) -> list[str]:
    """Each depth's median ms/token (rows, the axis named above them) against the swept depths (columns, evenly
    spaced as on a log axis); each point drawn on the row whose label (the middle of the span it covers) is nearest
    its value, with the value written beside it; under each column the depth and each command's ceiling."""
    depths = sorted({d for _, ps in series for d, v, _ in ps if v is not None})
    vals = [v for _, ps in series for _, v, _ in ps if v is not None]
    if not depths:
        return ["(no depth measured)"]
    top = max(vals) * 1.05 or 1.0
    col = 12
    grid = [[" "] * (col * len(depths)) for _ in range(rows)]
    for k, (_, ps) in enumerate(series):
        for d, v, _ in ps:
            if v is None:
                continue
            r = rows - 1 - min(rows - 1, int(v / top * rows))
            c = depths.index(d) * col + col // 2
            grid[r][c] = MARKERS[k % len(MARKERS)] if grid[r][c] == " " else "#"
            value = f"{v:.4g}"
            if all(ch == " " for ch in grid[r][c + 1:c + 2 + len(value)]):  # beside it, where nothing is drawn
                grid[r][c + 2:c + 2 + len(value)] = value
    out = [f"{'median':>8}", f"{'ms/token':>8} ┬"]
    for i, row in enumerate(grid):
        y = top * (rows - 1 - i + 0.5) / rows
        out.append(f"{y:>8.3g} │" + "".join(row).rstrip())
    out.append(" " * 9 + "└" + "─" * (col * len(depths)))
    out.append(" " * 10 + "".join(f"{d:^{col}}" for d in depths) + "  depth")
    for k, (name, ps) in enumerate(series):
        by = {d: ceil for d, v, ceil in ps if v is not None}
        out.append(f"{MARKERS[k % len(MARKERS)]}{name[:9]:<9}" +
                   "".join(f"{by.get(d, '-').upper():^{col}}" for d in depths))
    return out


def timeline_lines(points: list[tuple[float, float]], changes: list[tuple[float, str]], width: int = 60) -> list[str]:
    """A sparkline of ms/token over time, a row of │ where the verdict changed, and the changes in words."""
    if not points:
        return ["(no tokens)"]
    t1 = max(max(t for t, _ in points), max((t for t, _ in changes), default=0.0)) or 1.0
    width = max(1, min(width, len(points)))
    bins: list[list[float]] = [[] for _ in range(width)]
    for t, v in points:
        if v == v:
            bins[min(width - 1, int(t / t1 * width))].append(v)
    means = [sum(b) / len(b) if b else None for b in bins]
    top = max([m for m in means if m is not None] + [1e-9])
    spark = "".join(BLOCKS[min(7, int(m / top * 7.999))] if m is not None else " " for m in means)
    marks = [" "] * width
    for t, _ in changes:
        marks[min(width - 1, int(t / t1 * width))] = "│"
    out = [f"ms/token  0 … {top:.3g}", spark, "".join(marks), f"0 s{' ' * (width - 8)}{t1:>5.0f} s"]
    out += [f"  at {t:.1f} s: {words}" for t, words in changes]
    return out


def budget_lines(bars: list[tuple[str, dict, float | None]], width: int = 60) -> list[str]:
    """Each loop's token as a bar of letters, one per part (K kernels, H host late ...), to a common scale."""
    total = max([sum(v for v in parts.values() if v > 0) for _, parts, _ in bars] + [m or 0 for *_, m in bars] + [1e-9])
    out, used = [], []
    for name, parts, ms in bars:
        s = ""
        for part, v in parts.items():
            n = int(round(v / total * width)) if v > 0 else 0
            s += BUDGET_CHARS.get(part, "?") * n
            if n and part not in used:
                used.append(part)
        tail = f"  {ms:.3g} ms/token" if ms else ""
        out.append(f"{name[:10]:<10} │{s:<{width}}│{tail}")
    out.append(" " * 11 + f"0{' ' * (width - 1)}{total:.3g} ms")
    out.append("  ".join(f"{BUDGET_CHARS.get(p, '?')} {p}" for p in used))
    return out
