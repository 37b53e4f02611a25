"""Per-window metrics: grid arithmetic, gap causes, names."""

from __future__ import annotations

import numpy as np
import pytest

from decodemon.monitor.metrics import (SmLimits, blocks_per_sm, demangle_head, short_kernel_name, token_stats,
                                       window_metrics)
from decodemon.probes import wire
from tests.conftest import REC


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
