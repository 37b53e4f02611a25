"""The test of the tests: every test marked `timing` (it compares timings of real processes) run again beside two
busy CPU loops, as a busy CI machine runs them. Opt-in, since it runs them all a second time:

    DECODEMON_UNDER_LOAD_RUNS=10 python -m pytest tests/test_under_load.py -s

Each of the N runs (DECODEMON_UNDER_LOAD_RUNS) must pass whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = int(os.environ.get("DECODEMON_UNDER_LOAD_RUNS", "0") or 0)
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(RUNS < 1 or bool(os.environ.get("DECODEMON_UNDER_LOAD")),
                    reason="opt-in: DECODEMON_UNDER_LOAD_RUNS=N runs the timing tests N times beside two busy loops")
def test_every_timing_test_passes_beside_two_busy_cpu_loops():
    spinners = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
    try:
        for k in range(RUNS):
            r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "timing",
                                "-o", "addopts="], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                               env={**os.environ, "DECODEMON_UNDER_LOAD": "1"})
            tail = r.stdout.strip().splitlines()[-1:] if r.stdout.strip() else [r.stderr[-300:]]
            print(f"run {k + 1} of {RUNS} beside two busy loops: {tail[0]}")
            assert r.returncode == 0, r.stdout[-3000:]
            assert " passed" in tail[0] and "failed" not in tail[0], tail
    finally:
        for p in spinners:
            p.kill()
            p.wait()
