"""Launches per token: how many kernels ran, and how many host calls queued them.

A kernel record carries the correlation id of the API call that launched it; every kernel of one
cudaGraphLaunch carries that launch's id:

    host   cudaLaunchKernel#7  cudaLaunchKernel#8   cudaGraphLaunch#9
    GPU          [k corr=7]         [k corr=8]        [k 9][k 9][k 9][k 9]
                 graph_id=0         graph_id=0        graph_id!=0

With the launch calls traced they are counted from the API records. The runtime's calls are also seen as driver
calls underneath, so launches are counted in one layer: the runtime's when it launched anything, else the
driver's. A window that traced kernels only counts the distinct correlation ids instead: one per graph launch
among graph kernels, one per launch call among the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.monitor.analysis.records import TracedRecords


@dataclass(frozen=True)
class LaunchCalls:
    """Which of the window's API calls launched work: one bool per row of `TracedRecords.apis`."""

    kernel: np.ndarray  # cudaLaunchKernel*, cudaLaunch_*, cuLaunchKernel*, cuLaunch
    graph: np.ndarray  # cudaGraphLaunch, cuGraphLaunch
    layer: np.ndarray  # the layer the launches are counted in (runtime when it launched anything, else driver)

    @property
    def counted(self) -> np.ndarray:
        """The launch calls of the counted layer, kernel or graph."""
        return (self.kernel | self.graph) & self.layer


@dataclass(frozen=True)
class Launches:
    """What the analysed tokens launched, in all (divide by the tokens for per-token figures)."""

    kernels: int
    graph_launches: int
    kernel_launch_calls: int
    memcpys: int


def launch_calls(rec: TracedRecords) -> LaunchCalls:
    """Mark the window's kernel and graph launch calls, and the layer (runtime or driver) they are counted in."""
    names = rec.api_names
    graph = np.array(["GraphLaunch" in s for s in names], dtype=bool)
    kernel = np.array([("LaunchKernel" in s) or s.startswith("cudaLaunch_") or s == "cuLaunch" for s in names],
                      dtype=bool)
    dom = rec.apis.get("domain", np.zeros(0, np.int64))
    rt = dom == 0
    has_rt = bool((kernel & rt).any() or (graph & rt).any())
    return LaunchCalls(kernel=kernel, graph=graph, layer=rt if has_rt else (dom == 1))


def count_launches(rec: TracedRecords, calls: LaunchCalls) -> Launches:
    """Kernels, graph launches, kernel launch calls and copies over the analysed tokens."""
    n = len(rec.start_ns)
    graph_launches = int((calls.graph & calls.layer).sum())
    kernel_launch_calls = int((calls.kernel & calls.layer).sum())
    if not rec.apis_traced and n:
        # no launch calls traced in this window: a kernel's correlation id is its launch call's, and every kernel
        # of one cudaGraphLaunch carries that launch's id (checked on the H200 recordings whose windows alternate)
        corr = rec.kernels["correlation"]
        gid = rec.kernels.get("graph_id", np.zeros(n, np.int64))
        graph_launches = len(np.unique(corr[gid != 0]))
        kernel_launch_calls = len(np.unique(corr[gid == 0]))
    return Launches(kernels=n, graph_launches=graph_launches, kernel_launch_calls=kernel_launch_calls,
                    memcpys=rec.memcpys)
