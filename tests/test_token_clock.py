"""The GPU-side token clock read off real H200 kernel streams (windows that traced two whole tokens)."""

from __future__ import annotations

import numpy as np
import pytest

from decodemon.monitor.token_clock import gpu_steps, kernel_period, match_share, reclocked
from decodemon.probes import wire
from tests.conftest import REC


def windows(name):
    return [f for _, f in wire.read_recording(REC[name]) if isinstance(f, wire.KernelWindow)]


def ids_in_start_order(w):
    order = np.argsort(w.kernels["start"].array(), kind="stable")
    return w.kernels["name"].array()[order]


@pytest.mark.parametrize("name,per_token,clock", [("eager", 1863, "kernel period"), ("eager_pm", 1863, "kernel period"),
                                                   ("graph", 1864, "graph replays"),
                                                   ("llama8b_graph", 2256, "graph replays")])
def test_the_kernel_sequence_repeats_once_per_token(name, per_token, clock):
    for w in windows(name):
        assert w.tokens + w.guard_tokens == 2  # the traced token and its guard: two whole steps
        s = gpu_steps(w)
        assert s is not None and s.period_kernels == per_token and s.clock == clock
        assert s.steps == 1
        assert s.graph_launches_per_step == (1.0 if clock == "graph replays" else 0.0)


def test_a_layer_repeats_almost_as_well_as_the_step_but_the_step_wins():
    ids = ids_in_start_order(windows("eager")[0])
    assert 0.95 < match_share(ids, 66) < 0.99  # one of 28 layers: the head and tail of the step break it
    assert match_share(ids, 1863) == 1.0
    assert kernel_period(ids) == 1863


def test_the_guard_tokens_step_measures_on_the_gpu_what_the_host_clock_says():
    # in a graphed window the guard token ran at the loop's own pace (the traced token before it is stretched)
    for w in windows("graph"):
        s = gpu_steps(w)
        tb = w.token_bounds_ns.array()
        assert s.step_ms == pytest.approx((tb[2] - tb[1]) / 1e6, rel=0.05)


def test_a_window_reclocked_to_gpu_steps_keeps_its_kernels():
    w = windows("graph")[0]
    s = gpu_steps(w)
    r = reclocked(w, s)
    assert r.tokens == s.steps and r.guard_tokens == 0
    assert tuple(r.token_bounds_ns.array()) == s.bounds_ns
    assert len(r.kernels["start"].array()) == len(w.kernels["start"].array())


def test_nothing_repeats_nothing_is_claimed():
    assert kernel_period(np.arange(500)) is None
    assert kernel_period(np.array([1, 2, 3])) is None
