"""One watched source: its feed, the metrics of each traced window, and the rolling verdict.

`Session.add(rx_ns, frame)` is the single entry point for live attach, recordings and the app: the session takes
frames. `Session.snapshot()` hands them to the snapshot builder (snapshot_builder.py), which reads them into a
frozen `Snapshot` that `decodemon.monitor.render` prints as JSON, Markdown or text and the app draws.
"""

from __future__ import annotations

import time

import numpy as np

from decodemon.monitor.analysis.window import WindowMetrics, window_metrics
from decodemon.monitor.feed import Feed
from decodemon.monitor.rolling import Rolling, advance
from decodemon.monitor.snapshot import Snapshot
from decodemon.monitor.snapshot_builder import SPAN_NS, SnapshotBuilder
from decodemon.monitor.token_clock import GpuSteps, gpu_steps, marks_ahead, reclocked
from decodemon.probes import wire

UNTIMED_MAX_SHARE = 0.1  # records without times past the guard token's share: the window is not analysed


def untimed_window(w: wire.KernelWindow) -> bool:
    """More of the window's kernel records came back without times than its guard token's share (whose graph
    kernels may, wire.KernelWindow): the analysed tokens' did too, and the window is not analysed."""
    return untimed_share(w) > w.guard_tokens / max(w.tokens + w.guard_tokens, 1) + UNTIMED_MAX_SHARE


def untimed_share(w: wire.KernelWindow) -> float:
    """The share of a window's kernel records CUPTI returned without times (start 0, or an end before the start):
    kernels enqueued in the window that the GPU had not run when tracing stopped."""
    k = w.kernels
    if not k or "start" not in k or "end" not in k:
        return 0.0
    start, end = k["start"].array(), k["end"].array()
    return float(np.mean((start <= 0) | (end < start))) if len(start) else 0.0


class Session:
    """Feed + per-window metrics + rolling verdict for one source."""

    def __init__(self, label: str = "", clock_origin_unix_s: float | None = None) -> None:
        self.label = label
        self.feed = Feed()
        self.metrics: list[tuple[int, WindowMetrics]] = []
        self.steps: dict[int, GpuSteps] = {}  # window id -> its GPU steps, for windows timed by the GPU's clock
        self.rolling = Rolling()
        self._origin = clock_origin_unix_s
        self._pm_verdict_rx = -(10**18)
        # the device's copy bandwidth measured outside the target (probes/copy_bandwidth), when the source has it
        self.copy_gbs: float | None = None
        self._builder = SnapshotBuilder(self)

    @property
    def clock_origin_unix_s(self) -> float | None:
        """The wall-clock time (Unix s) of the feed's receive time 0, once known."""
        return self._origin

    def add(self, rx_ns: int, frame) -> None:
        """Take one frame; a traced window also advances the rolling verdict."""
        if self._origin is None and not isinstance(frame, wire.RecordingHeader):
            self._origin = time.time() - rx_ns / 1e9  # a live feed: its clock starts at the attach, now less rx
        if not self.feed.add(rx_ns, frame):
            return  # it holds what no probe writes: left out, and counted (Snapshot.rejected_frames)
        if isinstance(frame, wire.RecordingHeader):
            if self._origin is None:
                self._origin = frame.created_unix_s
            if self.copy_gbs is None:
                from decodemon.monitor.counters.bandwidth import from_note

                self.copy_gbs = from_note(frame.note)
        if isinstance(frame, wire.Hello) and self.copy_gbs is None and frame.gpu is not None and frame.gpu.copy_gbs:
            self.copy_gbs = frame.gpu.copy_gbs  # the monitor's measured copy, carried in the hello it rewrote
        if isinstance(frame, wire.KernelWindow):
            if untimed_window(frame):  # its kernel time would read 0 and its steps nothing
                untimed = untimed_share(frame)
                note = (f"window {frame.window_id}: CUPTI returned {100 * untimed:.0f}% of its kernel records "
                        "without times (traced work the GPU had not run when tracing stopped); not counted")
                if note not in self.feed.errors:
                    self.feed.errors.append(note)
                return
            gpu = self.feed.hello.gpu if self.feed.hello else None
            w = frame
            by_time = getattr(frame, "clock", "tokens") == "time"
            steps = gpu_steps(frame)
            if steps is None and by_time:
                return  # nothing repeats in it: no step to read per token
            # opened by time, or between marks the host made ahead of the GPU (a slice of GPU work between two
            # enqueues is no step): its tokens are the GPU's whole steps
            if steps is not None and (by_time or marks_ahead(frame, steps)):
                self.steps[frame.window_id] = steps
                w = reclocked(frame, steps)
            m = window_metrics(w, gpu.sm_count if gpu else 0, gpu.cc if gpu else "9.0")
            self.metrics.append((rx_ns, m))
            del self.metrics[:-self.feed.max_windows]
            d, figs = self._builder.diagnose(rx_ns)
            self.rolling = advance(self.rolling, d.ceiling, self._at(rx_ns), figs)
        elif isinstance(frame, wire.PmSamples) and not self.metrics and rx_ns - self._pm_verdict_rx >= 1e9:
            # no traced window (a loop that cannot be traced): the counters alone still move the verdict
            self._pm_verdict_rx = rx_ns
            d, figs = self._builder.diagnose(rx_ns)
            self.rolling = advance(self.rolling, d.ceiling, self._at(rx_ns), figs)

    def _at(self, rx_ns: int) -> str:
        origin = self._origin if self._origin is not None else time.time() - rx_ns / 1e9
        return time.strftime("%H:%M:%S UTC", time.gmtime(origin + rx_ns / 1e9))

    def snapshot(self, at_rx_ns: int | None = None, span_ns: int | None = SPAN_NS) -> Snapshot:
        """The figures over the last `span_ns` of the feed before `at_rx_ns` (its end by default), with the
        diagnosis; `span_ns` None: over all of the feed (all the history it keeps: feed.Feed's rings)."""
        return self._builder.snapshot(at_rx_ns, span_ns)

    def history(self) -> list[str]:
        """The verdict's changes, as sentences."""
        return [c.text() for c in self.rolling.history]
