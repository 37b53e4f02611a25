"""Launches per token: how many kernels ran, and how many host calls queued them.

A kernel record carries the correlation id of the API call that launched it; every kernel of one
cudaGraphLaunch carries that launch's id:

    host   cudaLaunchKernel#7  cudaLaunchKernel#8   cudaGraphLaunch#9
    GPU          [k corr=7]         [k corr=8]        [k 9][k 9][k 9][k 9]
                 graph_id=0         graph_id=0        graph_id!=0

The host's launch calls are counted from the kernels' distinct correlation ids, in every window: one per graph
launch among graph kernels, one per launch call among the rest, whichever layer made it (cuBLAS and other
libraries launch some kernels through the driver, where a runtime-API count misses them: 225 of an eager Qwen3-0.6B
token's 1,863). Where the window traced the API calls, the runtime's own kernel launch calls are counted too
(`runtime_launch_calls`), in one layer (the runtime's calls are also seen as driver calls underneath): the
runtime's when it launched anything, else the driver's.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

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
    kernel_launch_calls: int  # the host's, runtime and driver alike (distinct correlation ids)
    memcpys: int
    runtime_launch_calls: int | None = None  # those the runtime API made, where the window traced its calls


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
    runtime = kernel_launch_calls if rec.apis_traced else None
    corr = rec.kernels.get("correlation")
    if n and corr is not None and len(corr) == n and (rec.apis_traced is False or bool(np.all(corr != 0))):
        # a kernel's correlation id is its launch call's, whichever layer made it, and every kernel of one
        # cudaGraphLaunch carries that launch's id (checked on the H200 recordings whose windows alternate)
        gid = rec.kernels.get("graph_id", np.zeros(n, np.int64))
        graph_launches = len(np.unique(corr[gid != 0]))
        kernel_launch_calls = len(np.unique(corr[gid == 0]))
    return Launches(kernels=n, graph_launches=graph_launches, kernel_launch_calls=kernel_launch_calls,
                    memcpys=rec.memcpys, runtime_launch_calls=runtime)


def runtime_calls_for(names: np.ndarray, apis: dict, kernel_corr: np.ndarray) -> int | None:
    """How many of the counted layer's kernel launch calls among `apis` (every call the window traced; `names`
    each row's function) launched a kernel of `kernel_corr` (correlation ids): the calls of a token's own kernels,
    wherever in time the host made them (a host running ahead makes them a few steps before the kernels run, so
    the calls made while a step runs on the GPU are other tokens'). None where the calls carry no ids."""
    corr = apis.get("correlation")
    if corr is None or len(corr) != len(names):
        return None
    rows = SimpleNamespace(api_names=names, apis=apis)
    calls = launch_calls(rows)
    sel = calls.kernel & calls.layer
    return int(len(np.intersect1d(corr[sel], kernel_corr)))
