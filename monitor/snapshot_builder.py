"""The snapshot builder: reads what a Session took (its feed, the metrics of each traced window, their GPU
steps) and makes the diagnosis's Inputs and a frozen `Snapshot` over a span of the feed.

    Session.feed, .metrics, .steps --token clock, PM span, bytes, bandwidth--> Inputs --diagnose--> Snapshot

Which clock ms/token comes from (the engine's marks, the step starts, the GPU's own steps in windows traced by
time, counted replays, or a server's counters) is chosen here, at each read, and named in `Snapshot.token_clock`.
"""

from __future__ import annotations

import warnings

import numpy as np

from decodemon.monitor import diagnosis as dx
from decodemon.monitor.analysis.agreement import dram_check
from decodemon.monitor.analysis.busy import PmWindowCheck, pm_window_check
from decodemon.monitor.analysis.collectives import comm_words, host_clock_times_collectives
from decodemon.monitor.analysis.observer import observer_cost
from decodemon.monitor.analysis.rates import (burst_stats, dram_bytes_per_s, gpu_step_stats, marks_enqueued,
                                              marks_in_bursts, step_bytes, traced_dram_ratio)
from decodemon.monitor.analysis.series import series
from decodemon.monitor.analysis.tokens import (TokenStats, batch_figures, counter_intervals, counter_stats,
                                              counter_throughput, first_token_figures, observed_tokens,
                                              observer_slowed, replay_stats, token_stats)
from decodemon.monitor.analysis.window import WindowMetrics
from decodemon.monitor.ceilings import SHORT_KERNEL_US, own_kernel_ms
from decodemon.monitor.snapshot import Snapshot
from decodemon.monitor.token_clock import GPU_STEP_CLOCKS, MARK_BURSTS, STARTS_AGREE, STEP_STARTS, clock_kind
from decodemon.probes import wire

SPAN_NS = 5_000_000_000  # figures are taken over the last 5 s of the feed
# a counted clock of its own steps (the step starts) reaches back past SPAN_NS for this many, where it has them
CLOCK_MIN_STEPS = 200
# a copy that reads under this share of the NVML peak ran beside a loop that kept DRAM busy (an H200: 4,248 GB/s
# alone, 2,217 beside a compiled Llama-8B decode, against 4,800 peak): not the device's bandwidth
COPY_PLAUSIBLE = 0.6


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


class SnapshotBuilder:
    """Reads one Session's frames into Inputs and Snapshots. It keeps what the last read chose (the token clock,
    the bytes per token two ways, the observer's slowed steps), which the snapshot of that read reports."""

    def __init__(self, session) -> None:
        self._session = session
        self._clock = ""
        self._bytes: tuple = (None, None)
        self._coll_window = None  # the span's window whose call priced COMM's µs a call
        self._step_bytes: float | None = None  # DRAM bytes a traced GPU step moved (windows timed by the GPU)
        self._slowed: dict | None = None  # the span's tokens the observer's steps overlapped (analysis.tokens)
        # the step starts held against the windows' GPU steps: GPU ms a step over the starts' ms a step (1: one
        # start a step); None when no window had steps to hold them against
        self.starts_check: float | None = None
        self._clock_end_rx: int | None = None  # where the step starts' clock ends, on the feed's clock

    @property
    def feed(self):
        """The session's feed."""
        return self._session.feed

    @property
    def metrics(self) -> list[tuple[int, WindowMetrics]]:
        """The session's (receive time, metrics) of each traced window kept."""
        return self._session.metrics

    @property
    def steps(self) -> dict:
        """The session's GPU steps of the windows timed by the GPU's clock, by window id."""
        return self._session.steps

    def _span_metrics(self, since: int) -> list[WindowMetrics]:
        ms = [m for rx, m in self.metrics if rx >= since]
        return ms or ([self.metrics[-1][1]] if self.metrics else [])

    def _gpu_clock(self, wins: list[WindowMetrics], pm_busy: float | None,
                   since: int = 0) -> tuple[TokenStats | None, str]:
        """ms/token from the GPU's own steps in the span's windows traced by time, and the clock's name."""
        timed = [(m, self.steps[m.window_id]) for m in wins if m.window_id in self.steps]
        if not timed:
            return None, ""
        spans = [(s.bounds_ns[0], s.bounds_ns[-1]) for _, s in timed]
        bounds = [w.token_bounds_ns.array() for _, w in self.feed.windows]
        traced = [self.feed.pm_within(a, b) for a, b in spans]
        ratio = traced_dram_ratio(traced, self.feed.pm_since(since),
                                  [(int(t[0]), int(t[-1])) for t in bounds if len(t)])
        self._step_bytes = step_bytes(traced, [s.bounds_ns for _, s in timed])
        ts = gpu_step_stats([s.bounds_ns for _, s in timed], timed[-1][0].gpu_busy_pct, pm_busy, ratio)
        return (ts, timed[-1][1].clock) if ts is not None else (None, "")

    def _pm_span(self, since: int) -> dict:
        """The span's PM samples; watched from outside, only those that arrived while the server generated (its
        idle time between requests is not the step's)."""
        pm = self.feed.pm_since(since)
        if not len(self.feed.counts) or len(self.feed.marks) or self.feed.counts_source == wire.STEP_STARTS:
            return pm
        c = self.feed.counts_since(since)
        ok = counter_intervals(c) if len(c["rx_ns"]) > 1 else np.zeros(0, bool)
        starts, ends = c["rx_ns"][:-1][ok], c["rx_ns"][1:][ok]
        if not len(starts):
            return {k: v[:0] for k, v in pm.items()}
        i = np.searchsorted(starts, pm["rx_ns"], side="right") - 1  # the interval each sample arrived in, if any
        keep = (i >= 0) & (pm["rx_ns"] <= ends[np.clip(i, 0, None)])
        return {k: v[keep] for k, v in pm.items()}

    def _dram_bytes_per_s(self, since: int) -> float | None:
        """DRAM read + write bytes a second over the span's PM samples that carry them (None where none do)."""
        return dram_bytes_per_s(self._pm_span(since))

    def _pm_average(self, since: int) -> dict:
        pm = self._pm_span(since)
        if not len(pm["rx_ns"]) and not len(self.feed.counts):
            pm = self.feed.pm_last(200)
        if not len(pm["rx_ns"]):
            return {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN metric stays NaN
            return {k: float(np.nanmean(pm[k])) for k in ("gpu_busy_pct", "sm_active_pct", "warps_active_pct",
                                                           "dram_pct") if k in pm}

    def _token_stats(self, since: int, wins: list[WindowMetrics], pm_busy: float | None,
                     span_ns: int | None = SPAN_NS):
        """The span's token figures and their clock: the engine's marks when it marks steadily (a traced step is
        stretched by tracing, the marks are not), else the GPU's steps in the windows timed by it (a loop that
        marks nothing, or marks in bursts because its host runs ahead)."""
        f = self.feed
        if len(f.counts) and not len(f.marks) and f.counts_source == wire.STEP_STARTS:
            ts = self._start_stats(since, wins, pm_busy, span_ns)
            if ts is not None:
                return ts, STEP_STARTS
            return self._gpu_clock(wins, pm_busy, since)
        if len(f.counts) and not len(f.marks):  # a step count: a server's own (watched from outside), or replays
            if f.counts_source == wire.GRAPH_REPLAYS:
                ts = replay_stats(f.counts_since(since), pm_busy)
                return ts, ("replay_count" if ts is not None else "")
            ts = counter_stats(f.counts_since(since))
            return ts, ("server_metrics" if ts is not None else "")
        marked = since if len(f.token_times_ns(since)) else 0  # nothing marked in the span: all the marks kept
        marks = f.token_times_ns(marked)
        # tokens the observer's own steps overlapped are not the loop's speed: left out, and billed to it
        spans = [sp for sp in f.observer if sp[1] > marks[0] and sp[0] < marks[-1]] if len(marks) else []
        self._slowed = None
        hit = observed_tokens(marks, spans) if spans else None
        ts = token_stats(marks, hit)
        # the marks are the engine's mark_token calls, or the closes of the NVTX range the attach named
        rng = self.feed.status.token_range
        marks_clock = f"nvtx_range:{rng}" if rng else "mark_token"
        # over every mark of the span: a host that enqueues ~200 steps ahead makes a few bursts in 5 s, and the
        # newest 256 marks alone can hold one burst's tail at the GPU's own pace (an H100 compiled 8B loop's did)
        if ts is not None and not marks_in_bursts(marks, last=len(marks)):
            self._slowed = observer_slowed(marks, spans, wire.OBSERVER_STEPS, hit) if spans else None
            return ts, marks_clock
        gpu = f.hello.gpu if f.hello else None
        if ts is not None and gpu is not None and marks_enqueued(marks, pm_busy, f.depths(marked)):
            # marks made ahead of the GPU: whole bursts of them span the attach, a window a few steps
            bursts = burst_stats(marks, spans) or burst_stats(f.token_times_ns(), f.observer)
            if bursts is not None:
                return bursts, MARK_BURSTS
        gpu_ts, clock = self._gpu_clock(wins, pm_busy, since)
        if gpu_ts is not None:
            return gpu_ts, clock
        return ts, (marks_clock if ts is not None else "")

    def _start_stats(self, since: int, wins: list[WindowMetrics], pm_busy: float | None,
                     span_ns: int | None = SPAN_NS) -> TokenStats | None:
        """ms/token from the step starts the agent timed (engine_adapter/step_starts.py), each a token, over the
        span, when the traced windows' own GPU steps agree that they come one a step (within STARTS_AGREE: a
        lookup a step, not two). A slow loop's span holds too few: the clock reaches back past it for the newest
        CLOCK_MIN_STEPS. A host that runs ahead is read over whole bursts, as marks are. Every step counts, those
        the observer's steps slowed too: a count of the whole span is the loop's rate as it ran (leaving the
        overlapped ones out read an H200 eager loop up to 7% fast against its own clock), and observer_cost says
        what watching added. None when they disagree, or are too few."""
        f = self.feed
        self._slowed = None
        c = f.counts_since(since)
        t = np.asarray(c["t_ns"], dtype=np.int64)
        if len(t) and span_ns is not None:  # the span on the starts' own clock (a ship is 0.5 s of them)
            t = t[t >= t[-1] - span_ns]
        if len(t) < CLOCK_MIN_STEPS + 1:
            every = np.asarray(f.counts_since(0)["t_ns"], dtype=np.int64)
            t = every[-max(CLOCK_MIN_STEPS + 1, len(t)):]
        ts = token_stats(t)
        self._clock_end_rx = None
        if len(c["t_ns"]):  # the starts' clock is the monitor's (one host's monotonic clock) less the attach's start
            self._clock_end_rx = int(t[-1] + np.min(c["rx_ns"] - c["t_ns"]))
        if ts is None:
            return None
        if marks_in_bursts(t):
            ts = burst_stats(t) or ts
        gpu, _ = self._gpu_clock(wins, pm_busy, since)
        self.starts_check = None if gpu is None else round(gpu.ms_per_token / ts.ms_per_token, 3)
        if self.starts_check is not None and not STARTS_AGREE[0] <= self.starts_check <= STARTS_AGREE[1]:
            return None
        spans = self._spans_over(t)
        if spans:  # what the observer's steps added, told beside the figures (observer_cost)
            hit = self._slowed_steps(t, spans)
            self._slowed = observer_slowed(t, spans, wire.OBSERVER_STEPS, hit) if hit.any() else None
        return ts

    def _spans_over(self, t: np.ndarray) -> list:
        """The observer's steps that overlap the boundaries `t`."""
        return [sp for sp in self.feed.observer if sp[1] > t[0] and sp[0] < t[-1]] if len(t) else []

    @staticmethod
    def _slowed_steps(t: np.ndarray, spans: list) -> np.ndarray:
        """Which steps between the boundaries `t` the observer's steps slowed: overlapped, and longer than the p90
        of those no step overlapped. A paced collect overlaps dozens of steps and slows few of them (an H200 eager
        loop: 34 under one, their median 30.5 ms against 28.6)."""
        hit = observed_tokens(t, spans)
        if hit.all() or not hit.any():
            return hit
        d = np.diff(t)
        return hit & (d > np.percentile(d[~hit], 90))

    def api_window(self, until: int | None = None) -> tuple[int | None, WindowMetrics | None]:
        """The latest window that traced its launch calls, received by `until` (any time: None), with when."""
        return next(((r, m) for r, m in reversed(self.metrics) if (until is None or r <= until) and m.apis_traced),
                    (None, None))

    def _depth_priced(self, since: int, bpt_measured: float | None) -> dict:
        """The KV depth the model's bytes were priced at (the feed's last token) and the span's depths, where the
        model prices the bytes (none where the DRAM counters do)."""
        f = self.feed
        if bpt_measured or f.hello is None or f.hello.model is None:
            return {}
        d = f.depths(since)
        return {"kv_depth": f.depth(), "kv_depth_span": (int(d.min()), int(d.max())) if len(d) else None}

    def _traced_collectives(self, wins: list) -> tuple:
        """COMM's figures from the span's traced windows: calls a token and a late peer's wait (their medians), µs a
        call (the lowest window's: waiting for a peer only ever adds to a call), and where they come from. Keeps the
        window that priced the call (the snapshot's collective_window)."""
        with_coll = [w for w in wins if w.collective_calls_per_token]
        # the idle a collective adds around itself needs its launch calls, except inside a graph: an eager window
        # that traced kernels only (Attach.api_every) says 0 for it, so it prices calls only when no other can
        priced = [w for w in with_coll if w.apis_traced or w.graph_launches_per_token] or with_coll
        self._coll_window = min(priced, key=lambda w: w.collective_in_step_us) if priced else None
        return (_median([w.collective_calls_per_token for w in wins]) if wins else None,
                self._coll_window.collective_in_step_us if priced else None,
                _median([w.collective_wait_ms_per_token for w in with_coll]),
                comm_words(len(wins), len(with_coll), len(priced)) if with_coll else "")

    def _inputs(self, since: int, span_ns: int | None = SPAN_NS, until: int | None = None):
        f = self.feed
        wins = self._span_metrics(since)
        pm_avg = self._pm_average(since)
        ts, self._clock = self._token_stats(since, wins, pm_avg.get("gpu_busy_pct"), span_ns)
        model = f.hello.model if f.hello else None
        gpu = f.hello.gpu if f.hello else None
        bpt_model = float(model.bytes_per_token(f.depth())) if model else None
        dram_bps = self._dram_bytes_per_s(since)
        # the DRAM counters' bytes over the tokens (steps) counted: slow ones move theirs too, so the mean's rate
        bpt_measured = dram_bps / ts.tokens_per_s if (dram_bps and ts and ts.tokens_per_s) else None
        if self._clock in GPU_STEP_CLOCKS and self._step_bytes:
            bpt_measured = self._step_bytes  # the steps' own samples: what tracing stretched, it did not add to
        bpt = bpt_measured if bpt_measured else bpt_model
        self._bytes = (bpt_measured, bpt_model)
        bw, bw_src = None, ""
        peak = gpu.mem_bandwidth_gbs if gpu else 0.0
        copy_gbs = self._session.copy_gbs
        if copy_gbs and peak and copy_gbs < COPY_PLAUSIBLE * peak:  # measured beside a busy loop
            bw, bw_src = peak, (f"NVML peak (a spec figure: the copy measured {copy_gbs:.0f} GB/s, under "
                                f"{COPY_PLAUSIBLE:.0%} of it, on a GPU the loop kept busy)")
        elif copy_gbs:
            bw, bw_src = copy_gbs, "measured copy (decodemon's own, this device and driver)"
        elif model and model.measured_bandwidth_gbs:
            bw, bw_src = (model.measured_bandwidth_gbs,
                          "measured copy (the engine adapter's: the engine timed its own copy)")
        elif gpu and gpu.mem_bandwidth_gbs:
            bw, bw_src = gpu.mem_bandwidth_gbs, "NVML peak (a spec figure, not measured)"
        last = wins[-1] if wins else None
        ksum = _median([w.kernel_sum_ms_per_token for w in wins]) if wins else None
        kbusy = _median([w.kernel_busy_ms_per_token for w in wins if w.kernel_busy_ms_per_token is not None])
        # as the small grids' share counts them; a kernel of a few µs a call is held by its fixed latency, which
        # more blocks do not shorten (fusing it does): the longer calls lead, as the ones widening could speed up
        rows = sorted((r for r in (last.kernels if last else ()) if r.grid_coverage_pct < 25 and not r.is_collective),
                      key=lambda r: (r.us_mean < SHORT_KERNEL_US, -r.us_per_token))
        small = [(r.label, r.grid_blocks, r.us_per_token) for r in rows]
        short = [r for r in rows if r.us_mean < SHORT_KERNEL_US]
        coll_small = sum(1 for r in (last.kernels if last else ()) if r.grid_coverage_pct < 25 and r.is_collective)
        coll_calls, coll_us, coll_wait, comm_source = self._traced_collectives(wins)
        # Without PM counters, GPU busy is estimated as kernel time over the untraced step: the traced
        # token's own wall clock is stretched by tracing and would understate it. A collective spinning while it
        # waits for a late peer is not busy (the diagnosis counts it as the step's idle).
        own = own_kernel_ms(kbusy if kbusy is not None else ksum, coll_wait)
        busy = pm_avg.get("gpu_busy_pct") if pm_avg else (
            min(100.0, 100.0 * own / ts.ms_per_token) if (own is not None and ts and ts.ms_per_token > 0) else None)
        host = f.host_collectives(since)
        if not coll_calls and host is not None:  # no NCCL kernels traced (gloo, or before a window): engine's clock
            # with NCCL the clock times the enqueue, not the collective: calls are known, µs wait for a window
            coll_calls, coll_us = host[0], (host[1] if host_clock_times_collectives(model, gpu) else None)
            comm_source, self._coll_window = "the engine's clock, host-side call time", None
        elif coll_calls is None and model is not None and model.tp_degree == 1:
            coll_calls = 0.0  # one rank: nothing to reduce
        inp = dx.Inputs(
            ms_per_token=ts.ms_per_token if ts else None, ms_kind=clock_kind(self._clock),
            kernels_per_token=_median([w.kernels_per_token for w in wins]) if wins else None,
            bytes_per_token=bpt, bandwidth_gbs=bw, bandwidth_source=bw_src,
            collectives_per_token=coll_calls, us_per_collective=coll_us, collective_wait_ms_per_token=coll_wait,
            comm_source=comm_source,
            kernel_sum_ms_per_token=ksum, kernel_busy_ms_per_token=kbusy,
            gpu_busy_pct=busy, sm_active_pct=pm_avg.get("sm_active_pct"),
            small_grid_share_pct=_median([w.small_grid_share_pct for w in wins]) if wins else None,
            hot_small_grids=tuple(small[:5]), small_grids_long=len(rows) - len(short) if last else None,
            small_grids_short=(len(short), sum(r.us_per_token for r in short)), small_grid_collectives=coll_small,
            sm_count=gpu.sm_count if gpu else 0,
            top_kernel=(last.kernels[0].label, last.kernels[0].us_per_token) if last and last.kernels else None,
            graph_launches_per_token=_median([w.graph_launches_per_token for w in wins]) if wins else None,
            kernel_launch_calls_per_token=last.kernel_launch_calls_per_token if last is not None else None,
            **self._depth_priced(since, bpt_measured),
            dram_gbs=dram_bps / 1e9 if dram_bps else None, ranks=model.tp_degree if model else None,
            no_gpu=gpu is None and bool((f.hello and f.hello.gpu_unavailable)
                                        or f.status.gpu.startswith("unavailable")),
            untraced=not wins and gpu is not None and (f.status.trace in ("unavailable", "off")
                                                        or f.status.window_clock == "none"),
        )
        return inp, ts, last, pm_avg, bpt, bw, bw_src

    def busy_source(self) -> str:
        """Where the GPU busy figure comes from."""
        # without PM: the traced window's kernel time over the loop's own ms/token (the traced step is stretched by
        # tracing), so the label names both
        return "PM counters (device-wide)" if len(self.feed.pm) else "the kernel share (traced kernel time ÷ ms/token)"

    def diagnose(self, rx_ns: int):
        """The diagnosis of the span before `rx_ns`, and the figures the rolling verdict keeps beside it."""
        inp, ts, last, pm_avg, *_ = self._inputs(max(rx_ns - SPAN_NS, 0), until=rx_ns)
        d = dx.diagnose(inp)
        figs = {"ms/token": inp.ms_per_token, "GPU busy %": inp.gpu_busy_pct,
                "kernels/token": inp.kernels_per_token}
        return d, figs

    def snapshot(self, at_rx_ns: int | None = None, span_ns: int | None = SPAN_NS) -> Snapshot:
        """The figures over the last `span_ns` of the feed before `at_rx_ns` (its end by default), with the
        diagnosis; `span_ns` None: over all of the feed (all the history it keeps: feed.Feed's rings)."""
        f = self.feed
        rx = f.last_rx_ns if at_rx_ns is None else at_rx_ns
        since = max(rx - span_ns, 0) if span_ns is not None else 0
        inp, ts, last, pm_avg, bpt, bw, bw_src = self._inputs(since, span_ns, rx)
        d = dx.diagnose(inp)
        gpu = f.hello.gpu if f.hello else None
        nv = {}
        if f.nvml:
            s = f.nvml[-1][1]
            if len(s.t_unix_ns.data):
                nv = {"sm_clock_mhz": int(s.sm_clock_mhz.array()[-1]), "mem_clock_mhz": int(s.mem_clock_mhz.array()[-1]),
                      "power_w": float(s.power_w.array()[-1]), "mem_used_bytes": int(s.mem_used_bytes.array()[-1]),
                      "gpu_util_pct": int(s.gpu_util_pct.array()[-1])}
        others = tuple(f.nvml[-1][1].other_pids) if f.nvml else ()
        batch = batch_figures(f.token_times_ns(since), f.batch_since(since)) \
            if f.batched else (None, None)
        api_rx, api_w = self.api_window(rx)
        # where the kernel figures come from: the latest of the span's windows, else the latest before it
        win_rx = next((r for r, m in reversed(self.metrics) if m is last), None)
        throughput = batch[1] if f.batched else counter_throughput(f.counts_since(since)) \
            if len(f.counts) and f.counts_source not in (wire.GRAPH_REPLAYS, wire.STEP_STARTS) else None
        # a server's own counters (llama-server's slots): a step makes a token of every request in it, so its
        # tokens a step are the total over one sequence's rate (the slots in use, -np N)
        server = self._clock == "server_metrics"
        per_step = batch[0]
        if per_step is None and server and throughput and ts and ts.tokens_per_s:
            per_step = round(throughput / ts.tokens_per_s, 2)
        origin = self._session.clock_origin_unix_s
        return Snapshot(
            api_window=api_w, api_window_age_s=(rx - api_rx) / 1e9 if api_rx is not None else None,
            window_rx_ns=win_rx, windows_in_span=sum(1 for r, _ in self.metrics if since <= r <= rx),
            label=self._session.label or (f"pid {f.hello.pid}" if f.hello else "?"),
            gpu_busy_pct=inp.gpu_busy_pct, busy_source=self.busy_source(),
            pid=f.hello.pid if f.hello else 0,
            device=gpu.name if gpu else (f"unavailable ({f.hello.gpu_unavailable})" if f.hello else "?"),
            sm_count=gpu.sm_count if gpu else 0, cc=gpu.cc if gpu else "",
            # every token counted: a batched engine's every request's; a server's own count, its tokens (every
            # request's), not its steps; the agent's graph replays or step starts, a token a step
            tokens_total=(f.batch_tokens_seen if f.batched else f.tokens_seen)
            or int(f.count_tokens_seen if f.counts_source == "llama.cpp" else f.steps_seen)
            or sum(st.steps for st in self.steps.values()), tokens=ts, window=last, windows_seen=len(self.metrics),
            pm=pm_avg,
            nvml=nv, model=f.hello.model if f.hello else None, depth=f.depth(), bytes_per_token=bpt,
            bandwidth_gbs=bw, bandwidth_source=bw_src, diagnosis=d, rolling=self._session.rolling,
            probe=dict(f.state),
            errors=tuple(f.errors), dropped_records=f.dropped_records, other_pids=others, rx_ns=rx, ended=f.bye,
            dram_check=dram_check(self._bytes[0], ts.tokens_per_s if ts else None,
                                  pm_avg.get("dram_pct") if pm_avg else None, gpu.mem_bandwidth_gbs if gpu else None),
            span_s=(rx - since) / 1e9, span_whole=span_ns is None,
            span_tokens=f.tokens_since(since),
            span_end_unix_s=origin + rx / 1e9 if origin is not None else None,
            clock_end_unix_s=(origin + self._clock_end_rx / 1e9 if origin is not None and
                              self._clock_end_rx is not None and self._clock == STEP_STARTS else None),
            series=self.series(rx), host_collectives=f.host_collectives(since),
            host_clock_is_collective=host_clock_times_collectives(f.hello.model if f.hello else None, gpu),
            kernel_share_pct=(min(100.0, 100.0 * own_kernel_ms(inp.kernel_ms, inp.collective_wait_ms_per_token)
                                  / inp.ms_per_token) if inp.kernel_ms is not None and inp.ms_per_token else None),
            inputs=inp, collective_window=self._coll_window, observer=self.observer_cost(ts),
            pm_check=self.pm_check(since),
            token_clock=self._clock, bytes_per_token_measured=self._bytes[0], bytes_per_token_model=self._bytes[1],
            throughput_tokens_per_s=throughput, tokens_per_step=per_step,
            steps_total=f.tokens_seen if f.batched else (int(f.steps_seen) if server else None),
            first_token=first_token_figures(f.first_token_ms(since)) if f.first_tokens else None,
            rejected_frames=f.rejected, rejected_why=tuple(f.rejected_why),
        )

    def pm_check(self, since: int) -> PmWindowCheck | None:
        """PM against the traced windows received since `since` (else the last one), over the same samples:
        the two instruments on the same GPU time (see analysis.busy.pm_window_check), pooled over the windows."""
        f = self.feed
        wins = [w for rx, w in f.windows if rx >= since] or ([f.windows[-1][1]] if f.windows else [])
        checks = []
        for w in wins:
            span = w.analysed_span()
            if span is None:
                continue
            pm = f.pm_within(*span)
            c = pm_window_check(w, pm["gpu_t0_ns"], pm["gpu_t1_ns"], pm["gpu_busy_pct"]) if len(pm["rx_ns"]) else None
            if c is not None:
                checks.append(c)
        n = sum(c.samples for c in checks)
        if not n:
            return None
        return PmWindowCheck(samples=n, pm_busy_pct=sum(c.pm_busy_pct * c.samples for c in checks) / n,
                             traced_busy_pct=sum(c.traced_busy_pct * c.samples for c in checks) / n)

    def observer_cost(self, ts: TokenStats | None) -> dict | None:
        """What the traced windows cost the decode thread (analysis/observer.py), and the tokens the observer's
        steps overlapped in the span (left out of the loop's figures)."""
        cost = observer_cost(self.metrics, self.feed.state, ts)
        if self._slowed is None:
            return cost
        s = self._slowed
        return {**(cost or {}), "slowed_tokens": s["tokens"], "slowed_extra_ms": s["extra_ms"], "slowed_by": s["by"]}

    def series(self, rx: int, points: int = 60, step_ns: int = 500_000_000) -> dict:
        """Recent history in `step_ns` bins (analysis/series.py)."""
        return series(self.feed, self.metrics, rx, points, step_ns)

