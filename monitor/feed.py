"""The monitor's memory of one source: frames in, bounded history kept.

The only mutable state on the analysis side. Everything that derives numbers
from it (`metrics`, `diagnosis`) is pure and takes the values it exposes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from decodemon.probes import wire


@dataclass
class PmRow:
    """One PM sample, reduced to the four figures the diagnosis reads."""

    rx_ns: int
    gpu_busy_pct: float
    sm_active_pct: float
    warps_active_pct: float
    dram_pct: float


@dataclass
class Feed:
    """Bounded history of one source's frames (ring buffers: memory stays flat all day)."""

    max_marks: int = 200_000
    max_windows: int = 16
    max_pm: int = 20_000
    max_nvml: int = 4_000
    header: wire.RecordingHeader | None = None
    hello: wire.Hello | None = None
    marks_t: deque = field(default_factory=deque)
    marks_rx: deque = field(default_factory=deque)
    marks_depth: deque = field(default_factory=deque)
    coll: deque = field(default_factory=deque)  # (rx_ns, tokens in frame, calls, host ns, bytes) per TokenMarks
    windows: deque = field(default_factory=deque)  # (rx_ns, KernelWindow)
    pm: deque = field(default_factory=deque)
    nvml: deque = field(default_factory=deque)  # (rx_ns, NvmlSamples)
    state: dict = field(default_factory=dict)
    errors: list = field(default_factory=list)
    dropped_records: int = 0
    frames: int = 0
    last_rx_ns: int = 0
    bye: str | None = None

    def add(self, rx_ns: int, frame) -> None:
        """Take one frame."""
        self.frames += 1
        self.last_rx_ns = max(self.last_rx_ns, rx_ns)
        if isinstance(frame, wire.TokenMarks):
            t, d = frame.t_ns.array(), frame.depth.array()
            self.marks_t.extend(t.tolist())
            self.marks_depth.extend(d.tolist())
            self.marks_rx.extend([rx_ns] * len(t))
            if frame.coll_calls is not None:
                self.coll.append((rx_ns, len(t), int(frame.coll_calls.array().sum()),
                                  int(frame.coll_ns.array().sum()), int(frame.coll_bytes.array().sum())))
                while len(self.coll) > 20_000:
                    self.coll.popleft()
            while len(self.marks_t) > self.max_marks:
                self.marks_t.popleft()
                self.marks_depth.popleft()
                self.marks_rx.popleft()
        elif isinstance(frame, wire.KernelWindow):
            self.windows.append((rx_ns, frame))
            while len(self.windows) > self.max_windows:
                self.windows.popleft()
        elif isinstance(frame, wire.PmSamples):
            self.pm.extend(pm_rows(rx_ns, frame))
            while len(self.pm) > self.max_pm:
                self.pm.popleft()
        elif isinstance(frame, wire.NvmlSamples):
            self.nvml.append((rx_ns, frame))
            while len(self.nvml) > self.max_nvml:
                self.nvml.popleft()
        elif isinstance(frame, wire.Stats):
            self.state.update(frame.state)
            self.dropped_records = max(self.dropped_records, frame.dropped_records)
            for e in frame.errors:
                if e not in self.errors:
                    self.errors.append(e)
            del self.errors[:-20]
        elif isinstance(frame, wire.Hello):
            self.hello = frame
        elif isinstance(frame, wire.RecordingHeader):
            self.header = frame
        elif isinstance(frame, wire.Bye):
            self.bye = frame.reason

    # -- views ------------------------------------------------------------------
    def token_times_ns(self, since_rx_ns: int = 0) -> np.ndarray:
        """Token boundaries (engine clock) received at or after `since_rx_ns`."""
        t = np.fromiter(self.marks_t, dtype=np.int64, count=len(self.marks_t))
        if since_rx_ns:
            rx = np.fromiter(self.marks_rx, dtype=np.int64, count=len(self.marks_rx))
            t = t[rx >= since_rx_ns]
        return t

    def host_collectives(self, since_rx_ns: int = 0):
        """(calls per token, µs per call, bytes per call) the engine reported since `since_rx_ns`, or None."""
        rows = [r for r in self.coll if r[0] >= since_rx_ns] or list(self.coll)[-40:]
        tokens = sum(r[1] for r in rows)
        calls = sum(r[2] for r in rows)
        if not tokens or not calls:
            return None
        return calls / tokens, sum(r[3] for r in rows) / calls / 1e3, sum(r[4] for r in rows) / calls

    def depth(self) -> int:
        """Latest context depth reported by the token clock."""
        return int(self.marks_depth[-1]) if self.marks_depth else 0

    def pm_since(self, since_rx_ns: int = 0) -> list[PmRow]:
        """PM rows received at or after `since_rx_ns`."""
        return [r for r in self.pm if r.rx_ns >= since_rx_ns]

    def latest_window(self):
        """The newest traced window, or None."""
        return self.windows[-1][1] if self.windows else None

    def sm_count(self) -> int:
        """SMs on the device (0 when unknown)."""
        return self.hello.gpu.sm_count if self.hello and self.hello.gpu else 0


def pm_rows(rx_ns: int, f: wire.PmSamples) -> list[PmRow]:
    """Turn raw PM metric rows into GPU busy / SM active / warps / DRAM percentages."""
    m = {name: i for i, name in enumerate(f.metrics)}
    vals = f.values.array()
    if not len(f.metrics) or vals.size == 0:
        return []
    vals = vals.reshape(-1, len(f.metrics))

    def col(name):
        i = m.get(name)
        return vals[:, i] if i is not None else np.full(len(vals), np.nan)

    elapsed = col("gr__cycles_elapsed.max")
    with np.errstate(divide="ignore", invalid="ignore"):
        busy = np.clip(100.0 * col("gr__cycles_active.avg") / elapsed, 0, 100)
        sm = np.clip(100.0 * col("sm__cycles_active.avg") / elapsed, 0, 100)
    warps = col("sm__warps_active.avg.pct_of_peak_sustained_active")
    dram = col("dram__throughput.avg.pct_of_peak_sustained_elapsed")
    return [PmRow(rx_ns, float(b), float(s), float(w), float(d)) for b, s, w, d in zip(busy, sm, warps, dram)]
