"""What a user's help lists: the demo engine's benchmark instruments stay out of its --help and keep working."""

from __future__ import annotations

import json
import subprocess
import sys

DEVELOPER_FLAGS = ("--times-file", "--cpu-clocks", "--profiler-dir")


def test_the_demo_engines_help_leaves_out_the_benchmarks_instruments():
    r = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "--tiny" in r.stdout, r.stderr
    assert not [f for f in DEVELOPER_FLAGS if f in r.stdout]


def test_the_demo_engine_still_writes_its_times_and_cpu_clocks(tmp_path):
    out = tmp_path / "times.json"
    r = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--device", "cpu",
                        "--tokens", "8", "--warmup", "2", "--no-marks", "--times-file", str(out), "--cpu-clocks"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    times = json.loads(out.read_text())
    assert {"end_unix_s", "ms", "thread_cpu_ms", "canary_us"} <= set(times), sorted(times)
    assert {len(v) for v in times.values() if isinstance(v, list)} == {8}  # each one per token
