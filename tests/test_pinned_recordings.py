"""Every committed recording of the bundled demo and of the H200 keeps its verdict, kernels per token and ms per token.

The figures are pinned: any refactor of the probe, wire, feed,
analyzers or verdict must reproduce them exactly (ms/token to 1 µs).
"""

from __future__ import annotations

import pytest

from decodemon.monitor.api import replay
from tests.conftest import BUNDLED, DATA

# the figures of the last 5 s (the live screen's rolling span, `--last 5`): a summary's default, the whole recording,
# moves with what the recording holds before them, which no refactor should be held to
PINNED = [  # recording, rolling verdict, last window's ceiling, kernels/token, ms/token
    ("h100_eager.dmon", "launch", "launch", 1863.0, 23.5229),  # the bundled pair `decodemon demo` plays
    ("h100_graph.dmon", "occupancy", "occupancy", 1864.0, 3.7274),
    ("h200_eager.dmon", "launch", "launch", 1863.0, 20.4039),
    ("h200_eager_api2.dmon", "launch", "launch", 1863.0, 23.8085),
    ("h200_eager_pm.dmon", "launch", "launch", 1863.0, 40.8674),
    ("h200_graph.dmon", "occupancy", "occupancy", 1864.0, 3.9108),
    ("h200_graph_api2.dmon", "occupancy", "occupancy", 1864.0, 3.9443),
    ("h200_llama8b_graph.dmon", "bandwidth", "bandwidth", 2256.0, 7.6963),
    ("h200_narrow12_graph.dmon", "occupancy", "occupancy", 1865.0, 13.1472),
    ("h200_tp1_eager_rank0.dmon", "launch", "launch", 1863.0, 18.9907),
    ("h200_tp1_graph_llama8b_rank0.dmon", "bandwidth", "bandwidth", 2256.0, 7.653),
    ("h200_tp1_graph_rank0.dmon", "occupancy", "occupancy", 1864.0, 3.9243),
    ("h200_tp2_eager_rank0.dmon", "launch", "launch", 1891.0, 37.1835),
    ("h200_tp2_eager_rank1.dmon", "launch", "launch", 1891.0, 34.8717),
    ("h200_tp2_eager_samewindow_rank0.dmon", "launch", "launch", 1891.0, 51.6021),
    ("h200_tp2_eager_samewindow_rank1.dmon", "launch", "launch", 1891.0, 51.5392),
    ("h200_tp2_graph_llama8b_rank0.dmon", "occupancy", "occupancy", 2352.0, 6.661),
    ("h200_tp2_graph_llama8b_rank1.dmon", "occupancy", "occupancy", 2352.0, 6.6611),
    ("h200_tp2_graph_rank0.dmon", "occupancy", "occupancy", 1892.0, 4.1671),
    ("h200_tp2_graph_rank1.dmon", "occupancy", "occupancy", 1892.0, 4.1682),
]


@pytest.mark.parametrize("name,verdict,ceiling,launches,ms", PINNED, ids=[p[0] for p in PINNED])
def test_recording_figures_unchanged(name, verdict, ceiling, launches, ms):
    snap = replay((BUNDLED if name in ("h100_eager.dmon", "h100_graph.dmon") else DATA) / name, last_s=5)
    assert snap.verdict == verdict
    assert snap.ceiling == ceiling
    assert snap.kernels_per_token == pytest.approx(launches, abs=1e-6)
    assert snap.ms_per_token == pytest.approx(ms, abs=1e-3)
