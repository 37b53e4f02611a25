"""The analysis, one question at a time: grid arithmetic, launches, gap causes, collectives, the timeline, names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from decodemon.monitor.analysis.kernels import SmLimits, blocks_per_sm, sm_limits
from decodemon.monitor.analysis.names import demangle_head, short_kernel_name
from decodemon.monitor.analysis.tokens import token_stats
from decodemon.monitor.analysis.window import window_metrics
from decodemon.probes import wire
from tests.conftest import DATA, REC


# the recordings of loops whose host marks tokens ahead of the GPU: transformers' static-cache generate() (marked
# by its adapter, and injected into plain python) and the compiled 8B loop that marks at enqueue
STATIC_GENERATE = ("h200_hf_generate_static", "h200_hf_static_plain")
HOST_AHEAD = STATIC_GENERATE + ("h200_compiled_llama8b_marks_", "h100_compiled_llama8b_marks_")
# llama.cpp's 8B with ggml's graphs, in the window that traced launch calls: the token's one graph launch ran 485
# kernels, all inside its marks; the guard token after it launched 609 one by one, which a count over the whole
# window ((485 + 609) / 2 = 547) took in. The calls made inside the token say which are its own.

def first_window(name):
    return next(f for _, f in wire.read_recording(REC[name]) if isinstance(f, wire.KernelWindow))


@pytest.mark.parametrize("threads,regs,smem,expect", [
    (128, 32, 0, 16),      # warps: 64 / 4 = 16 blocks
    (1024, 32, 0, 2),      # 32 warps per block
    (128, 255, 0, 2),      # registers: 255 -> 256/thread -> 32768 per block
    (256, 32, 100_000, 2),  # shared memory
    (32, 16, 0, 32),       # capped by max blocks per SM
])
def test_blocks_per_sm_on_hopper(threads, regs, smem, expect):
    assert blocks_per_sm(threads, regs, smem, SmLimits()) == expect


def test_demangled_short_names():
    assert demangle_head("_ZN2at6native18elementwise_kernelILi128E") == "at::native::elementwise_kernel"
    assert short_kernel_name("_ZN8cublasLt19splitKreduce_kernelILi32E") == "cublasLt::splitKreduce_kernel"
    assert short_kernel_name("nvjet_sm90_tst_8x64") == "nvjet_sm90_tst_8x64"


def test_eager_window_gaps_are_host_late():
    m = window_metrics(first_window("eager"), 132)
    g = m.gap_ms_per_token
    # most whitespace is the GPU waiting for launches the host issued after the previous kernel ended;
    # "other" holds the token's tail (copy-back, sampling) and kernels launched through the driver API
    assert g["host_late"] > 0.6 * sum(g.values())
    assert m.gpu_busy_pct < 25
    assert m.timeline is not None and len(m.timeline.gpu) == 1863 and len(m.timeline.cpu) > 900


def test_graph_window_separates_tracing_from_host_gaps():
    m = window_metrics(first_window("graph"), 132)
    assert m.graph_launches_per_token == 1 and m.kernel_launch_calls_per_token == 0
    assert m.gap_ms_per_token["host_late"] < 0.1
    assert m.tracing_head_ms > 0
    assert m.gpu_busy_pct > 80
    assert m.timeline.gpu[0][0] == 0  # drawn from the first kernel


def test_kernel_rows_cover_grid_against_sms():
    m = window_metrics(first_window("graph"), 132)
    by_name = {r.short_name: r for r in m.kernels}
    norm = [r for r in m.kernels if r.grid_blocks == 1]
    assert norm and all(r.grid_coverage_pct == pytest.approx(100 / 132) for r in norm)
    assert sum(r.share_pct for r in m.kernels) == pytest.approx(100, abs=0.5)
    assert all(0 < r.occupancy_pct <= 100 for r in m.kernels)
    assert len(by_name) > 10


def test_token_stats():
    t = [0, 10_000_000, 20_000_000, 31_000_000, 40_000_000]
    s = token_stats(t)
    assert s.tokens == 4 and s.ms_per_token == pytest.approx(10.0, abs=0.6)
    assert token_stats([1, 2]) is None


def test_ring_keeps_the_newest_rows_in_order_with_fixed_memory():
    from decodemon.monitor.feed import Ring

    r = Ring(cap=100, ncols=2)
    block = r._a
    n = 0
    for size in [1, 7, 50, 99, 100, 3, 250, 1, 64] * 20:  # wraps many times, some batches over capacity
        rows = np.vstack([np.arange(n, n + size), -np.arange(n, n + size)])
        r.extend(rows)
        n += size
        v = r.view()
        kept = min(n, 100)
        assert len(r) == kept and v.shape == (2, kept)
        assert (v[0] == np.arange(n - kept, n)).all() and (v[1] == -v[0]).all()
    assert r._a is block and r.seen == n  # never reallocated
    assert (r.since(0, n - 10)[0] == np.arange(n - 10, n)).all()


def test_snapshot_cost_does_not_grow_with_a_full_day_of_marks():
    import time as _time

    from decodemon.monitor.session import Session

    s = Session("bench")
    rx = 0
    for i in range(1000):  # 250 tokens per frame, 250k marks: more than the ring holds
        t = (np.arange(250, dtype=np.int64) + i * 250) * 4_000_000
        rx += 1_000_000_000
        s.add(rx, wire.TokenMarks(t_ns=wire.Column.of(t), depth=wire.Column.of(np.arange(250) % 4096)))
    assert len(s.feed.marks) == s.feed.max_marks and s.snapshot().tokens_total == 250_000
    t0 = _time.perf_counter()
    for _ in range(20):
        snap = s.snapshot()
    per = (_time.perf_counter() - t0) / 20
    assert abs(snap.tokens.ms_per_token - 4.0) < 1e-6
    assert per < 0.02, f"{per * 1e3:.1f} ms per snapshot"


# -- each analyzer's behaviour on every committed H200 recording -------------------------------------------------

def _all_windows():
    """Every window of every committed recording the session analyses, a window traced by time read per GPU step
    (token_clock)."""
    from decodemon.monitor.session import untimed_window
    from decodemon.monitor.token_clock import gpu_steps, reclocked
    from tests.conftest import BUNDLED, DATA

    out = []
    for path in sorted(DATA.glob("*.dmon")) + sorted(BUNDLED.glob("*.dmon")):
        if path.stem.startswith("h200_compiled_llama8b_enqueue"):
            # marked at enqueue with no kernel run inside their marks: the session reads them on the GPU's steps
            # only, and test_known_bytes_h200 holds those figures against torch.profiler's
            continue
        for _, f in wire.read_recording(path):
            if isinstance(f, wire.KernelWindow) and not untimed_window(f):  # the session leaves those out
                steps = gpu_steps(f) if f.clock == "time" else None
                out.append((path.stem, reclocked(f, steps) if steps else f))
    return out


@pytest.fixture(scope="module")
def windows():
    """(recording stem, raw window, its metrics on an H200) for every window of every committed recording."""
    return [(stem, f, window_metrics(f, 132)) for stem, f in _all_windows()]


def _inside(f):
    """Which kernel records ran wholly inside the window's analysed tokens, and those tokens' bounds (ns)."""
    b = f.token_bounds_ns.array()
    lo, hi = int(b[0]), int(b[f.tokens])
    s, e = f.kernels["start"].array(), f.kernels["end"].array()
    return (s >= lo) & (e <= hi) & (e >= s), lo, hi


def _analysed_kernels(f):
    """Start and end (ns) of the kernels that ran wholly inside the window's analysed tokens."""
    keep, lo, hi = _inside(f)
    return f.kernels["start"].array()[keep], f.kernels["end"].array()[keep], lo, hi


def _busy_ns(s, e):
    busy, run_s, run_e = 0, None, None
    for a, b in sorted(zip(s.tolist(), e.tolist())):
        if run_e is None or a > run_e:
            busy += (run_e - run_s) if run_e is not None else 0
            run_s, run_e = a, b
        else:
            run_e = max(run_e, b)
    return busy + ((run_e - run_s) if run_e is not None else 0)


def test_gap_classes_sum_to_the_idle_time_of_every_window(windows):
    assert len(windows) >= 60
    for stem, f, m in windows:
        if stem.startswith("h200_known_reduce"):
            continue  # one kernel a step: no gap between two kernels to classify (the idle is the host's sync)
        s, e, lo, hi = _analysed_kernels(f)
        if stem.startswith(HOST_AHEAD) and len(s) < 2:
            continue  # marked at enqueue: the window's kernels ran after its marks (the summary reads GPU steps)
        idle_ns = (hi - lo) - _busy_ns(s, e)
        assert sum(m.gap_ms_per_token.values()) * m.tokens * 1e6 == pytest.approx(idle_ns, rel=1e-9), stem
        # GPU busy is the kernels' union over the tokens, less a graphed window's tracing head
        head_ns = m.tracing_head_ms * 1e6
        assert m.gpu_busy_pct == pytest.approx(100 * (hi - lo - idle_ns) / (hi - lo - head_ns), rel=1e-9), stem


def test_a_graphed_windows_idle_head_is_the_tracers_and_an_eager_one_has_none(windows):
    for stem, _, m in windows:
        g = m.gap_ms_per_token
        if stem.startswith(("h200_hf_", "h200_compiled_", "h200_known_", "h100_compiled_", "h100_llama_cpp_server")):
            # transformers' loops and the compiled one: graphs whose host enqueues ahead or works between; the
            # calibration loops of known bytes: graphs of one reduction kernel a step, no tracer's head to see;
            # llama-server under `decodemon run`: windows by time over ggml's graphs, its name says no mode
            continue
        if "graph" in stem and "nographs" not in stem:
            assert m.graph_launches_per_token == 1.0 and g["host_late"] == 0, stem
            assert g["tracing"] == pytest.approx(m.tracing_head_ms) and m.tracing_head_ms > 0.5, stem
        else:
            assert m.graph_launches_per_token == 0 and g["tracing"] == 0 == m.tracing_head_ms, stem
            if m.apis_traced:
                assert g["host_late"] > g["other"] + g["short"], stem  # the eager token waits for its launches


@pytest.mark.parametrize("name", ["eager_api2", "graph_api2"])
def test_launches_counted_from_correlation_ids_equal_those_from_the_launch_calls(name):
    """Strip a full window of its API records: the kernels' correlation ids count the same launches, and the full
    window's runtime count is the traced runtime calls alone (the driver's, cuBLAS's, are not in it)."""
    import msgspec

    full = [f for _, f in wire.read_recording(REC[name]) if isinstance(f, wire.KernelWindow) and f.apis_traced]
    assert len(full) >= 3
    for f in full:
        a = window_metrics(f, 132)
        b = window_metrics(msgspec.structs.replace(f, apis={}, api_names={}, apis_traced=False), 132)
        assert b.graph_launches_per_token == a.graph_launches_per_token
        assert b.kernels_per_token == a.kernels_per_token
        traced = set(f.apis["correlation"].array().tolist())
        corr = f.kernels["correlation"].array()[_inside(f)[0]]
        untraced = len({c for c in corr.tolist() if c not in traced})
        if name == "graph_api2":  # every kernel of the token came from one traced cudaGraphLaunch
            assert a.graph_launches_per_token == 1.0 and a.kernel_launch_calls_per_token == 0 == b.kernel_launch_calls_per_token
            assert a.runtime_launch_calls_per_token == 0 and b.runtime_launch_calls_per_token is None
        else:  # the traced runtime calls, plus the kernels cuBLAS launched through the driver (untraced here)
            assert untraced > 0
            assert b.kernel_launch_calls_per_token == a.kernel_launch_calls_per_token
            assert b.kernel_launch_calls_per_token * b.tokens == a.runtime_launch_calls_per_token * a.tokens + untraced


def test_kernels_per_token_are_the_kernels_launched_in_the_traced_tokens(windows):
    """For a loop that syncs per token, the kernels that ran inside the analysed tokens; for one whose host runs
    ahead (transformers' static-cache generate()), every kernel launched in the traced tokens: torch.profiler's
    553 a token, where only 130-172 ran inside the marks."""
    for stem, f, m in windows:
        s, _, _, _ = _analysed_kernels(f)
        if stem.startswith(HOST_AHEAD):  # torch.profiler's 553 (generate) and 776 (the compiled 8B) a token
            assert m.kernels_per_token == (553.0 if stem in STATIC_GENERATE else 776.0), stem
            assert len(s) / m.tokens < m.kernels_per_token / 2, stem  # most ran outside the marks
        else:
            assert m.kernels_per_token == len(s) / m.tokens, stem


def test_a_kernel_that_ends_after_the_last_token_is_left_out_of_the_analysis_but_counted_as_launched():
    import msgspec

    f = first_window("eager")
    m = window_metrics(f, 132)
    b = f.token_bounds_ns.array()
    s, e = f.kernels["start"].array(), f.kernels["end"].array().copy()
    last = int(np.flatnonzero((s >= b[0]) & (e <= b[f.tokens]))[-1])
    e[last] = b[f.tokens] + 1_000
    cols = dict(f.kernels, end=wire.Column.of(e))
    cut = window_metrics(msgspec.structs.replace(f, kernels=cols), 132)
    assert cut.dropped_records == m.dropped_records + 1
    assert cut.kernel_sum_ms_per_token < m.kernel_sum_ms_per_token  # its time is not the token's
    assert cut.kernels_per_token == m.kernels_per_token  # it was launched in the traced tokens all the same


def test_grid_coverage_and_occupancy_of_the_12_block_kernel():
    f = first_window("narrow12_graph")
    top = window_metrics(f, 132).kernels[0]
    assert top.short_name == "_stream" and top.grid_blocks == 12
    assert top.grid_coverage_pct == pytest.approx(100 * 12 / 132)
    assert top.idle_sm_us_per_token == pytest.approx(top.us_per_token * 120 / 132)
    bps = blocks_per_sm(top.block_threads, top.regs, top.smem_bytes, sm_limits("9.0"))
    assert top.waves == pytest.approx(12 / (132 * bps))
    assert top.occupancy_pct == pytest.approx(100 * bps * -(-top.block_threads // 32) / 64)
    # on a GPU with fewer SMs than blocks the same grid covers them all, and no SM idles under it
    small = next(r for r in window_metrics(f, 8).kernels if r.name == top.name)
    assert small.grid_coverage_pct == 100 and small.idle_sm_us_per_token == 0


def test_sm_limits_follow_the_compute_capability():
    assert sm_limits("9.0") == SmLimits() == sm_limits("unknown")
    assert sm_limits("8.0").smem_bytes == 167936 and sm_limits("8.0").max_warps == 64
    assert sm_limits("8.6").max_warps == 48 and sm_limits("8.6").max_blocks == 16
    assert sm_limits("8.9").max_blocks == 24
    # a 1,024-thread block fits twice on Hopper, once where an SM holds 48 warps
    assert blocks_per_sm(1024, 32, 0, sm_limits("9.0")) == 2 and blocks_per_sm(1024, 32, 0, sm_limits("8.6")) == 1


def test_the_kernel_table_adds_up_to_the_kernel_time(windows):
    for stem, _, m in windows:
        rows = m.kernels
        assert [r.us_per_token for r in rows] == sorted((r.us_per_token for r in rows), reverse=True), stem
        assert sum(r.us_per_token for r in rows) / 1e3 == pytest.approx(m.kernel_sum_ms_per_token, rel=1e-9), stem
        if not stem.startswith(HOST_AHEAD):  # the table: what ran in the marks
            assert sum(r.calls_per_token for r in rows) == pytest.approx(m.kernels_per_token), stem
        for r in rows:
            assert r.calls_per_token * r.us_mean == pytest.approx(r.us_per_token, rel=1e-9), (stem, r.name)
        # the small grids' share of the kernels other than collectives (their grid is COMM's, not OCCUPANCY's)
        own = [r for r in rows if not r.is_collective]
        if not own:
            continue  # marked at enqueue: no kernel ran inside the window's marks
        small = sum(r.us_per_token for r in own if r.grid_coverage_pct < 25)
        assert m.small_grid_share_pct == pytest.approx(100 * small / sum(r.us_per_token for r in own)), stem


def test_collectives_are_the_nccl_kernels_of_the_tp2_ranks_and_none_elsewhere(windows):
    for stem, f, m in windows:
        names = f.kernels["name"].array()[_inside(f)[0]]
        nccl = sum("nccl" in f.names[i].lower() for i in names.tolist())
        assert m.collective_calls_per_token == nccl / m.tokens, stem
        assert any(r.is_collective for r in m.kernels) == (nccl > 0), stem
        if "tp2" not in stem:
            assert nccl == 0 and m.collective_ms_per_token == 0 == m.collective_gap_us == m.collective_us_unwaited
            continue
        assert m.collective_calls_per_token in (56, 64), stem  # two all-reduces per layer
        # the calls that did not wait for a peer price the collective; the rest of the kernels' time is waiting
        assert m.collective_us_unwaited > 0, stem
        waited = m.collective_us_per_call > 2 * m.collective_us_unwaited
        assert (m.collective_wait_ms_per_token > 1) if waited else (m.collective_wait_ms_per_token < 0.05), stem
        assert m.collective_in_step_us == pytest.approx(m.collective_kernel_us + m.collective_gap_us)
        assert m.collective_wait_ms_per_token >= 0
        if "graph" in stem:  # inside a graph the launch is the device's: a collective adds idle around itself
            assert 1 < m.collective_gap_us < 3, stem
        else:  # eager: the host launched late, which is LAUNCH's, not the collective's
            assert m.collective_gap_us == 0, stem


def test_the_timeline_draws_the_last_token_cpu_over_gpu(windows):
    for stem, f, m in windows:
        if stem.startswith(HOST_AHEAD):
            continue  # beside its graph, transformers' static-cache step makes ~30 eager launch calls (sampling)
        t = m.timeline
        b = f.token_bounds_ns.array()
        t0, t1 = int(b[f.tokens - 1]), int(b[f.tokens])
        s, _, _, _ = _analysed_kernels(f)
        in_last = s[(s >= t0) & (s < t1)]
        assert len(t.gpu) == len(in_last), stem
        if m.graph_launches_per_token:  # drawn from the first kernel, past the tracer's head
            assert t.gpu[:, 0].min() == 0 and t.token_ns == t1 - int(in_last.min()), stem
        else:
            assert t.token_ns == t1 - t0 and (t.gpu[:, 0] >= 0).all(), stem
        assert (t.gpu[:, 1] >= t.gpu[:, 0]).all() and (t.cpu[:, 1] >= t.cpu[:, 0]).all()
        if not m.apis_traced:
            assert len(t.cpu) == 0, stem
        elif m.graph_launches_per_token:
            assert len(t.cpu) <= 2, stem  # the token's cudaGraphLaunch (and the guard's, when it began inside)
        else:
            assert len(t.cpu) == m.runtime_launch_calls_per_token, stem  # the runtime calls it traced


def test_token_stats_drop_repeated_marks_and_order_their_percentiles():
    t = np.cumsum([0, 4, 4, 0, 4, 5, 4, 30, 4]) * 1_000_000
    s = token_stats(t)
    assert s.tokens == 7  # the zero-length interval is dropped
    assert s.ms_per_token == 4.0
    assert s.ms_per_token <= s.ms_per_token_p90 <= s.ms_per_token_p99 <= 30
    assert s.tokens_per_s == pytest.approx(1e3 / np.mean([4, 4, 4, 5, 4, 30, 4]))
    assert token_stats([0, 5, 5, 5]) is None  # one interval left


# -- the analyzers on hand-drawn records -------------------------------------------------------------------------

def _records(start, end, correlation, graph_id, apis_traced=False):
    from decodemon.monitor.analysis.records import TracedRecords

    i64 = lambda xs: np.asarray(xs, np.int64)  # noqa: E731
    n = len(start)
    return TracedRecords(
        window_id=0, tokens=1, bounds_ns=i64([0, 1_000_000]), whole_tokens=1, lo_ns=0, hi_ns=1_000_000,
        kernels={"start": i64(start), "end": i64(end), "correlation": i64(correlation), "graph_id": i64(graph_id),
                 "name": i64([0] * n)},
        names=("k",), dropped_kernels=0, apis={}, api_names=np.zeros(0, object), memcpys=0, apis_traced=apis_traced)


def test_kernels_only_launches_are_distinct_correlation_ids():
    from decodemon.monitor.analysis.launches import count_launches, launch_calls

    # one cudaGraphLaunch (#5) queued three kernels; two launch calls (#7, #8) one kernel each
    rec = _records([0, 10, 20, 30, 40], [5, 15, 25, 35, 45], [5, 5, 5, 7, 8], [1, 1, 1, 0, 0])
    n = count_launches(rec, launch_calls(rec))
    assert (n.kernels, n.graph_launches, n.kernel_launch_calls) == (5, 1, 2)


def test_gaps_are_classified_by_when_the_launch_began():
    """
        GPU  head [k0] 3µs [k1]  40µs  [k2]  40µs  [k3] 10µs [k4] tail
                      short   host_late     other     unsplit
    """
    from decodemon.monitor.analysis.gaps import IdleGaps, classify_gaps

    idle = IdleGaps(order=np.arange(5), gap_ns=np.array([3_000, 40_000, 40_000, 10_000, -1]),
                    launch_known=np.array([True, True, True, False, True]),
                    host_late=np.array([False, True, False, False, False]), head_ns=7_000, tail_ns=2_000)
    g = classify_gaps(idle, graph_launches=1, apis_traced=False)
    assert g.ns == {"host_late": 40_000, "short": 3_000, "other": 42_000, "tracing": 7_000, "unsplit": 10_000}
    assert g.tracing_head_ns == 7_000
    assert g.ms_per_token(2) == {k: v / 2e6 for k, v in g.ns.items()}
    # an eager window: the head is the host's; with its launch calls traced nothing is unsplit
    e = classify_gaps(idle, graph_launches=0, apis_traced=True)
    assert e.ns == {"host_late": 47_000, "short": 3_000, "other": 52_000, "tracing": 0} and e.tracing_head_ns == 0
    assert classify_gaps(None, 0, False).ns == {"host_late": 0, "short": 0, "other": 0, "tracing": 0, "unsplit": 0}


def test_idle_inside_one_graph_launch_is_known_to_be_the_devices():
    from decodemon.monitor.analysis.gaps import idle_gaps
    from decodemon.monitor.analysis.launches import launch_calls

    rec = _records([0, 10_000, 30_000, 60_000], [5_000, 20_000, 50_000, 70_000], [5, 5, 7, 7], [1, 1, 0, 0])
    idle = idle_gaps(rec, launch_calls(rec))
    assert idle.gap_ns.tolist() == [5_000, 10_000, 10_000]
    assert idle.launch_known.tolist() == [True, False, False]  # only k1 shares k0's graph launch
    assert not idle.host_late.any() and idle.head_ns == 0 and idle.tail_ns == 930_000
    one = idle_gaps(_records([0], [5], [1], [0]), launch_calls(rec))  # one kernel: no gap, its head and tail
    assert one.gap_ns.tolist() == [] and one.head_ns == 0 and one.tail_ns == 999_995
    assert idle_gaps(_records([], [], [], []), launch_calls(rec)) is None


def test_a_collective_adds_the_idle_around_it_beyond_the_usual_gap():
    from decodemon.monitor.analysis.collectives import collective_gap_ns

    # kernels a, nccl, b, c: the usual gap is b->c's 100 ns; the collective adds 1,900 before and 1,400 after
    coll = np.array([False, True, False, False])
    gap = np.array([2_000, 1_500, 100])
    assert collective_gap_ns(gap, coll, np.ones(3, bool)) == 3_300
    # a gap whose launch the host made late is not the collective's
    assert collective_gap_ns(gap, coll, np.array([False, True, True])) == 1_400
    assert collective_gap_ns(gap, np.zeros(4, bool), np.ones(3, bool)) == 0.0


def test_busy_counts_overlapping_kernels_once():
    from decodemon.monitor.analysis.busy import busy_within, segments, union_ns

    s, e = np.array([0, 5, 20, 22]), np.array([10, 12, 30, 25])
    seg_s, seg_e = segments(s, e)
    assert seg_s.tolist() == [0, 20] and seg_e.tolist() == [12, 30]
    assert union_ns(s, e) == 22
    assert busy_within(s, e, np.array([0, 10, 12]), np.array([10, 20, 20])).tolist() == [100.0, 20.0, 0.0]


def test_a_token_of_one_kernel_has_its_head_and_tail_counted_as_idle():
    """The known-bytes reduce loop runs one kernel a token from a CUDA graph: its traced token's 5 ms is the
    graph launch's instrumenting (the head, the tracer's), the kernel and the tail, and they add up to it."""
    from tests.conftest import cli

    j = json.loads(cli("replay", DATA / "h200_known_reduce1.5_marks.dmon", "--json").stdout)
    assert j["kernels_per_token"] == 1 and j["graph_launches_per_token"] == 1
    g = j["gap_ms_per_token"]
    assert g["tracing"] > 4 and sum(g.values()) + j["kernel_busy_ms_per_token"] == pytest.approx(j["traced_token_ms"],
                                                                                              abs=2e-4)
    assert j["traced_token_busy_pct"] > 90  # the tracer's head left out, as in any graphed window
