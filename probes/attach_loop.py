"""The agent thread's loop for one attach: wake at ticks, run the periodic tasks that are due, send what they made.

    on a closed window           collect its records into a KernelWindow (woken at once by the decode thread)
    window (window_period_s)     ask the decode thread for a token window, or trace a window by time here
    marks (agent_tick_s)         ship the token marks
    stats (1 s)                  the probe's status (frames.ProbeStatus)

Every system call the agent thread makes gives up the GIL and takes it back, and a take-back from a decode thread
running Python makes that thread wait: so a tick makes as few calls as it can (one send on a socket left
non-blocking, keeping the GIL: held.py), and the loop sleeps between ticks. NVML and PM are not read here at all:
the monitor's sidecar reads them, in decodemon's own process (monitor/counters/sidecar.py).
"""

from __future__ import annotations

import selectors
import time
from collections import deque

from decodemon.probes import frames, held, policy
from decodemon.probes.facts import PROCESS
from decodemon.probes.schedule import Schedule
from decodemon.probes.session import MARK_FIELDS, foreign_profiler_active, take_front

FIRST_WINDOW_LEAD_TOKENS = 2  # tokens between the process's first CUPTI start-up (agent thread) and its window
STATS_PERIOD_S = 1.0


# Between chunks of a window's records (agent thread): the field reading and packing of an eager window's ~3,500
# records is spread over several tokens. A bare 1 ms sleep per 256-record chunk left the agent most of the GIL
# while it collected (H200, eager transformers generate(): a 40 ms collect under 66 ms tokens, against 26); a
# sleep of COLLECT_SLEEP_RATIO times each chunk's CPU leaves it no more than a fifth.
COLLECT_SLEEP_RATIO = 4.0


class AttachLoop:
    """One attach's loop on the agent thread; `run()` returns why it ended."""

    def __init__(self, conn, reader, session, status: dict, ev=None, hello_frame=None) -> None:
        st = session.settings
        self.conn, self.reader, self.session, self.status, self.ev = conn, reader, session, status, ev
        self.settings = st
        self.tick = min(st.agent_tick_s, 0.05) if st.prepare_lead_tokens > 0 else st.agent_tick_s
        self.sel = selectors.DefaultSelector()
        conn.setblocking(False)
        self.sel.register(conn, selectors.EVENT_READ, "monitor")
        self.sel.register(session.wake_r, selectors.EVENT_READ, "wake")
        now = self.t_start = self.next_tick = time.monotonic()
        self.sched = Schedule(slack_s=self.tick / 2)
        self.sched.add("marks", st.agent_tick_s, now + st.agent_tick_s)  # at every tick the settings ask for
        self.sched.add("stats", STATS_PERIOD_S, now + STATS_PERIOD_S)
        self.sched.add("window", st.window_period_s, policy.first_window_at(st, now))
        self.out = bytearray()
        self.last_window, self.tokens_at_window = now, -10**9  # the first window does not wait for tokens
        self.shipped = 0  # token marks sent so far: with the ones still queued, the token count
        self.last_shipped_ns: int | None = None  # the engine-clock time of the newest mark sent (PROCESS.marked_ns)
        self.starts_shipped = 0  # step starts sent so far (_ship_starts)
        self.marks_seen, self.last_mark_at = 0, None  # marks counted at the last tick, and when one last came
        self.recent_marks: deque = deque(maxlen=policy.BURST_MARKS)  # perf_counter ns of the newest marks
        # this thread's CPU since the attach began, for agent_cpu_ms_per_s; CUPTI's start-up (prepare, made here
        # with the GIL given up) is counted apart in startup_cpu_s, and reported as its own figure
        self.cpu_t0, self.startup_cpu_s = (now, time.thread_time()), 0.0
        self.finalize_cpu_s = 0.0  # CUPTI's finalizes made here (GIL-free), counted apart as the start-up is
        self.window_id = 0
        self.skipped_seen = self.windows_seen = 0
        self.open_after: int | None = None  # token count at which a prepared window is asked for
        self.hello = hello_frame
        self.step_aside = ""  # set from another thread: end the attach with this reason
        # the monitor's last whole frame (a Heartbeat every frames.HEARTBEAT_S): silent past the lease, it is dropped
        # as one gone, so a client that sent an Attach and went quiet cannot hold the slot
        self.heard, self.lease_s = now, frames.lease_s(st.agent_tick_s)
        self.model_sent = hello_frame.model if hello_frame is not None else None

    # -- the loop -------------------------------------------------------------
    def run(self) -> str:
        """Serve the attach until the monitor detaches or goes away; the reason."""
        while True:
            if self.step_aside:  # a monitor that does not yield asked for the agent (server.Agent._claim)
                return self.step_aside
            woken, reason = self._wait()
            silent = time.monotonic() - self.heard  # after _wait read what the monitor had sent
            if reason is None and silent > self.lease_s:
                reason = f"dropped: silent for {silent:.1f} s"
            if reason is not None:
                if reason == "detached":  # the monitor still reads: the marks since the last tick go before the Bye
                    self._ship_steps()
                    if self.out:
                        held.send_all(self.conn, self.out, 1.0)
                        self.out.clear()
                return reason
            now = time.monotonic()
            on_tick = now >= self.next_tick
            if not on_tick and not woken:
                continue  # the monitor's message, read; the rest waits for the tick
            if on_tick:
                self.next_tick = max(self.next_tick + self.tick, now + self.tick / 2)
            self._note_marks(now)
            if self.sched.due("marks", now):  # first: the window's clock reads the newest marks shipped
                self._ship_steps()
                self.sched.ran("marks", now)
            if self.session.tracer is not None and self.session.window_ready.is_set():
                self._collect_token_window(now)
            self._check_window(now)
            if self.sched.due("stats", now):
                self._stats(now)
                self.sched.ran("stats", now)
            if self.out:
                if self.ev is not None:
                    self.ev.add("send", len(self.out))
                if not held.send_all(self.conn, self.out, 2.0):
                    return "monitor went away"
                self.out.clear()

    def _wait(self) -> tuple[bool, str | None]:
        """Sleep until the next tick, a wake-up or the monitor's message: (woken, why the attach ends or None)."""
        woken = False
        for key, _ in self.sel.select(timeout=max(0.0, self.next_tick - time.monotonic())):
            if key.data == "wake":
                try:
                    self.session.wake_r.recv(4096)
                except OSError:
                    pass
                woken = True
                continue
            data = self.conn.recv(65536)
            if not data:
                return woken, "monitor went away"
            for payload in self.reader.feed(data):
                if isinstance(frames.decode_control(payload), frames.Detach):
                    return woken, "detached"
                self.heard = time.monotonic()
        return woken, None

    def tokens(self) -> int:
        """Token marks so far in this attach (shipped and queued)."""
        return self.shipped + self.session.marks_queued

    def _note_marks(self, now: float) -> None:
        n = self.tokens()
        if n > self.marks_seen:
            self.marks_seen, self.last_mark_at = n, now

    # -- windows --------------------------------------------------------------
    def _window_idle(self) -> bool:
        s = self.session
        return (s.tracer is not None and not s.tracer.active and not s.window_ready.is_set()
                and not s.want_window and self.open_after is None)

    def _check_window(self, now: float) -> None:
        s, st = self.session, self.settings
        self._check_window_open()
        if not self._window_idle():
            return
        clock = policy.window_clock(now, self.t_start, self.last_mark_at, self.recent_marks)
        if clock is None:
            return
        if clock == "time" and policy.replays_graphs(PROCESS.graph_kernels_seen, PROCESS.engine_cuda_graphs):
            # no safe point to finalize CUPTI at: counters only, and the status says why
            self.status.update(window_clock="none", window_clock_reason="graphs")
            return
        since, tokens_since = now - self.last_window, self.tokens() - self.tokens_at_window
        if not policy.window_due(st, now, self.sched.next_at("window"), since, tokens_since,
                                 PROCESS.windows_in_process, policy.cap_lead_s(self.tick, since, tokens_since)):
            return
        s.tracer.with_apis = policy.apis_in_window(s.windows_asked, st.api_every)
        s.windows_asked += 1
        self.sched.ran("window", now)
        self.last_window, self.tokens_at_window = now, self.tokens()
        if clock == "time":
            self.status.update(window_clock="time",
                               window_clock_reason=policy.time_clock_reason(self.last_mark_at, now))
            self._time_window(now)
            return
        self.status.update(window_clock="tokens", window_clock_reason="")
        # with a prepare lead, CUPTI starts here, in this thread, and the window opens that many tokens later;
        # without one (the default) the opening boundary starts it, in the traced token
        lead = st.prepare_lead_tokens
        if policy.start_off_loop(PROCESS.windows_in_process, PROCESS.cupti_start_ns, st.prepare_first_window):
            lead = max(lead, FIRST_WINDOW_LEAD_TOKENS)
        t0, cpu0 = time.perf_counter_ns(), time.thread_time()
        prep_ns = s.prepare_window() if lead > 0 else 0
        if prep_ns:
            self.startup_cpu_s += time.thread_time() - cpu0
            s.note_step("prepare", t0)
        if self.ev is not None:
            self.ev.add("prepare", prep_ns)
        self.open_after = self.tokens() + (lead if prep_ns else 0)
        s.finalize_off_loop = self._finalize_here()
        self._check_window_open()

    def _check_window_open(self) -> None:
        if self.open_after is not None and self.tokens() >= self.open_after:
            self.open_after = None
            self.session.want_window = True
            if self.ev is not None:
                self.ev.add("want_window")

    def _time_window(self, now: float) -> None:
        """A window by time, traced here (no token boundary will come to open or close it)."""
        s = self.session
        if foreign_profiler_active():
            s.skipped_windows += 1  # our finalize would end its CUPTI session too
            return
        old = s.pending_detach
        if old is not None:
            if getattr(old, "initialised", False) or getattr(old, "active", False):
                return  # an earlier attach's CUPTI still waits for a token boundary to be finalized
            s.pending_detach = None
        tr = s.tracer
        s.timed_window = True
        t0 = time.perf_counter_ns()
        try:
            tr.trace_for(policy.time_window_s(self.settings.time_window_s, self.recent_marks))
        except Exception as exc:
            s.errors.append(f"time window: {type(exc).__name__}: {exc}")
            s.tracer = None
            return
        finally:
            s.timed_window = False
            s.note_step("time_window", t0)
        self._collect(now, guard_tokens=0, clock="time")

    def _collect_token_window(self, now: float) -> None:
        s = self.session
        s.window_ready.clear()
        self._collect(now, guard_tokens=s.guard, clock="tokens", finalize=s.finalize_off_loop)

    def _collect(self, now: float, guard_tokens: int, clock: str, finalize: bool = False) -> None:
        """The closed window's records, as a frame; with `finalize`, CUPTI is finalized here once they are read
        (the decode thread's closing boundary stopped tracing and flushed), unless the window saw CUDA-graph
        kernels: the decode thread's next boundary then makes it (policy.finalize_off_loop)."""
        s = self.session
        PROCESS.windows_in_process += 1  # counted here, in the agent thread, not at the decode thread's boundary
        t0 = time.perf_counter_ns()
        t_col = time.time_ns()
        try:
            with held.GilPolite():
                win = s.tracer.collect(self.window_id, guard_tokens, pause=held.Pacer(COLLECT_SLEEP_RATIO), clock=clock)
            # collect() set needs_guard from this window's records; once graphs were seen, always guard
            s.tracer.needs_guard = PROCESS.note_window_kernels(bool(s.tracer.needs_guard))
            PROCESS.cupti_start_ns = getattr(s.tracer, "start_ns", 0) or PROCESS.cupti_start_ns
            self.window_id += 1
            self.out += frames.pack(win)
        except Exception as exc:
            win = None
            s.errors.append(f"trace collect: {type(exc).__name__}: {exc}")
        if finalize and win is None:  # what the window held is not known: the decode thread's boundary finalizes
            s.pending_detach = s.tracer
        elif finalize:
            self._finalize_window(s.tracer)
        if self.ev is not None and win is not None:
            ln = getattr(s.tracer, "last_ns", {})
            self.ev.add("collect", time.time_ns() - t_col, len(win.token_bounds_ns.data) // 8,
                        *(ln.get(k, -1) for k in ("open", "flush", "finalize")))
        s.note_step("collect", t0)

    @staticmethod
    def _finalize_here() -> bool:
        """policy.finalize_off_loop with what this process has shown: graph kernels in a window, graph replays the
        adapter saw, and the engine's word (replays_graphs adds torch.compile's graph trees and graph pools)."""
        return policy.finalize_off_loop(PROCESS.graph_kernels_seen or PROCESS.graph_replays_seen,
                                        PROCESS.engine_cuda_graphs)

    def _finalize_window(self, tr) -> None:
        """CUPTI finalized here, for a token window the decode thread closed and flushed; once this process has
        shown CUDA-graph kernels (this window's included), the decode thread's next boundary makes it instead."""
        s = self.session
        if tr is None or not getattr(tr, "initialised", False):
            return
        if not self._finalize_here():  # graphs seen since the window was asked for (this window's kernels too)
            s.pending_detach = tr  # session.on_token: finalized at the next boundary, on the decode thread
            return
        cpu0 = time.thread_time()
        try:
            tr.detach()
        except Exception as exc:
            s.errors.append(f"trace finalize: {type(exc).__name__}: {exc}")
        self.finalize_cpu_s += time.thread_time() - cpu0

    # -- marks, stats ----------------------------------------------------------
    def _ship_steps(self) -> None:
        """The token marks, CUDA graph replays and step starts since the last ship."""
        self._ship_marks()
        self._ship_replays()
        self._ship_starts()

    def _ship_starts(self) -> None:
        """The step starts since the last ship (engine_adapter/step_starts.py), one row a step: its time and the
        steps before it. Sent while the loop marks no token and replays no graph; once it does, the log is let
        go and the decode thread stops filling it."""
        s = self.session
        log = s.start_log
        if log is None:
            return
        if self.shipped or s.replay_steps:
            s.start_log = None
            return
        s.start_log = []  # the decode thread appends to whichever list it finds
        n = len(log)
        if not n:
            return
        col = frames.Column.of
        done = self.starts_shipped
        steps = col([float(done + i) for i in range(n)], "<f8")
        self.out += frames.pack(frames.StepCounts(url="", server=frames.STEP_STARTS, t_ns=col(log), steps=steps,
                                              tokens=steps, busy=col([1.0] * n, "<f8"), ended=col([0.0] * n, "<f8")))
        self.starts_shipped += n
        ob = take_front(s.observer)  # the observer's steps, on the starts' clock: the tokens they overlapped
        if ob:
            self.out += frames.pack(frames.TokenMarks(t_ns=col([]), depth=col([]),
                                                  observer_ns=col([v for row in ob for v in row])))

    def _ship_replays(self) -> None:
        """The CUDA graph replays since the last ship as a step count: replays over the graphs a step replays
        (policy.replays_per_step). One row per ship with replays in it: the time of its first replay and the
        steps counted before it, an exact point on the count's curve (monitor/analysis/tokens.py reads a host
        that runs ahead in bursts by them). Sent while the loop marks no token."""
        s = self.session
        t0 = s.replay_t0
        log, s.replay_log = s.replay_log, []  # the decode thread appends to whichever list it finds
        n = len(log)
        PROCESS.graph_replays_seen = PROCESS.graph_replays_seen or n > 0
        if not n or self.shipped:
            return
        graphs = policy.replays_per_step(log)
        col = frames.Column.of
        self.out += frames.pack(frames.StepCounts(url="", server=frames.GRAPH_REPLAYS, t_ns=col([t0]),
                                              steps=col([s.replay_steps], "<f8"), tokens=col([s.replay_steps], "<f8"),
                                              busy=col([1.0], "<f8"), ended=col([0.0], "<f8")))
        s.replay_steps += n / graphs

    def _ship_marks(self) -> None:
        s = self.session
        flat = take_front(s.marks, MARK_FIELDS)
        if not flat:  # nothing to ship: what else is queued waits for the next marks
            return
        ft, ob = take_front(s.first_tokens), take_front(s.observer)
        t, d, b, c = (flat[k::MARK_FIELDS] for k in range(MARK_FIELDS))  # columns as strided slices, in C
        n = len(t)
        self.shipped += n
        PROCESS.marked_ns += t[-1] - (t[0] if self.last_shipped_ns is None else self.last_shipped_ns)
        PROCESS.attaches_marked += self.last_shipped_ns is None
        self.last_shipped_ns = t[-1]
        self.recent_marks.extend(t[-policy.BURST_MARKS:])
        extra = {}
        if c.count(None) != n:
            calls, ns, nb = zip(*[x or (0, 0, 0) for x in c])
            extra = dict(coll_calls=frames.Column.of(calls), coll_ns=frames.Column.of(ns), coll_bytes=frames.Column.of(nb))
        if b.count(None) != n:  # a batched engine's steps: the tokens each made (none noted: one)
            batch = [1 if x is None else x for x in b]
            extra["batch"] = frames.Column.of(batch)
            PROCESS.tokens_shipped += sum(batch)
        else:
            PROCESS.tokens_shipped += n
        if ft:
            extra["first_token_ns"] = frames.Column.of(ft)
        if ob:
            extra["observer_ns"] = frames.Column.of([v for row in ob for v in row])
        self.out += frames.pack(frames.TokenMarks(t_ns=frames.Column.of(t), depth=frames.Column.of(d), **extra))

    def _stats(self, now: float) -> None:
        s, st, status = self.session, self.settings, self.status
        if len(s.observer) > 1000:  # a loop that marks nothing ships none of them: keep the newest
            del s.observer[:-1000]
        waits = s.switches.per_s(s.decode_tid, now)
        if waits is not None:  # the decode thread's voluntary switches a second (held.SwitchCounter)
            status["decode_waits_per_s"] = round(waits, 1)
        if PROCESS.step_count_ns and s.start_log is not None:  # the step-start hook's cost a call, while it counts
            status["step_count_ns"] = round(PROCESS.step_count_ns, 1)
        # the agent thread's own CPU a second over the attach so far: its Python and the library's reading of the
        # records, not CUPTI's start-up or finalize (GIL-free calls, once a window at most: cupti_start_cpu_ms,
        # cupti_finalize_cpu_ms)
        wall = now - self.cpu_t0[0]
        if wall > 0:
            used = time.thread_time() - self.cpu_t0[1] - self.startup_cpu_s - self.finalize_cpu_s
            status["agent_cpu_ms_per_s"] = round(1e3 * max(used, 0.0) / wall, 1)
            status["agent_cpu_over_s"] = round(wall, 1)
        if self.startup_cpu_s:
            status["cupti_start_cpu_ms"] = round(1e3 * self.startup_cpu_s, 1)
        if self.finalize_cpu_s:
            status["cupti_finalize_cpu_ms"] = round(1e3 * self.finalize_cpu_s, 1)
        if s.skipped_windows > self.skipped_seen:
            self.skipped_seen = s.skipped_windows
            status.update(trace="paused", trace_reason="foreign_profiler")
        elif self.window_id > self.windows_seen and status.get("trace") == "paused":
            status.update(trace="armed", trace_reason="")
        self.windows_seen = self.window_id
        if s.tracer is None and status.get("trace") in ("armed", "paused"):
            status.update(trace="failed", trace_reason="error", trace_error=s.errors[-1] if s.errors else "")
        if s.tracer is not None:
            status.update(windows_in_process=PROCESS.windows_in_process, window_budget=int(st.window_budget),
                          window_budget_state=policy.budget_state(PROCESS.windows_in_process, st.window_budget))
        if self.hello is not None and PROCESS.model is not None and PROCESS.model is not self.model_sent:
            # an adapter learned the model at the engine's first step after the attach: a fresh hello carries it
            self.model_sent = PROCESS.model
            self.out += frames.pack(frames.replace(self.hello, model=PROCESS.model))
        self.out += frames.pack(frames.ProbeStatus(**status, windows=self.window_id, errors=len(s.errors),
                                               recent_errors=s.errors[-5:]))
