"""A traced window's records, restricted to the tokens it analyses: the input every analyzer reads.

    token bounds   |<-- token 0 -->|<-- token 1 -->|<- guard ->|
    lo_ns ^                        hi_ns ^
    kernels          [k][k] [k]  [k]  [k][k]    [k]   [k]
                     kept: wholly inside [lo, hi]   |    not analysed (the guard token's)
                                                  [k--]  began inside, ended after hi: dropped

A window may trace tokens beyond the analysed ones (a graphed process's guard token); their records, and any
kernel that straddles the last analysed boundary, stay out of every figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from decodemon.probes import wire

_NONE = np.zeros(0, np.int64)


@dataclass(frozen=True)
class TracedRecords:
    """One window's kernel, API and copy records over its analysed tokens (columns as numpy arrays)."""

    window_id: int
    tokens: int  # analysed tokens, at least 1 (the per-token divisor)
    bounds_ns: np.ndarray  # the window's token boundaries, CUPTI's clock
    whole_tokens: int  # tokens the boundaries delimit (0: no boundaries, and nothing is filtered)
    lo_ns: int  # start of the first analysed token
    hi_ns: int  # end of the last analysed token
    kernels: dict  # column name -> array, one row per kernel wholly inside [lo_ns, hi_ns]
    names: tuple  # the window's kernel name table (kernels["name"] indexes it)
    dropped_kernels: int  # kernels that began inside the tokens but did not end inside them
    apis: dict  # column name -> array, one row per API call that began inside [lo_ns, hi_ns)
    api_names: np.ndarray  # object array: each API row's function name ("" when the window did not name it)
    memcpys: int  # copies that began inside the analysed tokens
    apis_traced: bool  # False: the window traced kernels only (no launch calls, no CPU lane)

    @property
    def wall_ns(self) -> int:
        """The analysed tokens' span on the GPU's clock (at least 1 ns)."""
        return max(self.hi_ns - self.lo_ns, 1)

    @property
    def start_ns(self) -> np.ndarray:
        """Each kept kernel's start."""
        return self.kernels.get("start", _NONE)

    @property
    def end_ns(self) -> np.ndarray:
        """Each kept kernel's end."""
        return self.kernels.get("end", _NONE)

    @property
    def duration_ns(self) -> np.ndarray:
        """Each kept kernel's duration."""
        return (self.end_ns - self.start_ns).astype(np.int64)

    @property
    def name_idx(self) -> np.ndarray:
        """Each kept kernel's index into `names`."""
        return self.kernels.get("name", _NONE)


def api_row_names(w: wire.KernelWindow, api: dict) -> np.ndarray:
    """Each API row's function name ("" where the window did not name it), for the columns `api` of `w`'s calls."""
    cbid, dom = api.get("cbid", _NONE), api.get("domain", _NONE)
    return np.array([w.api_names.get(f"{d}:{c}", "") for c, d in zip(cbid.tolist(), dom.tolist())], dtype=object)


def analysed_records(w: wire.KernelWindow) -> TracedRecords:
    """The window's records over its analysed tokens: kernels wholly inside them, calls and copies begun in them."""
    cols = {k: v.array() for k, v in w.kernels.items()}
    bounds = w.token_bounds_ns.array()
    tokens = max(int(w.tokens), 1)
    nb = min(tokens, len(bounds) - 1) if len(bounds) >= 2 else 0
    lo, hi = (int(bounds[0]), int(bounds[nb])) if nb else (0, 0)
    start, end = cols.get("start", _NONE), cols.get("end", _NONE)
    valid = (start >= lo) & (end <= hi) & (end >= start) if nb else np.ones(len(start), bool)
    dropped = int(((start >= lo) & (start < hi) & ~valid).sum()) if nb else 0

    api = {k: v.array() for k, v in w.apis.items()}
    if nb and "start" in api:
        keep = (api["start"] >= lo) & (api["start"] < hi)
        api = {k: v[keep] for k, v in api.items()}
    api_names = api_row_names(w, api)

    mstart = w.memcpys["start"].array() if "start" in w.memcpys else _NONE
    memcpys = int(((mstart >= lo) & (mstart < hi)).sum()) if nb else len(mstart)
    return TracedRecords(
        window_id=w.window_id, tokens=tokens, bounds_ns=bounds, whole_tokens=nb, lo_ns=lo, hi_ns=hi,
        kernels={k: v[valid] for k, v in cols.items()}, names=tuple(w.names), dropped_kernels=dropped,
        apis=api, api_names=api_names, memcpys=memcpys, apis_traced=bool(getattr(w, "apis_traced", True)),
    )
