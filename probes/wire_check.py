"""What a frame can hold: `frame_problem` names, in a few words, a value no probe writes (NaN, a negative count or
duration, time running backwards, columns of unequal length, a column that is not a little-endian number), so the
monitor's feed leaves such a frame out and says so, and a recording's reader refuses such a header.

Only the standard library, msgspec and numpy (for the columns), like the wire itself."""

from __future__ import annotations

import math

import msgspec

from decodemon.probes import wire

# the largest whole number a scalar field holds: 2^53, where a float stops counting every integer (a count, a pid, a
# byte total or a nanosecond figure past it is no measurement, and JSON would not carry it exactly)
MAX_SCALAR = 2**53
DAY_NS = 86_400 * 10**9
MAX_CREATED_UNIX_S = 1e10  # the year 2286: a header created later was written by no clock
MAX_DEPTH = 2**40  # context positions
MAX_BATCH = 2**24  # tokens one step made
MAX_GRID = 2**31  # a CUDA grid or block dimension
MAX_METRICS = 4096  # PM metrics sampled at once


def _scalar_problem(obj, where: str = "") -> str | None:
    """The first scalar field (recursing into nested structs) that is not a finite number in [0, MAX_SCALAR]."""
    for name in obj.__struct_fields__:
        v = getattr(obj, name)
        if isinstance(v, bool) or v is None:
            continue
        if isinstance(v, (int, float)):
            if isinstance(v, float) and not math.isfinite(v):
                return f"{where}{name} is {v!r}"
            if v < 0:
                return f"{where}{name} is negative ({v!r})"
            if v > MAX_SCALAR:
                return f"{where}{name} is past 2^53 ({v!r})"
        elif isinstance(v, msgspec.Struct) and not isinstance(v, wire.Column):
            why = _scalar_problem(v, f"{where}{name}.")
            if why:
                return why
    return None


def _array(col: wire.Column, name: str):
    """The column as an array, or the reason it is none: only little-endian ints and floats travel."""
    import numpy as np

    try:
        dt = np.dtype(col.dtype)
    except (TypeError, ValueError):
        return None, f"{name} has dtype {col.dtype[:20]!r}"
    if dt.kind not in "iuf" or dt.byteorder == ">" or dt.itemsize not in (1, 2, 4, 8):
        return None, f"{name} has dtype {col.dtype[:20]!r}"
    if len(col.data) % dt.itemsize:
        return None, f"{name} holds {len(col.data)} bytes, not whole {col.dtype} values"
    a = np.frombuffer(col.data, dtype=dt)
    if dt.kind == "f" and not np.isfinite(a).all():
        return None, f"{name} holds NaN or infinity"
    if dt.kind == "u" and dt.itemsize == 8 and len(a) and a.max() >= 2**63:  # the monitor reads them as int64
        return None, f"{name} holds {a.max()}, past 2^63"
    return a, None


class _Cols:
    """A frame's columns read once, each with the checks the frame's kind asks of it."""

    def __init__(self) -> None:
        self.why: str | None = None

    def get(self, col, name: str, lo=None, hi=None):
        """The column's values (None if `col` is None or a check already failed); the first failure is kept."""
        if col is None or self.why:
            return None
        a, why = _array(col, name)
        if why:
            self.why = why
            return None
        if len(a) and lo is not None and a.min() < lo:
            self.why = f"{name} holds {a.min()!r}, under {lo}"
        elif len(a) and hi is not None and a.max() > hi:
            self.why = f"{name} holds {a.max()!r}, past {hi}"
        return a if not self.why else None

    def same_length(self, arrays: dict, what: str, n: int | None = None) -> None:
        """Every array of `arrays` (None skipped) is `n` long, or as long as the first."""
        if self.why:
            return
        lens = {k: len(v) for k, v in arrays.items() if v is not None}
        want = n if n is not None else next(iter(lens.values()), 0)
        bad = [k for k, m in lens.items() if m != want]
        if bad:
            self.why = f"{what}: {bad[0]} has {lens[bad[0]]} values, not {want}"

    def forward(self, a, name: str, span_ns: int | None = None) -> None:
        """`a` never runs backwards (and, with `span_ns`, covers at most that)."""
        import numpy as np

        if self.why or a is None or len(a) < 2:
            return
        d = np.diff(a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64))
        if (d < 0).any():
            self.why = f"{name} runs backwards (by {-float(d.min()):.6g})"
        elif span_ns is not None and float(a[-1]) - float(a[0]) > span_ns:
            self.why = f"{name} spans {(float(a[-1]) - float(a[0])) / 1e9:.3g} s"

    def ends_after_starts(self, start, end, name: str) -> None:
        """Each interval's end is at or after its start."""
        if self.why or start is None or end is None or len(start) != len(end):
            return
        if (end < start).any():
            self.why = f"{name} ends before it starts"


def _dict_cols(c: _Cols, cols: dict, what: str, nonneg=()) -> dict:
    """A dict of columns (a window's kernels, apis, ...): each read, all of one length; those in `nonneg` >= 0."""
    out = {k: c.get(v, f"{what}.{k}", lo=0 if k in nonneg else None) for k, v in cols.items()}
    c.same_length(out, what)
    return out


# CUPTI's records are uint64 fields packed as their int64 view (decodemon_cupti.c), and it returns a bogus end at
# times (monitor/analysis/records.py leaves such kernels out and counts them): of a window's records only the
# dimensions, which CUPTI gives as 32-bit, are held to be whole numbers
_DIMS = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")


def _window_problem(w: wire.KernelWindow, c: _Cols) -> None:
    if w.clock not in ("tokens", "time"):
        c.why = f"clock is {w.clock[:20]!r}"
        return
    tb = c.get(w.token_bounds_ns, "token_bounds_ns", lo=0)
    c.forward(tb, "token_bounds_ns", DAY_NS)
    if tb is not None and w.clock == "tokens" and w.tokens and len(tb) < w.tokens + 1:
        c.why = f"{w.tokens} tokens with {len(tb)} bounds"
    k = _dict_cols(c, w.kernels, "kernels", nonneg=_DIMS + ("name",))
    for dim in _DIMS:
        v = k.get(dim)
        if v is not None and len(v) and v.max() > MAX_GRID and not c.why:
            c.why = f"kernels.{dim} holds {v.max()}"
    v = k.get("name")
    if v is not None and len(v) and v.max() >= len(w.names) and not c.why:
        c.why = f"a kernel's name is entry {v.max()} of {len(w.names)}"
    for what in ("apis", "memcpys", "syncs"):
        _dict_cols(c, getattr(w, what), what)
    n = _dict_cols(c, w.nvtx, "nvtx", nonneg=("name", "start", "end", "level"))
    c.ends_after_starts(n.get("start"), n.get("end"), "an NVTX range")
    v = n.get("name")
    if v is not None and len(v) and v.max() >= len(w.nvtx_names) and not c.why:
        c.why = f"an NVTX range's name is entry {v.max()} of {len(w.nvtx_names)}"


def _marks_problem(f: wire.TokenMarks, c: _Cols) -> None:
    t = c.get(f.t_ns, "t_ns", lo=0)
    c.forward(t, "t_ns", DAY_NS)
    cols = {"t_ns": t, "depth": c.get(f.depth, "depth", lo=0, hi=MAX_DEPTH),
            "batch": c.get(f.batch, "batch", lo=0, hi=MAX_BATCH)}
    coll = {k: c.get(getattr(f, k), k, lo=0) for k in ("coll_calls", "coll_ns", "coll_bytes")}
    c.same_length({**cols, **coll}, "token marks", len(t) if t is not None else None)
    c.get(f.first_token_ns, "first_token_ns", lo=0, hi=DAY_NS)
    ob = c.get(f.observer_ns, "observer_ns", lo=0)
    if ob is not None:
        if len(ob) % 3:
            c.why = f"observer_ns holds {len(ob)} values, not rows of three"
            return
        rows = ob.reshape(-1, 3)
        c.ends_after_starts(rows[:, 0], rows[:, 1], "an observer's step")
        if len(rows) and rows[:, 2].max() >= len(wire.OBSERVER_STEPS) and not c.why:
            c.why = f"an observer's step is {rows[:, 2].max()}, not one of {len(wire.OBSERVER_STEPS)}"


def _pm_problem(f: wire.PmSamples, c: _Cols) -> None:
    if len(f.metrics) > MAX_METRICS:
        c.why = f"{len(f.metrics)} metrics"
        return
    t0, t1 = c.get(f.start_ns, "start_ns", lo=0), c.get(f.end_ns, "end_ns", lo=0)
    v = c.get(f.values, "values")
    c.same_length({"start_ns": t0, "end_ns": t1}, "PM samples")  # an interval may be odd: the analysis skips it
    if not c.why and v is not None and t0 is not None and len(v) != len(t0) * len(f.metrics):
        c.why = f"{len(v)} values for {len(t0)} samples of {len(f.metrics)} metrics"


def _nvml_problem(f: wire.NvmlSamples, c: _Cols) -> None:
    cols = {k: c.get(getattr(f, k), k, lo=0) for k in ("t_unix_ns", "sm_clock_mhz", "mem_clock_mhz", "power_w",
                                                        "mem_used_bytes", "gpu_util_pct")}
    c.same_length(cols, "NVML samples")  # t_unix_ns is the wall clock, which may be stepped back
    if not c.why and cols["gpu_util_pct"] is not None and len(cols["gpu_util_pct"]) \
            and cols["gpu_util_pct"].max() > 100:
        c.why = f"gpu_util_pct holds {cols['gpu_util_pct'].max()}"


def _counts_problem(f: wire.StepCounts, c: _Cols) -> None:
    t = c.get(f.t_ns, "t_ns", lo=0)
    cols = {"t_ns": t, **{k: c.get(getattr(f, k), k, lo=0) for k in ("steps", "tokens", "busy", "ended")}}
    if f.depth is not None:
        cols["depth"] = c.get(f.depth, "depth", lo=0)
    c.same_length(cols, "step counts")
    c.forward(t, "t_ns", DAY_NS)


_COLUMNS = {wire.KernelWindow: _window_problem, wire.TokenMarks: _marks_problem, wire.PmSamples: _pm_problem,
            wire.NvmlSamples: _nvml_problem, wire.StepCounts: _counts_problem}


def frame_problem(frame) -> str | None:
    """Why `frame` holds what no probe writes, in a few words, or None when every value it carries is possible."""
    if isinstance(frame, (wire.RecordingHeader, wire.Hello)) and not 1 <= frame.wire_version <= wire.WIRE_VERSION:
        return f"wire version {frame.wire_version} is not one this decodemon knows (1 to {wire.WIRE_VERSION})"
    why = _scalar_problem(frame)
    if why:
        return why
    if isinstance(frame, wire.RecordingHeader) and frame.created_unix_s > MAX_CREATED_UNIX_S:
        return f"created_unix_s is {frame.created_unix_s!r}"
    if isinstance(frame, wire.Hello):
        if frame.pid <= 0:
            return f"pid is {frame.pid}"
        bad = next((k for k, v in frame.settings.items() if not math.isfinite(v)), None)
        if bad is not None:
            return f"settings[{bad[:40]!r}] is {frame.settings[bad]!r}"
        m = frame.model
        if m is not None and (m.tp_degree < 1 or m.tp_rank >= m.tp_degree):
            return f"model rank {m.tp_rank} of a tensor-parallel degree of {m.tp_degree}"
    check = _COLUMNS.get(type(frame))
    if check is None:
        return None
    c = _Cols()
    check(frame, c)
    return c.why
