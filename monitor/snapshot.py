"""What the monitor knows about a source at one moment (`Snapshot`): plain values that render/ prints as JSON,
Markdown or text, the app draws and the exporter serves. `snapshot_builder.py` makes them from a Session."""

from __future__ import annotations

from dataclasses import dataclass

from decodemon.monitor.analysis.busy import PmWindowCheck
from decodemon.monitor.analysis.tokens import TokenStats
from decodemon.monitor.analysis.window import WindowMetrics
from decodemon.monitor.ceilings import Inputs
from decodemon.monitor.diagnosis import Diagnosis
from decodemon.monitor.rolling import Rolling
from decodemon.probes import wire


@dataclass(frozen=True)
class Snapshot:
    """Everything the monitor knows about a source at one moment; plain values."""

    label: str
    pid: int
    gpu_busy_pct: float | None
    busy_source: str
    device: str
    sm_count: int
    cc: str
    tokens_total: int
    tokens: TokenStats | None
    window: WindowMetrics | None
    windows_seen: int
    pm: dict
    nvml: dict
    model: wire.ModelFacts | None
    depth: int
    bytes_per_token: float | None
    bandwidth_gbs: float | None
    bandwidth_source: str
    diagnosis: Diagnosis
    rolling: Rolling
    probe: dict
    errors: tuple[str, ...]
    dropped_records: int
    other_pids: tuple[int, ...]
    rx_ns: int
    ended: str | None
    series: dict = None  # name -> tuple of recent values, oldest first (telemetry and launch history)
    host_collectives: tuple | None = None  # (calls/token, µs/call, bytes/call) from the engine's clock
    host_clock_is_collective: bool = True  # that clock times the collective (gloo), not just its enqueue (NCCL)
    # the traced kernels' time over the untraced step: beside a PM GPU busy, what of it is kernels running
    # (on the H200 an eager loop read 27-29% busy from the counter and 17% kernels: the rest is launch work)
    kernel_share_pct: float | None = None
    inputs: Inputs | None = None  # what the diagnosis was given (a group view re-prices the collectives)
    collective_window: WindowMetrics | None = None  # the span's window whose call priced COMM's µs a call
    observer: dict | None = None  # what watching costs the decode thread (Session.observer_cost)
    # PM's GPU busy and the traced kernels' over the same PM samples inside the span's traced tokens
    pm_check: PmWindowCheck | None = None
    # the latest window that traced its launch calls (`window` itself unless that one traced kernels only,
    # Attach.api_every): the timeline's CPU lane, the host-late share of the gaps and the launch-call count
    api_window: WindowMetrics | None = None
    api_window_age_s: float | None = None  # how long before the snapshot it arrived (0: it is `window`)
    # when `window` arrived (the feed's receive clock), and how many traced windows arrived in the span: none, and
    # the kernel figures are the latest window's before the span
    window_rx_ns: int | None = None
    windows_in_span: int = 0
    # which clock ms/token comes from: "mark_token" (the engine's marks, host time), "nvtx_range:NAME" (the closes
    # of the NVTX range the attach named), the GPU's own steps in the traced windows ("graph replays" or "kernel
    # period") when the loop marks nothing or runs ahead of the GPU, "replay_count" (the CUDA graph replays the
    # agent counted in a loop that marks nothing: preferred to a window's steps, since it spans the attach and a
    # window a few steps), or "server_metrics" (watched from outside)
    token_clock: str = ""
    # bytes per token two ways: the DRAM counters' read + write bytes over counted tokens (no model facts needed)
    # and the model's weights plus the KV cache at depth (an adapter or report_model); the diagnosis uses the
    # measured figure when there is one
    bytes_per_token_measured: float | None = None
    bytes_per_token_model: float | None = None
    # watched from outside: every request's tokens a second (tokens_per_s is one sequence's, a step's rate)
    throughput_tokens_per_s: float | None = None
    # a batched engine (its marks are steps): the median tokens a step made (its sequences), and the steps counted
    tokens_per_step: float | None = None
    steps_total: int | None = None
    # a batched engine whose adapter sees requests: the time to first token of those whose first token came in the
    # span ({"requests", "median_ms", "p90_ms"}, requests 0 when none did; None when the adapter reports none)
    first_token: dict | None = None
    # bytes per token × tokens/s against PM's DRAM share of the peak (analysis.agreement.dram_check)
    dram_check: dict | None = None
    span_s: float | None = None  # the seconds the figures cover (the last span_ns of the feed, or all of a shorter one)
    span_whole: bool = False  # the span asked for is the whole feed (a recording, an attach's seconds), not its last s
    last_asked_s: float | None = None  # a --last that reached past the source's start (the whole span read instead)
    span_tokens: int | None = None  # the tokens counted in the span (Feed.tokens_since), where the feed counts them
    rolling_5s: "Snapshot | None" = None  # the last SPAN_NS beside a longer span (monitor.span.summary_snapshot)
    span_end_unix_s: float | None = None  # when that span ends
    clock_end_unix_s: float | None = None  # when the clock's own steps end, where it knows (the step starts)
    # frames left out because they hold what no probe writes (NaN, negative counts, time running backwards), and
    # the first few reasons: figures read without them are flagged, never passed off as the whole source's
    rejected_frames: int = 0
    rejected_why: tuple[str, ...] = ()

    @property
    def device_only(self) -> bool:
        """A CUDA program with no Python and no clock to read, watched from outside: its device-wide counters
        alone."""
        return self.probe.get("token_clock") == "none"

    @property
    def measured_anything(self) -> bool:
        """Tokens marked by the engine, or GPU steps read in a traced window (a loop that marks nothing); watched
        from outside, a rate over whole intervals of the server's steps, or for a program with no clock its
        counters."""
        if self.probe.get("token_clock") == "server_metrics":
            return self.tokens is not None
        if self.device_only:
            return bool(self.pm) or self.tokens is not None
        return bool(self.tokens_total) or self.tokens is not None

    def collective_terms(self) -> tuple[float, float, float, float] | None:
        """(calls a token, kernel µs, launch gap µs, late peer's wait ms a token) as COMM priced them over the span
        (Inputs.comm_source says whence), where a window traced collectives; else the latest window's."""
        w, i = self.collective_window or self.window, self.inputs
        if w is None:
            return None
        calls = i.collectives_per_token if i is not None and i.collectives_per_token else w.collective_calls_per_token
        wait = i.collective_wait_ms_per_token if i is not None and i.collective_wait_ms_per_token is not None \
            else w.collective_wait_ms_per_token
        return calls, w.collective_kernel_us, w.collective_gap_us, wait

    @property
    def collective_us_priced(self) -> float | None:
        """µs per collective as the diagnosis priced it, else the last window's in-step figure."""
        if self.inputs is not None and self.inputs.us_per_collective:
            return self.inputs.us_per_collective
        return self.window.collective_in_step_us if self.window is not None else None

