"""When the agent traces: pure functions of settings, token counts and clocks (no thread, no socket, no CUPTI).

A traced window costs the decode thread one or two slow tokens and leaves ~90-280 KB in the process for good, so
windows are spaced by tokens and time and capped per process. A loop that marks tokens gets windows opened at its
token boundaries; a loop that marks none (or whose marks come in bursts because its host runs ahead of the GPU)
gets windows opened by the agent thread's clock (`window_clock`), unless it replays CUDA graphs
(`replays_graphs`): then it gets no window at all, only counters.
"""

from __future__ import annotations

from decodemon.probes import frames

# past Attach.window_budget windows in a process, one window every BUDGET_PERIOD_S
BUDGET_PERIOD_S = 60.0
BUDGET_CAP = 4  # and after BUDGET_CAP x window_budget windows in a process, no more (PM and the token clock go on)
# H200, libcupti 13.4.92: 86-96 KB per CUPTI init/finalize cycle, ~280 KB per window with PM re-armed after each
CUPTI_KB_PER_WINDOW = 280

# no token marked for this long (since the attach or the last mark): windows open by time
NO_MARKS_S = 2.0
# ... but at an attach's start a loop that marks tokens marks one within a token, so the first verdict need not
# wait 2 s: with no mark this long after the attach, the first window opens by time
FIRST_NO_MARKS_S = 0.5
# marks come in bursts when, over the last BURST_MARKS marks, the median interval is under BURST_RATIO x the mean:
# a host that enqueues a few hundred steps in ~140 ms and then waits for the GPU marks each of them at enqueue
# time, not where the GPU finishes the step
BURST_MARKS = 64
BURST_MIN_MARKS = 16
BURST_RATIO = 0.25


def first_window_at(st: frames.Attach, now: float) -> float:
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


def window_due(st: frames.Attach, now: float, next_window: float, since_s: float, tokens_since: int,
               windows_so_far: int = 0, slack_s: float = 0.0) -> bool:
    """Is it time to ask for the next traced window?

    A window costs the decode thread one or two slow tokens: the traced one (CUPTI's re-initialisation at its
    opening boundary, then CUPTI's cost per launch) and, in an eager loop, the next one (the closing boundary's
    flush and finalize, ~5.5 ms on an H200). Every `window_period_s` a window is due once `window_min_tokens`
    tokens have passed since the last one, so those slow tokens stay under 1% of all tokens (p99 untouched), but
    never later than `window_max_s` after it: the picture is never older. Past the budget (`budget_state`) one
    window every `BUDGET_PERIOD_S`, and none once it is spent.

    `slack_s`: how long before `window_max_s` the ask must be made for the window to open by then (cap_lead_s):
    the agent asks at its ticks and the window opens at the next token boundary after the ask.
    """
    if now < next_window:
        return False
    budget = budget_state(windows_so_far, st.window_budget)
    if budget == "spent":
        return False  # the process's memory has an absolute ceiling; PM sampling and the token clock go on
    if budget == "rationed":
        return since_s >= max(BUDGET_PERIOD_S, st.window_period_s)
    return tokens_since >= st.window_min_tokens or since_s + slack_s >= max(st.window_max_s, st.window_period_s)


def cap_lead_s(tick_s: float, since_s: float, tokens_since: int) -> float:
    """window_due's slack for `window_max_s`: a whole tick (the ask falls at the last tick before the cap, not the
    first after it), the loop's mean token since the last window (the window opens at the token boundary after the
    ask; at most 0.25 s counted) and 10 ms for a tick that wakes late (it waits for the GIL up to the decode
    thread's switch interval, 5 ms). With no lead, an eager loop's windows came a whole tick late (5.25 s apart at
    0.25 s ticks); with it they open 4.7-5.0 s apart in a 40 tokens/s eager loop."""
    token_s = min(0.25, since_s / tokens_since) if tokens_since > 0 else 0.25
    return tick_s + token_s + 0.01


def budget_state(windows_in_process: int, window_budget: int) -> str:
    """"open" until the process has had `window_budget` windows, then "rationed" (one every BUDGET_PERIOD_S),
    then "spent" after BUDGET_CAP times the budget (more than a day at the defaults): no more windows."""
    if windows_in_process >= BUDGET_CAP * window_budget:
        return "spent"
    if windows_in_process >= window_budget:
        return "rationed"
    return "open"


# A CUPTI start-up that took longer than this in the process (its last one, measured) is made on the agent thread,
# a few tokens before the window, for every later window too, graphed ones included: on an H100 the compiled
# Llama-8B loop's re-start-ups took 660-740 ms, each one token that long when the opening boundary made it. Below
# it the opening boundary makes it (an initialised CUPTI slows the graphed tokens between prepare and open 8-12%).
START_OFF_LOOP_NS = 50_000_000


def start_off_loop(windows_in_process: int, last_start_ns: int, prepare_first_window: bool = True) -> bool:
    """Is CUPTI's start-up for the next window made on the agent thread (off the decode thread)? For the process's
    first window (its start-up instruments the CUDA context), and whenever its last start-up ran past
    START_OFF_LOOP_NS."""
    return (windows_in_process == 0 and prepare_first_window) or last_start_ns > START_OFF_LOOP_NS


def finalize_off_loop(graphs_seen: bool, engine_cuda_graphs: bool | None, modules=None) -> bool:
    """Does the agent thread finalize a token window's CUPTI, once the decode thread's closing boundary has stopped
    tracing and flushed, and the agent has read the records? Only where the process replays no CUDA graphs as far
    as replays_graphs tells (`graphs_seen`: graph kernels in a window, or replays the cuda_graphs adapter saw);
    elsewhere it stays at the boundary, and a window that shows graph kernels hands its finalize back to the next
    one. On an H100 (driver 580.159.04) the finalize at the boundary took 1.8-2.3 ms of the decode thread's time,
    and once 47.6 ms, the slowest token of a first attach."""
    return not replays_graphs(graphs_seen, engine_cuda_graphs, modules)


def guard_for_window(tracer_needs_guard: bool, graph_kernels_seen: bool, engine_cuda_graphs: bool | None) -> bool:
    """Does the window about to open keep a guard token (traced after the analysed ones, then discarded)?

    Yes once the process has shown graph kernels or the engine says it replays graphs: on an H200 the graph
    kernels of the last token before CUPTI is disabled came back with bogus end times, and a one-token graphed
    window closed without its guard ended in cudaErrorLaunchFailure. No when the tracer's last window saw none, or,
    for an attach's first window, when the engine has said it never replays graphs."""
    if graph_kernels_seen or engine_cuda_graphs:
        return True
    return bool(tracer_needs_guard) and engine_cuda_graphs is None


def marks_bursty(t_ns) -> bool:
    """Do the newest token marks (perf_counter ns, oldest first) come in bursts? Over the last BURST_MARKS marks
    (at least BURST_MIN_MARKS), the median interval is under BURST_RATIO x the mean: most marks come close
    together, then a long wait (the host enqueued ahead, then waited for the GPU)."""
    t = list(t_ns)[-BURST_MARKS:]
    if len(t) < BURST_MIN_MARKS:
        return False
    gaps = sorted(b - a for a, b in zip(t, t[1:]))
    mean = (t[-1] - t[0]) / len(gaps)
    n = len(gaps)
    median = gaps[n // 2] if n % 2 else (gaps[n // 2 - 1] + gaps[n // 2]) / 2
    return mean > 0 and median < BURST_RATIO * mean


def time_window_s(longest_s: float, recent_marks_ns) -> float:
    """How long a window by time traces: `longest_s` for a loop that marks nothing; for one that marks tokens,
    about four of its tokens (at least 20 ms), enough whole GPU steps for the step's period at a few tokens'
    tracing cost."""
    t = list(recent_marks_ns)
    if len(t) < BURST_MIN_MARKS or t[-1] <= t[0]:
        return longest_s
    mean_s = (t[-1] - t[0]) / (len(t) - 1) / 1e9
    return min(longest_s, max(0.02, 4.0 * mean_s))


def replays_graphs(graph_kernels_seen: bool, engine_cuda_graphs: bool | None, modules=None) -> bool:
    """Does this process replay CUDA graphs, as far as the agent can tell without tracing? A window seen with graph
    kernels, the engine's word (report_cuda_graphs), torch.compile's CUDA-graph trees loaded, or a PyTorch graph
    pool in use. Such a process gets no window by time. On an H200 (driver 580.159.04): a finalize from any thread
    but the replaying one ended a bare CUDA-graph loop in 6 of 7 runs; the same window made on its main thread
    between two bytecodes with the GPU idle kept the bare loop and a compiled Llama-8B loop alive with PM off, but
    ended the graphed demo in 1 of 2 runs with PM off and in every run with PM on (commit 393d420 holds that code)."""
    import sys

    mods = sys.modules if modules is None else modules
    if engine_cuda_graphs is False and not graph_kernels_seen:
        return False  # the engine said it never replays graphs
    if graph_kernels_seen or engine_cuda_graphs or "torch._inductor.cudagraph_trees" in mods:
        return True
    return _pools_cached(mods)


_POOLS = {"seen": False, "checked_at": -1e18}
POOL_CHECK_S = 30.0  # the allocator's snapshot holds the GIL for a while in a big process: not at every window


def _pools_cached(mods) -> bool:
    """torch_graph_pools_in_use, sticky once true and asked again at most every POOL_CHECK_S."""
    import time

    now = time.monotonic()
    if not _POOLS["seen"] and now - _POOLS["checked_at"] >= POOL_CHECK_S:
        _POOLS["checked_at"] = now
        _POOLS["seen"] = torch_graph_pools_in_use(mods)
    return _POOLS["seen"]


def window_clock(now: float, attached_at: float, last_mark_at: float | None, recent_marks_ns) -> str | None:
    """Which clock the next window opens by: "tokens" (at the decode thread's token boundaries), "time" (by the
    agent thread: no mark for FIRST_NO_MARKS_S since the attach or NO_MARKS_S since the last mark, or marks in
    bursts), or None (no mark yet, and too soon after the attach to tell)."""
    if last_mark_at is None:
        return "time" if now - attached_at >= min(FIRST_NO_MARKS_S, NO_MARKS_S) else None
    if now - last_mark_at >= NO_MARKS_S or marks_bursty(recent_marks_ns):
        return "time"
    return "tokens"


def time_clock_reason(last_mark_at: float | None, now: float) -> str:
    """Why a window opens by time: "no_marks" (none for NO_MARKS_S), else "bursts" (the host runs ahead)."""
    return "no_marks" if last_mark_at is None or now - last_mark_at >= NO_MARKS_S else "bursts"


def torch_graph_pools_in_use(modules=None) -> bool:
    """Has this process captured a CUDA graph through PyTorch? A capture allocates from a private memory pool, and
    the caching allocator's snapshot names each segment's pool ((0, 0) is the default one). No torch, or CUDA not
    started: False. A snapshot that cannot be read while CUDA is running: True (a window by time could end the
    loop, a missing window costs only detail)."""
    import sys

    torch = (sys.modules if modules is None else modules).get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return False
        segments = cuda.memory_snapshot()
    except Exception:
        return True
    return any(tuple(seg.get("segment_pool_id", (0, 0))) != (0, 0) for seg in segments)


REPLAY_PERIODS = 8  # the most graphs one step is read to replay
REPLAY_MATCH = 0.8  # of replays equal to the replay one period later


def replays_per_step(graphs: list[int]) -> int:
    """How many replays make one step, from the order graphs were replayed in: the shortest period the sequence
    follows. A step that replays graphs A and B reads 2 (A B A B), a draft graph four times and a verify graph
    once 5; one graph per step, or one graph per batch-size bucket that changes every few steps (A A A B B B),
    reads 1. Nothing periodic: 1."""
    graphs = graphs[:512]  # plenty to find a period in, and bounded work on a fast loop's tick
    n = len(graphs)
    for p in range(1, min(REPLAY_PERIODS, n // 2) + 1):
        same = sum(graphs[i] == graphs[i + p] for i in range(n - p))
        if same >= REPLAY_MATCH * (n - p):
            return p
    return 1
