"""Every recording's `replay --json` keeps its figures: the bundled two and every one under tests/data, figure by
figure, against tests/data/replay_figures.json. A change that moves a figure on purpose rewrites the file and
writes why beside it, under "reasons" (recording -> figure -> why):

    python tests/test_replay_figures.py --write "why the figures moved"

(--write keeps the reasons already there and adds the one given to every figure that moved.)"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILE = ROOT / "tests" / "data" / "replay_figures.json"
KEYS = ("verdict", "ceiling", "tokens", "ms_per_token", "kernels_per_token", "host_launch_calls_per_token",
        "kernel_sum_ms_per_token", "gpu_busy_pct", "sm_active_pct", "dram_gbs", "bytes_per_token_measured",
        "bytes_per_token_model", "bandwidth_gbs", "bandwidth_floor_ms", "windows", "tokens_per_step",
        "throughput_tokens_per_s")


def recordings() -> list[Path]:
    return sorted((ROOT / "monitor" / "data").glob("*.dmon")) + sorted((ROOT / "tests" / "data").glob("*.dmon"))


def figures(path: Path) -> dict:
    from decodemon.monitor.api import replay

    j = replay(path).as_json()
    out = {k: j.get(k) for k in KEYS}
    out["span"] = j["span"]["covers"]
    for name, c in sorted((j.get("candidates") or {}).items()):
        out[f"{name}.state"], out[f"{name}.value"], out[f"{name}.quantity"] = c["state"], c["value"], c.get("quantity")
    return out


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, (int, float)) or isinstance(b, float) and isinstance(a, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


PINNED = json.loads(FILE.read_text()) if FILE.exists() else {"figures": {}, "reasons": {}}


def test_every_recording_is_pinned():
    assert sorted(PINNED["figures"]) == sorted(p.name for p in recordings())


@pytest.mark.parametrize("path", recordings(), ids=lambda p: p.name)
def test_the_figures_of_each_recording_are_unchanged(path):
    want = PINNED["figures"].get(path.name)
    assert want is not None, f"{path.name} is not pinned: python tests/test_replay_figures.py --write 'why'"
    got = figures(path)
    moved = {k: (want.get(k), got.get(k)) for k in sorted(set(want) | set(got)) if not same(want.get(k), got.get(k))}
    assert not moved, f"{path.name}: figures moved (pinned, now): {moved}"


def test_every_reason_names_a_pinned_figure():
    for name, why in PINNED["reasons"].items():
        assert name in PINNED["figures"], name
        for key, text in why.items():
            assert key in PINNED["figures"][name] and text.strip(), (name, key)


def write(reason: str) -> int:
    old = PINNED
    new = {"figures": {}, "reasons": dict(old.get("reasons", {}))}
    for p in recordings():
        got = figures(p)
        new["figures"][p.name] = got
        was = old["figures"].get(p.name)
        if was is None:
            continue
        for k in got:
            if not same(was.get(k), got[k]):
                new["reasons"].setdefault(p.name, {})[k] = reason
    FILE.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--write" or not sys.argv[2].strip():
        print("usage: python tests/test_replay_figures.py --write 'why the figures moved'", file=sys.stderr)
        sys.exit(2)
    sys.exit(write(sys.argv[2]))
