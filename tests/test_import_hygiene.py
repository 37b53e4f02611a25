"""Layering you can check: analysis and probes stay light, each in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEADLESS = ["decodemon.monitor.diagnosis", "decodemon.monitor.metrics", "decodemon.monitor.session",
            "decodemon.monitor.report", "decodemon.monitor.feed", "decodemon.monitor.cli", "decodemon.monitor.client"]
PROBES = ["decodemon.probes.agent", "decodemon.probes.wire", "decodemon.engine_adapter"]


def loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize("module", HEADLESS)
def test_analysis_and_cli_import_neither_textual_nor_torch_nor_cupti(module):
    mods = loaded_after(module)
    assert not {m for m in mods if m.split(".")[0] in ("textual", "torch", "cupti")}


@pytest.mark.parametrize("module", PROBES)
def test_probes_never_import_textual_or_the_analysis(module):
    mods = loaded_after(module)
    assert not {m for m in mods if m.split(".")[0] in ("textual", "torch", "cupti")}
    assert not {m for m in mods if m.startswith("decodemon.monitor")}


def test_monitor_uses_only_the_wire_from_probes():
    mods = loaded_after("decodemon.monitor.app")
    probes = {m for m in mods if m.startswith("decodemon.probes")}
    assert probes <= {"decodemon.probes", "decodemon.probes.wire"}, probes


def test_the_nvml_sidecar_starts_without_numpy():
    """The sidecar is a process started at every attach, and a process starting on another CPU slowed the eager
    decode thread on the H200 (scripts/h200_attached_cost.py, fourteenth session): it imports what it needs only."""
    mods = loaded_after("decodemon.probes.sidecar")
    assert "numpy" not in mods and "decodemon.probes.wire" in mods
