"""The analysis: a traced window's records in, frozen figures out, one module per question.

    records      which records a window analyses (its whole tokens, the guard and stragglers left out)
    launches     kernels, graph launches and launch calls per token
    gaps         where the GPU sat idle, and why (host late, short, tracing, other, unsplit)
    kernels      the kernel table: time, grid coverage against the SMs, occupancy
    collectives  collective calls, their own latency, the idle they add
    busy         GPU busy from the kernels' union, and against PM's counter
    timeline     one token's launch calls over its kernels
    tokens       the token clock: ms/token and tokens/s
    depth        the figures and the verdict per context-depth band
    window       window_metrics: the composition of the above

Pure: no clock, no socket, no terminal. It runs in the monitor's process, never in the decode process.
"""

from __future__ import annotations

from decodemon.monitor.analysis.busy import PmWindowCheck, busy_within, pm_window_check
from decodemon.monitor.analysis.kernels import KernelRow, SmLimits, blocks_per_sm, sm_limits
from decodemon.monitor.analysis.names import demangle_head, short_kernel_name
from decodemon.monitor.analysis.timeline import Timeline
from decodemon.monitor.analysis.tokens import TokenStats, token_stats
from decodemon.monitor.analysis.window import WindowMetrics, window_metrics

__all__ = ["KernelRow", "PmWindowCheck", "SmLimits", "Timeline", "TokenStats", "WindowMetrics", "blocks_per_sm",
           "busy_within", "demangle_head", "pm_window_check", "short_kernel_name", "sm_limits", "token_stats",
           "window_metrics"]
