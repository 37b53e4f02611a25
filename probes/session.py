"""One attach's state shared by the decode thread (`on_token`) and the agent thread, and how it leaves CUPTI.

The decode thread only ever runs `on_token()` at its token boundaries: it notes the mark and, when the agent has
asked for a window, opens, marks and closes it there (a token boundary is a safe point for CUPTI). Everything
else happens on the agent thread.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from decodemon.probes import frames, held, hooks, policy
from decodemon.probes.facts import PROCESS


MARK_FIELDS = 4  # values a mark adds to Session.marks
_STEP_INDEX = {name: i for i, name in enumerate(frames.OBSERVER_STEPS)}


def take_front(q: list, stride: int = 1) -> list:
    """The items of `q` there now (a whole number of `stride`-item records), removed from it; what another thread
    adds meanwhile stays for next time (list operations, each atomic under the GIL, on a list never replaced)."""
    n = len(q) // stride * stride
    items = q[:n]
    del q[:n]
    return items


class Active:
    """The session the decode thread's marks go to (None while dormant), swapped under `lock`."""

    def __init__(self) -> None:
        self.session = None
        self.lock = threading.Lock()


ACTIVE = Active()


def foreign_profiler_active() -> bool:
    """Is torch.profiler (kineto, which owns CUPTI while it runs) recording in this process?

    On the H200 a window opened while torch.profiler ran left the profiler with 638 of 1,863 kernels per token,
    because the window's CUPTI detach ends every CUPTI client's session. So no window opens while it runs.
    Checked only when a window is due, never per token."""
    t = sys.modules.get("torch")
    if t is None:
        return False
    try:
        return bool(t.autograd._profiler_enabled())
    except Exception:
        return False


_CUDA = []


def device_synchronize() -> None:
    """Wait, on this thread, for the work enqueued on its CUDA context (the driver's cuCtxSynchronize, through
    ctypes: the GIL is given up for the wait); nothing where there is no driver or no context."""
    if not _CUDA:
        try:
            import ctypes  # noqa: PLC0415

            _CUDA.append(ctypes.CDLL("libcuda.so.1").cuCtxSynchronize)
        except (OSError, AttributeError):
            _CUDA.append(None)
    if _CUDA[0] is not None:
        _CUDA[0]()


def guard_for_window(tracer_needs_guard: bool) -> bool:
    """policy.guard_for_window with what this process knows (decode thread, only when a window opens)."""
    return policy.guard_for_window(tracer_needs_guard, PROCESS.graph_kernels_seen, PROCESS.engine_cuda_graphs)


class Session:
    """State shared by the decode thread (on_token) and the agent thread while attached."""

    def __init__(self, settings: frames.Attach, tracer) -> None:
        self.settings = settings
        self.started = time.monotonic()
        # the marks not yet shipped, MARK_FIELDS values each, flat: perf_counter ns, depth, a batched engine's
        # tokens in the step or None, (calls, ns, bytes) of the collectives since the last mark or None. The
        # decode thread extends it by a whole mark at once (one C call under the GIL); the agent takes whole marks
        # from the front (take_front): the list is never swapped under a thread about to add to it, so no mark is
        # lost and no column goes out of line, and its columns are strided slices (no per-mark Python)
        self.marks: list = []
        self.first_tokens: list[int] = []  # a batched engine's requests' times to their first token (ns)
        # the observer's steps in this attach: (start, end, frames.OBSERVER_STEPS index), perf_counter ns
        self.observer: list[tuple[int, int, int]] = []
        self._window_t0 = 0  # when the decode thread began opening the window in progress
        self.pending_detach = None
        self.skipped_windows = 0
        self.coll = [0, 0, 0]
        self.tracer = tracer
        self.want_window = False  # set by agent, consumed by decode thread
        self.timed_window = False  # the agent thread has a window open by time: the decode thread leaves CUPTI be
        self.tokens_left = 0
        self.guard = 1  # guard tokens in the window being traced
        # the window's closing boundary stops tracing and flushes, and the agent thread finalizes once it has read
        # the records (set by the agent for a process that replays no CUDA graphs, policy.finalize_off_loop);
        # False: the finalize too at the boundary
        self.finalize_off_loop = False
        self.window_ready = threading.Event()  # set by decode thread when a window has closed (then wake())
        # the agent thread sleeps between its ticks (Attach.agent_tick_s); a closed window wakes it at once, so its
        # records are collected as soon as it closed. One non-blocking send per window on the decode thread.
        self.wake_r, self._wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.closing = False
        self.done = threading.Event()
        self.errors: list[str] = []
        self.windows_asked = 0  # windows this attach has asked for (Attach.api_every counts them)
        self.decode_tid: int | None = None  # the decode thread's native id, from its first token mark
        self.switches = held.SwitchCounter()  # its voluntary switches per second, read at the agent's stats tick
        # a named NVTX range as the token clock (engine_adapter/nvtx_ranges.py): its closes mark the tokens, and
        # the engine's own mark_token calls are ignored
        self.token_range = settings.token_range
        # CUDA graph replays (engine_adapter/cuda_graphs.py): the step count of a loop that marks no token. The
        # graphs replayed since the last ship, in order (the agent swaps in a new list to take them), and when
        # the first of them was
        self.replay_log: list[int] = []
        self.replay_t0 = 0
        self.replay_steps = 0.0
        # step starts (engine_adapter/step_starts.py): the time of each, the step count of an eager loop that marks
        # no token, swapped out at each ship like the replays; None once the loop marks tokens or replays graphs
        self.start_log: list[int] | None = []

    def note_step(self, step: str, t0_ns: int) -> None:
        """One of the observer's steps (frames.OBSERVER_STEPS) ran from `t0_ns` until now (perf_counter ns)."""
        self.observer.append((t0_ns, time.perf_counter_ns(), _STEP_INDEX[step]))

    @property
    def marks_queued(self) -> int:
        """Marks noted and not yet shipped."""
        return len(self.marks) // MARK_FIELDS

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

    def prepare_window(self) -> int:
        """Agent thread: make CUPTI's start-up here (tracer.prepare), a few tokens before the window opens, when
        `Attach.prepare_lead_tokens` asks for it (by default the open makes it, in the traced token).
        Returns the ns it took (0: not made here, and open() on the decode thread will make it).

        On an H200 the eager decode thread lost ~5-9 ms in the token the start-up overlapped instead of 13-17 ms
        in the opening one. Only for windows without a guard token: made for graphed windows, 78 of 5,182 tokens
        of a 20 s attach ran over 1.1x the unobserved p99 (an initialised CUPTI makes untraced graphed tokens
        ~8-12% slower). Not while torch.profiler records (its CUPTI session would end with ours), nor while an
        earlier attach's tracer waits for the next boundary to finalize CUPTI (that finalize would undo this
        start-up). A prepare that fails leaves the start-up to open().

        A process whose last start-up ran past policy.START_OFF_LOOP_NS has every window prepared here, guarded
        or not: the compiled Llama-8B loop's re-start-ups took 660-740 ms on an H100, one token that long each.

        The process's first window is always prepared here (`Attach.prepare_first_window`): CUPTI's first start-up
        in a process loads libcupti and instruments the CUDA context, ~0.5 s on an H200, which at an opening
        boundary is one token half a second long."""
        tr, ns = self.tracer, 0
        prepare = getattr(tr, "prepare", None)
        first = PROCESS.windows_in_process == 0 and not PROCESS.graph_kernels_seen and \
            self.settings.prepare_first_window
        costly = PROCESS.cupti_start_ns > policy.START_OFF_LOOP_NS  # its last start-up was a long token's worth
        if prepare is not None and self.pending_detach is None and not foreign_profiler_active() \
                and (first or costly or not guard_for_window(getattr(tr, "needs_guard", True))):
            try:
                ns = prepare()
            except Exception as exc:
                self.errors.append(f"trace prepare: {type(exc).__name__}: {exc}")
        return ns

    def range_clock_ns(self) -> int | None:
        """CUPTI's clock now while a window is open (a range that opens then can go on its timeline), else None."""
        tr = self.tracer
        if tr is None or not tr.active:
            return None
        try:
            return tr.timestamp()
        except Exception:
            return None

    def on_range(self, name: str, t0_ns: int | None, level: int) -> None:
        """An NVTX range closed on this thread (engine_adapter/nvtx_ranges.py): keep it for the open window, and
        mark a token if it is the token range."""
        tr = self.tracer
        if t0_ns is not None and tr is not None and tr.active:
            try:
                tr.note_range(name, t0_ns, tr.timestamp(), level)
            except Exception:
                pass
        if self.token_range and name == self.token_range:
            self.on_token(0)

    def on_token(self, depth: int, batch: int | None = None) -> None:
        """The decode thread's token boundary (a batched engine's step, `batch` tokens, from `mark_step`): note the
        mark, and open, mark or close a window asked for."""
        if self.closing:
            self.finish()
            return
        if self.pending_detach is not None:  # a stalled earlier session's tracer (see Closer), or a window's the
            # agent handed back (it showed graphs): cleared once finalized, so no start-up is made meanwhile
            t0 = time.perf_counter_ns()
            detach_tracer(self.pending_detach, self.errors)
            self.pending_detach = None
            self.note_step("window", t0)  # the decode thread's time, billed to the observer
        if self.decode_tid is None:
            self.decode_tid = threading.get_native_id()  # the thread that marks tokens: the decode thread
        coll = None
        if self.coll[0]:
            coll, self.coll = tuple(self.coll), [0, 0, 0]
        # a batched engine's step (a batch of one too) carries its tokens; mark_token's marks carry None
        self.marks.extend((time.perf_counter_ns(), depth, batch, coll))
        tr = self.tracer
        if tr is None or self.timed_window or self.window_ready.is_set():
            return
        try:
            if tr.active:
                self._in_window(tr)
            elif self.want_window and not self.closing:
                self._open_window(tr)
        except Exception as exc:  # never raise into the user's loop
            self.errors.append(f"trace: {type(exc).__name__}: {exc}")
            self.tracer = None
            try:
                tr.detach()
            except Exception:
                pass

    def _in_window(self, tr) -> None:
        self.tokens_left -= 1
        if self.tokens_left <= 0 or self.closing:
            if self.guard:
                # a process that replays graphs may enqueue ahead of the GPU: wait for the traced tokens' kernels
                # to run before tracing stops, or CUPTI hands them back without times (an H200 compiled loop
                # marking at enqueue: every record of a window at 0). The GPU stays busy meanwhile; the host only
                # gives up its lead once a window
                device_synchronize()
            # close and flush at one boundary, on this thread (see tracer.flush); the finalize too, unless the
            # agent thread makes it (a process that replays no graphs)
            tr.close()
            tr.flush()
            if not self.finalize_off_loop:
                tr.detach()
            self.note_step("window", self._window_t0)  # its tokens, traced
            self.window_ready.set()
            self.wake()
        else:
            tr.boundary()

    def _open_window(self, tr) -> None:
        self.want_window = False
        if foreign_profiler_active():
            self.skipped_windows += 1  # our detach would end its CUPTI session too
            return
        self.guard = 1 if guard_for_window(getattr(tr, "needs_guard", True)) else 0
        self.tokens_left = self.settings.window_tokens + self.guard  # see frames.KernelWindow
        self._window_t0 = time.perf_counter_ns()
        tr.open()

    def finish(self, at_boundary: bool = True) -> None:
        """Leave CUPTI as we found it and drop the session.

        At a token boundary on the decode thread (the normal way) an open window is closed, flushed and CUPTI
        detached, the same sequence as a window's normal end: a finalize with records still unflushed can fail
        and leave CUPTI attached, which costs an eager loop ~8 µs a launch. When the agent gives up waiting for a
        boundary (a stalled loop), it must not touch CUPTI from its thread: a `Closer` takes the session's place
        and the next boundary, whenever it comes, detaches."""
        tr, self.tracer = self.tracer, None
        with ACTIVE.lock:
            if ACTIVE.session is self:
                ACTIVE.session = Closer(tr, self.token_range) if (tr is not None and not at_boundary) else None
        self.done.set()
        if tr is not None and at_boundary:
            detach_tracer(tr, self.errors)


def detach_tracer(tr, errors: list | None = None) -> None:
    """Close, flush and finalize a tracer (decode thread, at a token boundary); errors noted, never raised."""
    steps = (["close"] if tr.active else []) + (["flush", "detach"] if getattr(tr, "initialised", False) else [])
    for step in steps:
        try:
            getattr(tr, step)()
        except Exception as exc:
            if errors is not None:
                errors.append(f"trace {step} at detach: {type(exc).__name__}: {exc}")


class Closer:
    """Stands in for a session the agent gave up on: the next token boundary detaches CUPTI, then it leaves."""

    closing = False

    def __init__(self, tracer, token_range: str = "") -> None:
        self.tracer = tracer
        # the stalled session's token clock: its range's next close is the boundary, as mark_token's would be
        self.token_range = token_range
        self.detach_hooks = False  # the agent left the engine adapters in for us (the range clock needs them)

    def range_clock_ns(self) -> None:
        return None

    def on_range(self, name: str, t0_ns, level: int) -> None:
        """An NVTX range that closed: the boundary if it is the token range."""
        if self.token_range and name == self.token_range:
            self.on_token(0)

    def on_token(self, depth: int, batch: int | None = None) -> None:
        """The boundary the stalled session waited for: finalize its tracer here, on the decode thread."""
        with ACTIVE.lock:
            if ACTIVE.session is self:
                ACTIVE.session = None
        tr, self.tracer = self.tracer, None
        if tr is not None:
            detach_tracer(tr)
        if self.detach_hooks:
            self.detach_hooks = False
            hooks.detach()
