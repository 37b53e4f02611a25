"""benchmarks/cost.py on a tiny CPU engine: the cost benchmark's structure (the first attach's spans and the
interleaved pairs with their A/A control, on the loop's own clock), not its figures, which only a GPU gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers")


def test_the_cost_benchmark_reads_first_attach_pairs_and_aa_on_the_loops_own_clock(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cost.py"), str(tmp_path), "--engines", "manual",
                        "--pairs", "2", "--phase-s", "2.5", "--before-s", "2", "--after-s", "2", "--warm-s", "1",
                        "--tiny"], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stderr[-2000:]
    run = json.loads((tmp_path / "cost.json").read_text())["runs"][0]
    assert "error" not in run, run.get("error")
    first, cost = run["first"], run["cost"]
    assert first["tokens_before"] > 10 and first["tokens_after"] > 10 and first["slowest_over_median"] >= 1.0
    assert cost["n"] == 2 and len(cost["aa_pcts"]) == 2 and cost["aa_floor_pct"] is not None
    assert cost["agent_cpu_ms_per_s_median"] is not None
    attaches = [p["a"] for p in run["pairs"]] + [run["first_attach"]["attach"]]
    assert all(a["tokens"] and a["error"] == "" for a in attaches)
    assert "manual" in r.stdout.splitlines()[-1]  # the table's row
