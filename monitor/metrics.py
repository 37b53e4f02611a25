"""Per-window metrics, re-exported from `decodemon.monitor.analysis` (one module per question there)."""

from __future__ import annotations

from decodemon.monitor.analysis.busy import PmWindowCheck, busy_within, pm_window_check
from decodemon.monitor.analysis.gaps import SHORT_GAP_NS
from decodemon.monitor.analysis.kernels import SMALL_GRID_FRACTION, KernelRow, SmLimits, blocks_per_sm, sm_limits
from decodemon.monitor.analysis.names import demangle_head, short_kernel_name
from decodemon.monitor.analysis.timeline import Timeline
from decodemon.monitor.analysis.tokens import TokenStats, token_stats
from decodemon.monitor.analysis.window import WindowMetrics, window_metrics

__all__ = ["SHORT_GAP_NS", "SMALL_GRID_FRACTION", "KernelRow", "PmWindowCheck", "SmLimits", "Timeline", "TokenStats",
           "WindowMetrics", "blocks_per_sm", "busy_within", "demangle_head", "pm_window_check", "short_kernel_name",
           "sm_limits", "token_stats", "window_metrics"]
