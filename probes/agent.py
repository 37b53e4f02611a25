"""The probe agent: lives in the decode process, dormant until a monitor attaches.

Dormant means: one daemon thread blocked in `accept()` on a Unix socket in a
per-user 0700 directory, CUPTI not loaded, and `mark_token()` returning after
one global read. On attach the agent starts the counter sidecar, relays its
frames, ships token marks four times a second and, every `window_period_s`,
asks the decode thread to trace `window_tokens` whole tokens (with
`--prepare-lead N`, for an eager process it first makes CUPTI's start-up itself,
N tokens ahead). On detach, or
when the monitor vanishes, it disarms; the next token boundary finalizes
CUPTI if a window was open.

The decode thread only ever runs `mark_token()`. Everything else happens in
the agent thread, the sidecar process, or the monitor.
"""

from __future__ import annotations

import atexit
import os
import select
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

from decodemon.probes import held, wire
from decodemon.probes.sidecar import PM_METRICS
from decodemon.probes.wire import socket_dir, socket_path
from decodemon.probes.device import Unavailable, cuda_device_index, cupti_version, gpu_info

_session: "_Session | None" = None
_agent: "_Agent | None" = None
_model = None
_lock = threading.Lock()
_pm_armed_before = False
_windows_in_process = 0  # traced windows closed (CUPTI finalized) in this process, over every attach
# Measured on an H200 (docs/h200.md, scripts/h200_clocks.py): the first PM sampling session in a process
# left a graphed 0.6B loop at 4.08 instead of 4.67 ms/token for the rest of the process, attached or not,
# with SM/memory clocks unchanged and ~16 W more power; CUPTI activity windows alone did not do this.
# Its start is also the one burst of slow tokens an attach makes: ~30 graphed tokens of 5-18 ms within 0.3 s
# (scripts/h200_slow_tokens.py --plan first); later PM sessions of the process make none.
PM_FIRST_SESSION_NOTE = ("first PM session in this process: on an H200 it left a graphed loop ~13% faster for the "
                         "rest of the process (clocks unchanged, +16 W) after ~0.3 s of slow tokens; compare "
                         "unobserved speeds taken after it, or attach with --no-pm")


# Has a traced window of this process seen CUDA-graph kernels? Sticky: from then on every window of the
# process keeps its guard token, even one whose previous window happened to see none. Each attach still starts
# with a guard (a new WindowTracer): a process whose earlier windows were eager may be replaying graphs by now,
# and on the H200 a one-token graphed window closed without its guard ended in cudaErrorLaunchFailure
# (docs/h200/window_costs_run1_2026-11-29.json).
_graph_kernels_seen = False
# What the engine says about itself (engine_adapter.report_cuda_graphs): False = it never replays CUDA graphs, so
# an attach's first window can trace one token without a guard (one slow eager token less per attach); None = not
# said, and the first window keeps its guard.
_engine_cuda_graphs: bool | None = None


def set_cuda_graphs(replays: bool | None) -> None:
    """The engine says whether it replays CUDA graphs (None: not said). Read when a window opens."""
    global _engine_cuda_graphs
    _engine_cuda_graphs = None if replays is None else bool(replays)


def _collect_pause() -> None:
    """Between chunks of a window's records (agent thread): a 1 ms sleep lets the decode thread run Python, so the
    field reading and packing of an eager window's ~3,500 records is spread over a few tokens, not one."""
    time.sleep(0.001)


def _guard_for_window(tracer_needs_guard: bool) -> bool:
    """Does the window about to open keep a guard token? (decode thread, only when a window opens)

    Yes once the process has shown graph kernels or the engine says it replays graphs; no when the tracer's last
    window saw none, or, for an attach's first window, when the engine has said it never replays graphs."""
    if _graph_kernels_seen or _engine_cuda_graphs:
        return True
    return bool(tracer_needs_guard) and _engine_cuda_graphs is None


def _guard_after(window_saw_graph_kernels: bool) -> bool:
    """Guard for the next window, after one that did or did not see graph kernels (agent thread)."""
    global _graph_kernels_seen
    _graph_kernels_seen = _graph_kernels_seen or window_saw_graph_kernels
    return _graph_kernels_seen


# Every system call the agent thread makes gives up the GIL and takes it back, and a take-back from a decode thread
# running Python makes that thread wait: a voluntary switch. (On the development machine, a thread looping in
# Python beside the agent loop at 0.25 s ticks made ~21 a second with the old send's four calls and 14-19 with
# one; the counts depend on the scheduler, so tests/test_agent.py counts the calls instead.) So a tick makes as few
# calls as it can: one read of the sidecar's pipe, one send on a socket left non-blocking; and since the sixteenth
# session both keep the GIL (held.py), so the tick's only hand-back is its wake-up.
_READ_MAX = 1 << 20


def _read_available(fd: int) -> bytes | None:
    """What a non-blocking pipe holds now (b"" if nothing), or None once its writer has closed it. One read unless
    the pipe held more than _READ_MAX, made keeping the GIL (held.py)."""
    chunks = []
    while True:
        try:
            chunk = _PIPE_READER.read(fd)
        except BlockingIOError:
            return b"".join(chunks)
        except OSError:
            return None
        if not chunk:
            return b"".join(chunks) if chunks else None
        chunks.append(chunk)
        if len(chunk) < _READ_MAX:
            return b"".join(chunks)


_PIPE_READER = held.Reader(_READ_MAX)


def _send_all(conn: socket.socket, data, timeout_s: float) -> bool:
    """Send `data` on the non-blocking `conn`: one send() when the socket has room (the usual case: no switch to
    blocking mode and back, each of which is a call of its own), made keeping the GIL (held.py), else wait for
    room, `timeout_s` in all. False if the peer went away or never made room."""
    view = memoryview(data)
    deadline = None
    while view:
        try:
            n = held.send(conn, view)
        except BlockingIOError:
            n = 0
        except OSError:  # BrokenPipeError, ConnectionResetError, ...
            return False
        view = view[n:]
        if view:
            now = time.monotonic()
            deadline = deadline or now + timeout_s
            if now >= deadline:
                return False
            try:
                select.select([], [conn], [], deadline - now)
            except (OSError, ValueError):
                return False
    return True


class _SwitchCounter:
    """The decode thread's voluntary context switches per second, read by the agent at its stats tick.

    An eager decode thread that never blocks on its own (CUDA's sync spins) made 0 a second unobserved on the
    H200, 45-78 attached (fifteenth session) and 17-28 with the held calls (sixteenth): each is a wait, mostly for
    the GIL the agent thread took back.
    The figure goes to the probe state, so the bill on screen has it. One pread of /proc/self/task/TID/status per
    reading, made keeping the GIL (held.py), the file kept open."""

    def __init__(self) -> None:
        self._reader = held.Reader(4096)
        self.fd: int | None = None
        self.tid: int | None = None
        self.last: tuple[float, int] | None = None

    @staticmethod
    def parse(status: bytes) -> int | None:
        for line in status.splitlines():
            if line.startswith(b"voluntary_ctxt_switches:"):
                try:
                    return int(line.split(b":", 1)[1])
                except ValueError:
                    return None
        return None

    def per_s(self, tid: int | None, now: float) -> float | None:
        """Switches per second since the last reading of the same thread (None at the first, or unreadable)."""
        if tid is None:
            return None
        if tid != self.tid:
            self.close()
            try:
                self.fd = os.open(f"/proc/self/task/{tid}/status", os.O_RDONLY)
            except OSError:
                return None
            self.tid = tid
        try:
            n = self.parse(self._reader.pread(self.fd, 0))
        except OSError:
            n = None
        if n is None:
            return None
        prev, self.last = self.last, (now, n)
        if prev is None or now <= prev[0]:
            return None
        return (n - prev[1]) / (now - prev[0])

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd, self.tid, self.last = None, None, None


def _ensure_dir(d: Path) -> None:
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(f"{d} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)


def clean_stale_sockets(d: Path | None = None) -> list[int]:
    """Remove sockets whose process is gone; return their pids."""
    d = d or socket_dir()
    gone = []
    if not d.is_dir():
        return gone
    for p in d.glob("*.sock"):
        try:
            pid = int(p.stem)
        except ValueError:
            continue
        if not Path(f"/proc/{pid}").exists():
            try:
                p.unlink()
                gone.append(pid)
            except OSError:
                pass
    return gone


def set_model_facts(facts: "wire.ModelFacts") -> None:
    """Tell the agent what the engine is decoding (sent in every hello)."""
    global _model
    _model = facts


def note_collective(ns: int, nbytes: int) -> None:
    """Count one collective of the current token (host-side duration, payload). One global read when dormant."""
    s = _session
    if s is None:
        return
    s.coll[0] += 1
    s.coll[1] += ns
    s.coll[2] += nbytes


def mark_token(depth: int = 0) -> None:
    """The token clock: call once per decoded token, at the boundary. Costs one global read when dormant."""
    s = _session
    if s is None:
        return
    s.on_token(depth)


def _foreign_profiler_active() -> bool:
    """Is torch.profiler (kineto, which owns CUPTI while it runs) recording in this process?

    Measured on the H200: a decodemon window opened while torch.profiler ran left the profiler with 638 of
    1,863 kernels per token, because the window's CUPTI detach ends every CUPTI client's session. So no
    window opens while it runs. Checked only when a window is due, never per token.
    """
    t = sys.modules.get("torch")
    if t is None:
        return False
    try:
        return bool(t.autograd._profiler_enabled())
    except Exception:
        return False


def pm_frames(starts, ends, rows, extra) -> list:
    """One pump's samples as frames: the regular ones, then (apart) those evaluated for a traced window's span."""
    out = []
    for flag in (False, True):
        idx = [i for i, e in enumerate(extra) if bool(e) == flag]
        if idx:
            out.append(wire.PmSamples(metrics=list(PM_METRICS), start_ns=wire.Column.of([starts[i] for i in idx]),
                                      end_ns=wire.Column.of([ends[i] for i in idx]),
                                      values=wire.Column.of([rows[i] for i in idx], "<f8"), window_span=flag))
    return out


def first_window_at(st: wire.Attach, now: float) -> float:
    """When an attach's first window is due: half a second in (or a period, if shorter), or `first_window_s`
    (a group's monitor staggers its ranks with it)."""
    if st.first_window_s is None:
        return now + min(st.window_period_s, 0.5)
    return now + max(0.0, min(st.first_window_s, 3600.0))


def apis_in_window(i: int, every: int) -> bool:
    """Does an attach's window `i` (0 first) trace runtime-API records? (`Attach.api_every`)

    Every window with 1, none with 0; otherwise windows 1, 1+every, 1+2*every, ...: the first window of an
    attach traces kernels only, so an attach shorter than the window period pays only the cheap kind."""
    if every <= 1:
        return every == 1
    return i % every == 1


def window_due(st: wire.Attach, now: float, next_window: float, since_s: float, tokens_since: int,
               windows_so_far: int = 0, slack_s: float = 0.0) -> bool:
    """Is it time to ask for the next traced window?

    A window costs the decode thread one or two slow tokens: the traced one (CUPTI's re-initialisation at its
    opening boundary, then CUPTI's cost per launch) and, in an eager loop, the next one (the closing boundary's
    flush and finalize, ~5.5 ms on an H200). Every `window_period_s` a window is due once
    `window_min_tokens` tokens have passed since the last one, so those slow tokens stay under 1% of all
    tokens (p99 untouched) — but never later than `window_max_s` after it: the picture is never older.
    Once the process has had `window_budget` windows, the memory each window leaves in the process for good
    (~90-280 KB: CUPTI's finalize, the PM re-arm) is capped per hour: one window every `BUDGET_PERIOD_S`; after
    `BUDGET_CAP` times the budget (more than a day at the defaults) no more windows open in that process.

    `slack_s`: how long before `window_max_s` the ask must be made for the window to open by then (cap_lead_s).
    The agent asks at its ticks and the window opens at the next token boundary after the ask. With no lead a
    tick a hair early left the ask to the next one: on the H200 an eager loop's windows came every 5.25 s at
    0.25 s ticks (seventeenth session, runs 38-40: `window_every_s`); with half a tick, every 5.00-5.05 s (run 41:
    the token after the ask, ~25 ms, came on top).
    """
    if now < next_window:
        return False
    if windows_so_far >= wire.BUDGET_CAP * st.window_budget:
        return False  # the process's memory has an absolute ceiling; PM sampling and the token clock go on
    if windows_so_far >= st.window_budget:
        return since_s >= max(wire.BUDGET_PERIOD_S, st.window_period_s)
    return tokens_since >= st.window_min_tokens or since_s + slack_s >= max(st.window_max_s, st.window_period_s)


def cap_lead_s(tick_s: float, since_s: float, tokens_since: int) -> float:
    """window_due's slack for `window_max_s`: a whole tick (the ask falls at the last tick before the cap, not the
    first after it), the loop's mean token since the last window (the window opens at the token boundary after the
    ask; at most 0.25 s counted) and 10 ms for a tick that wakes late (it waits for the GIL up to the decode
    thread's switch interval, 5 ms). Windows then open 4.7-5.0 s apart in a 40 tokens/s eager loop at 0.25 s
    ticks (tests/test_agent.py), at most one window in twenty more than at 5.0 s exactly."""
    token_s = min(0.25, since_s / tokens_since) if tokens_since > 0 else 0.25
    return tick_s + token_s + 0.01


_gpu: dict = {}  # the device's facts (wire.GpuInfo) by CUDA index, read at the first attach that found it


def pm_lost(pm) -> str | None:
    """What PM sampling has lost in this session, in words for the probe panel, or None."""
    parts = []
    if pm.full_pumps:
        parts.append(f"{pm.full_pumps} pumps found more samples than their {pm.max_samples}-sample image holds and "
                     f"dropped the rest")
    if pm.overflows:
        parts.append(f"the hardware buffer overflowed at {pm.overflows} pumps (the newest samples are dropped)")
    if not parts:
        return None
    return "; ".join(parts) + (f" (the agent thread was held up, or sampling every {pm.interval_us} us outruns a "
                               f"pump every {getattr(pm, 'pump_s', 1.0):g} s: try a longer --pm-interval-us)")


class _Session:
    """State shared by the decode thread (on_token) and the agent thread while attached."""

    def __init__(self, settings: wire.Attach, tracer) -> None:
        self.settings = settings
        self.marks_t: list[int] = []
        self.marks_d: list[int] = []
        self.marks_c: list[tuple] = []  # (index into marks_t, calls, ns, bytes) for tokens with collectives
        self.pending_detach = None
        self.skipped_windows = 0
        self.coll = [0, 0, 0]
        self.tracer = tracer
        self.want_window = False  # set by agent, consumed by decode thread
        self.tokens_left = 0
        self.guard = 1  # guard tokens in the window being traced
        self.window_ready = threading.Event()  # set by decode thread when a window has closed (then wake())
        # the agent thread sleeps between its ticks (Attach.agent_tick_s); a closed window wakes it at once, so its
        # records are collected as soon as before. One non-blocking send per window on the decode thread.
        self.wake_r, self._wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.closing = False
        self.done = threading.Event()
        self.errors: list[str] = []
        self.pm = None
        self.pm_restarts = 0
        # traced windows' spans (CUPTI ns) whose PM samples the next pump evaluates in full: the monitor reads
        # the counters over exactly the traced tokens beside the window's kernel records (an accuracy check)
        self.pm_spans: list[tuple[int, int]] = []
        self.windows_asked = 0  # windows this attach has asked for (Attach.api_every counts them)
        self.decode_tid: int | None = None  # the decode thread's native id, from its first token mark
        self.switches = _SwitchCounter()  # its voluntary switches per second, read at the agent's stats tick

    def release(self) -> None:
        """Close the wake-up socket pair (a wake() after it does nothing) and the switch counter's file."""
        for s in (self.wake_r, self._wake_w):
            s.close()
        self.switches.close()

    def wake(self) -> None:
        """Wake the agent thread before its next tick (decode thread; never blocks, never raises)."""
        try:
            self._wake_w.send(b"w")
        except OSError:
            pass

    def window_in_progress(self) -> bool:
        """A window is prepared, asked for, open, or closed but not yet collected: PM pumps wait for its end, so
        that one pump evaluates all of the samples over its tokens (not every `stride`-th)."""
        tr = self.tracer
        return tr is not None and (self.want_window or bool(getattr(tr, "active", False))
                                   or bool(getattr(tr, "initialised", False)) or self.window_ready.is_set())

    def prepare_window(self) -> int:
        """Agent thread: make CUPTI's start-up here (tracer.prepare), a few tokens before the window opens, when
        `Attach.prepare_lead_tokens` asks for it (by default the open makes it, in the traced token).
        Returns the ns it took (0: not made here, and open() on the decode thread will make it).

        On an H200 (scripts/h200_open_costs.py, variant preinit: the start-up made on another thread four tokens
        before the window) the eager decode thread lost ~5 ms in the token it overlapped instead of 13-17 ms in the
        opening one, and the tokens after the window ran at their unobserved speed; in the tenth session's
        measurement the overlapped token lost 9.4 ms (scripts/h200_window_costs.py, dpre3). Not while torch.profiler
        records (its CUPTI session would end with ours); a prepare that fails leaves the start-up to open()."""
        tr, ns = self.tracer, 0
        prepare = getattr(tr, "prepare", None)
        # Only for windows without a guard token (processes that do not replay CUDA graphs). Made for graphed
        # windows too, the H200 bench's 20 s graphed attach had 78 of 5,182 tokens over 1.1x the unobserved p99
        # (ratio 1.112, against 1.001-1.005 with the start-up in open(); docs/benchmarks.md, seventh session).
        # Our reading, not measured token by token: the agent's 50 ms tick leaves CUPTI started but not tracing
        # for ~12 graphed tokens, and an initialised CUPTI makes untraced graphed tokens ~8-12% slower, past a
        # p99 only 2% above their median. In open() the start-up is one slow 4 ms token, which p99 does not see.
        # Nor while an earlier attach's tracer waits for the decode thread's next boundary to finalize CUPTI
        # (pending_detach): that finalize would undo this start-up before the window opens.
        if prepare is not None and self.pending_detach is None \
                and not _guard_for_window(getattr(tr, "needs_guard", True)) and not _foreign_profiler_active():
            try:
                ns = prepare()
            except Exception as exc:
                self.errors.append(f"trace prepare: {type(exc).__name__}: {exc}")
        return ns

    def on_token(self, depth: int) -> None:
        if self.closing:
            self.finish()
            return
        if self.pending_detach is not None:  # a stalled earlier session's tracer (see _Closer)
            old, self.pending_detach = self.pending_detach, None
            _detach_tracer(old, self.errors)
        if self.decode_tid is None:
            self.decode_tid = threading.get_native_id()  # the thread that marks tokens: the decode thread
        self.marks_t.append(time.perf_counter_ns())
        self.marks_d.append(depth)
        c = self.coll
        if c[0]:
            self.marks_c.append((len(self.marks_t) - 1, c[0], c[1], c[2]))
            self.coll = [0, 0, 0]
        tr = self.tracer
        if tr is None or self.window_ready.is_set():
            return
        try:
            if tr.active:
                self.tokens_left -= 1
                if self.tokens_left <= 0 or self.closing:
                    # close, flush and detach at one boundary, all on this thread (see tracer.flush)
                    tr.close()
                    tr.flush()
                    tr.detach()
                    self.window_ready.set()
                    self.wake()
                else:
                    tr.boundary()
            elif self.want_window and not self.closing:
                self.want_window = False
                if _foreign_profiler_active():
                    self.skipped_windows += 1  # our detach would end its CUPTI session too
                    return
                self.guard = 1 if _guard_for_window(getattr(tr, "needs_guard", True)) else 0
                self.tokens_left = self.settings.window_tokens + self.guard  # see wire.KernelWindow
                tr.open()
        except Exception as exc:  # never raise into the user's loop
            self.errors.append(f"trace: {type(exc).__name__}: {exc}")
            self.tracer = None
            try:
                tr.detach()
            except Exception:
                pass

    def finish(self, at_boundary: bool = True) -> None:
        """Leave CUPTI as we found it and drop the session.

        At a token boundary on the decode thread (the normal way) an open window is closed, flushed and
        CUPTI detached, the same sequence as a window's normal end: a finalize with records still
        unflushed can fail and leave CUPTI attached, which costs an eager loop ~8 µs a launch. When the
        agent gives up waiting for a boundary (a stalled loop), it must not touch CUPTI from its thread:
        a `_Closer` takes the session's place and the next boundary, whenever it comes, detaches.
        """
        global _session
        tr, self.tracer = self.tracer, None
        with _lock:
            if _session is self:
                _session = _Closer(tr) if (tr is not None and not at_boundary) else None
        self.done.set()
        if tr is not None and at_boundary:
            _detach_tracer(tr, self.errors)


def _detach_tracer(tr, errors: list | None = None) -> None:
    """Close, flush and finalize a tracer (decode thread, at a token boundary); errors noted, never raised."""
    steps = (["close"] if tr.active else []) + (["flush", "detach"] if getattr(tr, "initialised", False) else [])
    for step in steps:
        try:
            getattr(tr, step)()
        except Exception as exc:
            if errors is not None:
                errors.append(f"trace {step} at detach: {type(exc).__name__}: {exc}")


class _Closer:
    """Stands in for a session the agent gave up on: the next token boundary detaches CUPTI, then it leaves."""

    closing = False

    def __init__(self, tracer) -> None:
        self.tracer = tracer

    def on_token(self, depth: int) -> None:
        global _session
        with _lock:
            if _session is self:
                _session = None
        tr, self.tracer = self.tracer, None
        if tr is not None:
            _detach_tracer(tr)


class _GilPolite:
    """Hand the GIL back quickly while the agent thread does a burst of Python work (imports, set-up, re-arm).

    Measured on the H200 (scripts/h200_slow_tokens.py, docs/h200/slow_tokens_before_gil_fix_2026-11-29.json):
    the first attach of a process made 33-40 graphed tokens 7-35 ms long (against 4.0), none of them near a window
    or a PM pump, and an eager one a 447 ms token: the agent thread importing cupti and arming CUPTI is Python
    work, and CPython lets a thread that runs Python keep the GIL for its whole switch interval (5 ms) while the
    decode thread waits to return from `.item()`. For the length of such a burst the interval is cut to 0.2 ms,
    then put back as it was. After (..._after_gil_fix_...): 27 graphed slow tokens, most of them the first PM
    session's own 0.3 s start (..._first_attach_...), and the eager first attach at p99 0.95x unobserved.
    """

    depth = 0
    saved = 0.005

    def __enter__(self):
        with _lock:
            if _GilPolite.depth == 0:
                _GilPolite.saved = sys.getswitchinterval()
                sys.setswitchinterval(min(_GilPolite.saved, 0.0002))
            _GilPolite.depth += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            _GilPolite.depth -= 1
            if _GilPolite.depth == 0:
                sys.setswitchinterval(_GilPolite.saved)
        return False


class _EventLog:
    """What the agent thread did and when (unix ns), for attributing slow tokens to it: a diagnostic, on only
    when DECODEMON_AGENT_EVENTS names a file prefix; each attach writes PREFIX.<unix s>.json when it ends."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.rows = prefix, []

    @classmethod
    def from_env(cls) -> "_EventLog | None":
        p = os.environ.get("DECODEMON_AGENT_EVENTS")
        return cls(p) if p else None

    def add(self, what: str, *vals: int) -> None:
        self.add_at(time.time_ns(), what, *vals)

    def add_at(self, t_ns: int, what: str, *vals: int) -> None:
        """An event that ended at t_ns (wall clock), e.g. a PM arm made before the log existed."""
        if len(self.rows) < 200_000:
            self.rows.append((t_ns, what, *vals))

    def write(self) -> None:
        import json

        try:
            with open(f"{self.prefix}.{int(time.time())}.json", "w") as fh:
                json.dump(self.rows, fh)
        except OSError:
            pass


class _Agent:
    def __init__(self) -> None:
        clean_stale_sockets()
        _ensure_dir(socket_dir())
        self.path = socket_path(os.getpid())
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.sock.listen(4)
        self.busy_with: int | None = None
        self.thread = threading.Thread(target=self._accept_loop, name="decodemon-agent", daemon=True)
        self.thread.start()
        atexit.register(self.shutdown)

    def shutdown(self) -> None:
        global _session
        s = _session
        _session = None
        if s is not None:
            s.closing = True
        try:
            self.sock.close()
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    def _accept_loop(self) -> None:
        held.name_this_thread("dm-agent")
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                peer_pid, peer_uid, _ = struct.unpack("3i", cred)
                if peer_uid != os.getuid():
                    conn.close()
                    continue
                if self.busy_with is not None:
                    # read the newcomer's attach first, so closing does not reset the connection under our answer
                    conn.settimeout(1.0)
                    try:
                        conn.recv(4096)
                    except OSError:
                        pass
                    conn.sendall(wire.pack(wire.Bye(
                        reason=f"busy: monitor pid {self.busy_with} is attached; one monitor at a time")))
                    conn.shutdown(socket.SHUT_WR)
                    conn.close()
                    continue
                self.busy_with = peer_pid
                threading.Thread(target=self._serve, args=(conn,), name="decodemon-session", daemon=True).start()
            except OSError:
                conn.close()

    def _hello(self, settings: dict) -> wire.Hello:
        gpu, why = None, ""
        try:
            # once per process and device: the device's facts do not change, and reading them (cuInit, the device
            # queries, pynvml's import and nvmlInit) is agent-thread work at every attach's start otherwise
            idx = cuda_device_index()
            gpu = _gpu.get(idx) or _gpu.setdefault(idx, gpu_info(idx))
        except Unavailable as exc:
            why = str(exc)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        return wire.Hello(
            wire_version=wire.WIRE_VERSION, pid=os.getpid(), argv=list(sys.argv),
            python=sys.version.split()[0], hostname=socket.gethostname(), gpu=gpu,
            gpu_unavailable=why, cupti_version=cupti_version(), model=_model, settings=settings,
        )

    def _serve(self, conn: socket.socket) -> None:
        res: dict = {"session": None, "sidecar": None}
        reason = "detached"
        held.name_this_thread("dm-session")  # the attach's thread: ticks, pumps, window collects
        try:
            conn.settimeout(5.0)
            reader = wire.StreamReader(max_frame=64 * 1024)
            msgs: list = []
            while not msgs:
                data = conn.recv(4096)
                if not data:
                    return
                msgs = reader.feed(data)
            first = wire.decode_control(msgs[0])
            if not isinstance(first, wire.Attach):
                return
            with _GilPolite():
                state = self._set_up(conn, first, res)
            conn.sendall(wire.pack(wire.Stats(state=state)))
            reason = self._loop(conn, reader, res["session"], res["sidecar"], state)
        except (OSError, wire.WireError) as exc:
            reason = f"connection lost ({type(exc).__name__})"
        finally:
            self._tear_down(conn, res["session"], res["sidecar"], reason)

    def _set_up(self, conn: socket.socket, settings: wire.Attach, res: dict) -> dict:
        """Hello, tracer, PM and sidecar for one attach, then arm the session; the probe state to show first."""
        global _session
        hello = self._hello({k: float(getattr(settings, k)) for k in
                             ("window_period_s", "window_tokens", "pm_interval_us", "nvml_hz")})
        conn.sendall(wire.pack(hello))
        held.ENABLED = settings.hold_gil  # before the loop's first call (an A/B run's attaches set it both ways)
        state: dict[str, str] = {"token_clock": "armed"}
        tracer = pm = None
        if hello.gpu is None:
            state["gpu"] = f"unavailable ({hello.gpu_unavailable})"
            state["trace"] = state["pm"] = state["nvml"] = "unavailable (no GPU)"
        else:
            state["gpu"] = "ok"
            if settings.trace:
                try:
                    from decodemon.probes.tracer import WindowTracer

                    tracer = WindowTracer()  # its first window keeps a guard token (see _graph_kernels_seen)
                    state["trace"] = (f"armed ({settings.window_tokens} tokens every "
                                      f"{settings.window_period_s:g} s)")
                except Exception as exc:
                    state["trace"] = f"unavailable ({type(exc).__name__}: {exc})"
            else:
                state["trace"] = "off"
            cmd = [sys.executable, "-m", "decodemon.probes.sidecar", "--device", str(cuda_device_index()),
                   "--pm-interval-us", str(settings.pm_interval_us), "--nvml-hz", str(settings.nvml_hz)]
            pm_mode = os.environ.get("DECODEMON_PM", "inproc")
            if not settings.pm:
                state["pm"] = "off"
            elif pm_mode == "inproc":
                pm = self._arm_pm(settings, state)
            elif pm_mode != "sidecar":
                state["pm"] = f"off (DECODEMON_PM={pm_mode})"
            if not settings.pm or pm_mode != "sidecar":
                cmd.append("--no-pm")
            env = {k: v for k, v in os.environ.items() if k != "DECODEMON_AGENT"}
            try:
                res["sidecar"] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                  stderr=subprocess.DEVNULL, close_fds=True, env=env)
            except OSError as exc:
                state["pm"] = state["nvml"] = f"unavailable (sidecar: {exc})"
        session = res["session"] = _Session(settings, tracer)
        session.pm = pm
        with _lock:
            prev, _session = _session, session
        if isinstance(prev, _Closer) and prev.tracer is not None:
            session.pending_detach, prev.tracer = prev.tracer, None
        return state

    def _tear_down(self, conn: socket.socket, session, sidecar, reason: str) -> None:
        if session is not None:
            # The decode thread disarms at its next boundary (a safe point for CUPTI);
            # if the loop is stalled or gone, the agent does it after 1 s.
            session.closing = True
            if not session.done.wait(1.0):
                session.finish(at_boundary=False)
        if session is not None and session.pm is not None:
            session.pm.close()
        if session is not None:
            session.release()
        if sidecar is not None:
            try:
                sidecar.stdin.close()
                sidecar.wait(timeout=3)
            except Exception:
                sidecar.kill()
        _send_all(conn, wire.pack(wire.Bye(reason=reason)), 1.0)  # the socket may be non-blocking by now
        conn.close()
        self.busy_with = None

    @staticmethod
    def _arm_pm(settings, state):
        try:
            from decodemon.probes.pm_inproc import PmSampler

            global _pm_armed_before
            pm = PmSampler(cuda_device_index(), settings.pm_interval_us, pump_s=settings.pm_pump_s)
            state["pm"] = f"armed (in process, {settings.pm_interval_us} us interval)"
            if not _pm_armed_before:
                _pm_armed_before = True
                state["pm_note"] = PM_FIRST_SESSION_NOTE
            return pm
        except PermissionError:
            state["pm"] = ("unavailable (no permission for GPU performance counters: run as root or set the nvidia "
                           "module option NVreg_RestrictProfilingToAdminUsers=0; traced windows still work)")
        except Exception as exc:
            state["pm"] = f"unavailable ({type(exc).__name__}: {exc})"
        return None

    def _pump_pm(self, session, state):
        """Decode and evaluate PM samples into frames; re-arm PM if a CUPTI finalize took the session down."""
        if session.pm is None:
            return None
        try:
            got = session.pm.samples(dense_spans=session.pm_spans)
            pm = session.pm
            if got is not None and len(got[1]):
                last = max(got[1])
                # covered by this pump (the sample over the window's end had completed), or never going to be
                session.pm_spans = [sp for sp in session.pm_spans if sp[1] > last][-8:]
            state["pm_stride"] = str(pm.stride)
            if getattr(pm, "pumps", 0) > 1:
                state["pm_cpu"] = (f"{1e3 * pm.cpu_later_s / (pm.pumps - 1):.2f} ms of agent CPU per pump outside "
                                   f"GIL-free libcupti calls, {1e3 * pm.image_s:.2f} of it resetting {getattr(pm, 'image_bytes', 0) / 2**20:.1f} "
                                   f"MB of the counter-data image, the part the last decode wrote ({pm.pumps - 1} pumps; "
                                   f"the first, with all the samples since the arm, {1e3 * pm.cpu_first_s:.1f} ms)"
                                   + (f"; {len(pm._held)} short calls held the GIL, given up "
                                      f"{pm.handbacks / pm.pumps:.1f}x per pump between them"
                                      if pm._held and held.ENABLED else ""))
            lost = pm_lost(pm)
            if lost:
                state["pm_lost"] = lost
            if got is not None:
                return pm_frames(*got)
        except Exception as exc:
            session.pm.close()
            session.pm = None
            try:
                with _GilPolite():
                    session.pm = self._arm_pm(session.settings, state)
                session.pm_restarts += 1
                state["pm"] = state["pm"] + f"; re-armed {session.pm_restarts}x after {type(exc).__name__}"
            except Exception:
                pass
        return None

    def _loop(self, conn, reader, session: _Session, sidecar, state) -> str:
        ev = _EventLog.from_env()
        try:
            return self._loop_inner(conn, reader, session, sidecar, state, ev)
        finally:
            if ev is not None:
                ev.write()

    def _loop_inner(self, conn, reader, session: _Session, sidecar, state, ev) -> str:
        global _windows_in_process
        st = session.settings
        sel = selectors.DefaultSelector()
        conn.setblocking(False)
        sel.register(conn, selectors.EVENT_READ, "monitor")
        sel.register(session.wake_r, selectors.EVENT_READ, "wake")
        side_fd = None
        if sidecar is not None:  # read at the ticks, not a wake-up of its own: its frames wait in the pipe
            side_fd = sidecar.stdout.fileno()
            os.set_blocking(side_fd, False)
        tick = min(st.agent_tick_s, 0.05) if st.prepare_lead_tokens > 0 else st.agent_tick_s
        next_tick = time.monotonic()
        slack = tick / 2  # what is due every k ticks is done at the k-th tick, however late the tick before it woke
        out = bytearray()
        t_start = time.monotonic()
        next_marks = t_start + 0.25 - slack
        next_window = first_window_at(st, t_start) - slack
        last_window, tokens_at_window = t_start, -10**9  # the first window does not wait for tokens
        shipped = 0  # token marks sent so far: with the ones still queued, the token count (no per-token counter)
        next_stats = t_start + 1.0 - slack
        cpu_prev = (t_start, time.thread_time())  # this thread's CPU, for the bill (agent_cpu_ms_per_s)
        next_pm = t_start + min(0.5, st.pm_pump_s) - slack  # the first pump half a second in, as before
        window_id = 0
        skipped_seen = windows_seen = 0
        open_after: int | None = None  # token count at which a prepared window is asked for
        while True:
            woken = False
            for key, _ in sel.select(timeout=max(0.0, next_tick - time.monotonic())):
                if key.data == "wake":
                    try:
                        session.wake_r.recv(4096)
                    except OSError:
                        pass
                    woken = True
                    continue
                data = conn.recv(65536)
                if not data:
                    return "monitor went away"
                for payload in reader.feed(data):
                    msg = wire.decode_control(payload)
                    if isinstance(msg, wire.Detach):
                        return "detached"
            now = time.monotonic()
            on_tick = now >= next_tick
            if not on_tick and not woken:
                continue  # the monitor's message, read; the rest waits for the tick
            if on_tick:
                next_tick = max(next_tick + tick, now + tick / 2)
            if on_tick and side_fd is not None:
                chunk = _read_available(side_fd)
                if chunk is None:
                    side_fd = None
                    state["pm"] = state.get("pm", "") if "unavailable" in state.get("pm", "") else "sidecar exited"
                else:
                    out += chunk  # already framed by the sidecar: relayed without decoding
            if session.tracer is not None and session.window_ready.is_set():
                session.window_ready.clear()
                _windows_in_process += 1  # counted here, in the agent thread, not at the decode thread's boundary
                try:
                    t_col = time.time_ns()
                    with _GilPolite():
                        win = session.tracer.collect(window_id, session.guard, pause=_collect_pause)
                    # collect() set needs_guard from this window's records; once graphs were seen, always guard
                    session.tracer.needs_guard = _guard_after(bool(session.tracer.needs_guard))
                    window_id += 1
                    span = win.analysed_span()
                    if span is not None:
                        session.pm_spans.append(span)
                    out += wire.pack(win)
                    if ev is not None:
                        ln = getattr(session.tracer, "last_ns", {})
                        ev.add("collect", time.time_ns() - t_col, len(win.token_bounds_ns.array()),
                               *(ln.get(k, -1) for k in ("open", "flush", "finalize")))
                except Exception as exc:
                    session.errors.append(f"trace collect: {type(exc).__name__}: {exc}")
                # a finalize may have taken PM down: pump (and re-arm) soon, once the sample over the window's
                # last token has completed (2 ms at the default interval)
                next_pm = now + max(0.01, 2e-6 * st.pm_interval_us)
            tokens_since = shipped + len(session.marks_t) - tokens_at_window
            if session.tracer is not None and not session.tracer.active \
                    and not session.window_ready.is_set() and not session.want_window and open_after is None \
                    and window_due(st, now, next_window, now - last_window, tokens_since, _windows_in_process,
                                   cap_lead_s(tick, now - last_window, tokens_since)):
                # with a prepare lead, CUPTI starts here, in this thread, and the window opens that many tokens
                # later; without one (the default) the opening boundary starts it, in the traced token
                lead = st.prepare_lead_tokens
                session.tracer.with_apis = apis_in_window(session.windows_asked, st.api_every)
                session.windows_asked += 1
                prep_ns = session.prepare_window() if lead > 0 else 0
                if ev is not None:
                    ev.add("prepare", prep_ns)
                open_after = shipped + len(session.marks_t) + (lead if prep_ns else 0)
                next_window = now + st.window_period_s - slack
                last_window, tokens_at_window = now, shipped + len(session.marks_t)
            if open_after is not None and shipped + len(session.marks_t) >= open_after:
                open_after = None
                session.want_window = True
                if ev is not None:
                    ev.add("want_window")
            # a pump waits for a window in progress to be collected, but not for more than half a second (a loop
            # that stops between a window's prepare and its open would otherwise stop PM with it)
            if now >= next_pm and (now >= next_pm + 0.5 or (open_after is None and not session.window_in_progress())):
                t_pump = time.time_ns()
                frames = self._pump_pm(session, state)
                if ev is not None and session.pm is not None:
                    pm = session.pm
                    if not getattr(pm, "logged", True):  # armed (or re-armed after a finalize) since the last pump
                        pm.logged = True
                        ev.add_at(pm.armed_ns + pm.arm_ns, "arm", pm.arm_ns, pm.arm_cpu_ns)
                    ev.add("pump", time.time_ns() - t_pump, int(pm.decode_s * 1e9), pm.stride,
                           int(getattr(pm, "image_s", 0.0) * 1e9), int(getattr(pm, "cpu_s", 0.0) * 1e9))
                for f in frames or ():
                    out += wire.pack(f)
                next_pm = now + st.pm_pump_s - slack
            if now >= next_marks:
                t, d, c = session.marks_t, session.marks_d, session.marks_c
                session.marks_t, session.marks_d, session.marks_c = [], [], []
                shipped += len(t)
                if t:
                    extra = {}
                    if c:
                        calls, ns, nb = [0] * len(t), [0] * len(t), [0] * len(t)
                        for i, n_, t_, b_ in c:
                            if i < len(t):
                                calls[i], ns[i], nb[i] = n_, t_, b_
                        extra = dict(coll_calls=wire.Column.of(calls), coll_ns=wire.Column.of(ns),
                                     coll_bytes=wire.Column.of(nb))
                    out += wire.pack(wire.TokenMarks(t_ns=wire.Column.of(t), depth=wire.Column.of(d[: len(t)]),
                                                     **extra))
                next_marks = now + 0.25 - slack
            if now >= next_stats:
                waits = session.switches.per_s(session.decode_tid, now)
                if waits is not None:  # the decode thread's voluntary switches a second (_SwitchCounter)
                    state["decode_waits_per_s"] = f"{waits:.1f}"
                cpu_now = (now, time.thread_time())  # the agent thread's own CPU (libcupti's included)
                if cpu_now[0] > cpu_prev[0]:
                    state["agent_cpu_ms_per_s"] = f"{1e3 * (cpu_now[1] - cpu_prev[1]) / (cpu_now[0] - cpu_prev[0]):.1f}"
                cpu_prev = cpu_now
                if session.skipped_windows > skipped_seen:
                    skipped_seen = session.skipped_windows
                    state["trace_paused"] = ("torch.profiler is recording in the target: no window opens while it "
                                             "runs (its CUPTI session would end with ours)")
                elif window_id > windows_seen:
                    state.pop("trace_paused", None)
                windows_seen = window_id
                if session.tracer is not None:
                    state["cupti_windows"] = (f"{_windows_in_process} in this process (they keep up to "
                                              f"~{_windows_in_process * wire.CUPTI_KB_PER_WINDOW / 1024:.0f} MB)")
                    if _windows_in_process >= wire.BUDGET_CAP * st.window_budget:
                        state["window_budget"] = (f"{_windows_in_process} windows in this process: no more traced "
                                                  "windows (their memory is capped); PM and the token clock go on")
                    elif _windows_in_process >= st.window_budget:
                        state["window_budget"] = (f"{st.window_budget} windows reached: one window every "
                                                  f"{wire.BUDGET_PERIOD_S:g} s from now on (memory ≤ ~"
                                                  f"{wire.CUPTI_KB_PER_WINDOW * 3600 / wire.BUDGET_PERIOD_S / 1024:.0f}"
                                                  f" MB/hour, none after {wire.BUDGET_CAP * st.window_budget} "
                                                  "windows)")
                if session.errors:
                    state["errors"] = str(len(session.errors))
                out += wire.pack(wire.Stats(state=dict(state), windows=window_id,
                                            errors=session.errors[-5:]))
                next_stats = now + 1.0 - slack
            if out:
                if ev is not None:
                    ev.add("send", len(out))
                if not _send_all(conn, out, 2.0):
                    return "monitor went away"
                out.clear()


def start() -> Path | None:
    """Start the agent (idempotent); return its socket path, or None if it could not start."""
    global _agent
    with _lock:
        if _agent is None:
            try:
                _agent = _Agent()
            except OSError as exc:
                print(f"decodemon: agent not started: {exc}", file=sys.stderr)
                return None
        return _agent.path


def start_from_env() -> None:
    """Start the agent if DECODEMON_AGENT=1 (set by `decodemon run`)."""
    if os.environ.get("DECODEMON_AGENT") == "1":
        start()
