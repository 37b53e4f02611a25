"""decodemon beside an engine: pip's own resolver, asked what it would install (`--dry-run --report`), never
installing anything. `pip install decodemon` in an engine's environment keeps its torch and every `nvidia-*`
package torch brought; the README's GPU line (decodemon's own environment) resolves on its own."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ("Could not find a version", "No matching distribution", "connection", "Connection", "Network")


def _resolve(tmp_path: Path, name: str, *reqs: str) -> dict[str, str]:
    """{package: version} pip would install for `reqs` into an empty environment."""
    report = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), *reqs], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        if any(w in r.stderr for w in OFFLINE) and "ResolutionImpossible" not in r.stderr:
            pytest.skip(f"no package index reachable here: {r.stderr.strip().splitlines()[-1]}")
        raise AssertionError(f"{' '.join(reqs)} does not resolve: {r.stderr.strip()[-600:]}")
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


def _torchs(pkgs: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in pkgs.items() if k in ("torch", "triton") or k.startswith("nvidia-")}


def test_decodemon_beside_torch_keeps_torch_and_its_nvidia_packages_and_its_gpu_parts_resolve_alone(tmp_path):
    asks = {"torch211": ["torch==2.11.0"], "torch211_dm": ["torch==2.11.0", str(ROOT)],
            "newest": ["torch"], "newest_dm": ["torch", str(ROOT)], "own": [f"{ROOT}[gpu]"]}
    with ThreadPoolExecutor(len(asks)) as pool:
        got = dict(zip(asks, pool.map(lambda kv: _resolve(tmp_path, *kv), [(k, *v) for k, v in asks.items()])))
    for alone, beside in (("torch211", "torch211_dm"), ("newest", "newest_dm")):
        assert got[alone]["torch"] == got[beside]["torch"]
        kept = {k: got[beside].get(k) for k in _torchs(got[alone])}
        assert kept == _torchs(got[alone]), (alone, _torchs(got[alone]), kept)  # nothing torch brought is moved
        assert "decodemon" in got[beside]
    assert got["torch211"]["torch"] == "2.11.0" and got["torch211"]["nvidia-cuda-cupti"].startswith("13.0")
    own = got["own"]
    assert "torch" not in own  # decodemon's own environment carries no engine
    assert own["nvidia-cuda-cupti"].startswith("13.4") and "cupti-python" in own


def test_every_package_of_the_tree_is_in_the_wheel():
    """A non-editable install carries only the packages pyproject names: one left out imports in the tree (and in an
    editable install) and fails in the wheel a user installs."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    named = set(cfg["packages"])
    for top in cfg["package-dir"].values():
        for init in (ROOT / top).rglob("__init__.py"):
            pkg = "decodemon." + ".".join(init.parent.relative_to(ROOT).parts)
            assert pkg in named, f"{pkg} is not in pyproject's [tool.setuptools] packages"
