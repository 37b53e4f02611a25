"""Plots where people would rather look than read: pure functions from data to SVG text, PNG bytes and lines of
text for the terminal.

    sweep      ms/token against context depth (log x), each point labelled with its ceiling, one line per command
    timeline   ms/token over time, a dashed line at each verdict change
    budget     the per-token time budget (kernels, collectives, launch gaps ...) as stacked bars, e.g. eager
               against graphed

`budget_of(summary)` and `timeline_of(session)` read those values out of a `summary_json` dict and a `Session`.
No imaging library: the PNG comes from `plots.png`'s own rasteriser of the same drawing.
"""

from __future__ import annotations

import numpy as np

from decodemon.monitor.plots.canvas import Canvas
from decodemon.monitor.plots.charts import budget_chart, sweep_chart, timeline_chart
from decodemon.monitor.plots.png import png_bytes
from decodemon.monitor.plots.terminal import budget_lines, sweep_lines, timeline_lines

__all__ = ["Canvas", "budget_chart", "budget_lines", "budget_of", "png_bytes", "sweep_chart",
           "sweep_lines", "timeline_chart", "timeline_lines", "timeline_of"]

GAP_PARTS = {"host_late": "host late (launch)", "short": "short gaps", "other": "other idle", "tracing": "tracing",
             "unsplit": "unsplit idle"}


def budget_of(summary: dict) -> tuple[dict, float | None]:
    """A summary_json's token as parts in ms (kernels, collectives, each class of idle gap), and its ms/token.

    The parts come from the traced window, whose tokens tracing stretches: they can sum to more than the
    untraced ms/token, which the chart marks beside them."""
    kernels = summary.get("kernel_sum_ms_per_token") or 0.0
    coll = summary.get("collectives") or {}
    calls, k_us = coll.get("calls_per_token") or 0.0, coll.get("kernel_us_per_call")
    coll_ms = calls * k_us / 1e3 if (calls and k_us) else 0.0  # NCCL kernels: taken out of the kernels' sum
    parts = {"kernels": max(kernels - coll_ms, 0.0), "collectives": coll_ms}
    for key, v in (summary.get("gap_ms_per_token") or {}).items():
        parts[GAP_PARTS.get(key, key)] = float(v)
    return parts, summary.get("ms_per_token")


def timeline_of(session, bin_s: float = 0.5) -> tuple[list[tuple[float, float]], list[tuple[float, str]]]:
    """A session's ms/token in `bin_s` bins of arrival time (seconds from its first mark), and each verdict change
    at the arrival of the window that made it."""
    v = session.feed.marks.view()
    if v.shape[1] < 2:
        return [], []
    t, rx = v[0], v[1]
    rx0 = int(rx[0])
    dt = np.diff(t) / 1e6
    at = (rx[1:] - rx0) / 1e9
    b = (at // bin_s).astype(np.int64)
    points = [(float(k * bin_s + bin_s / 2), float(np.median(dt[b == k]))) for k in np.unique(b)]
    names = [(rxw, getattr(session, "_at", lambda r: "")(rxw)) for rxw, _ in session.metrics]
    changes, start = [], 0
    for ch in session.rolling.history:
        i = next((j for j in range(start, len(names)) if names[j][1] == ch.at), None)
        if i is not None:
            words = ch.after.upper() if ch.before == "unknown" else f"{ch.before.upper()} → {ch.after.upper()}"
            changes.append(((names[i][0] - rx0) / 1e9, words))
            start = i + 1
    return points, changes
