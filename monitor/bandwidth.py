"""The device's copy bandwidth for the floor: measured outside the target, once per device and driver.

The monitor never touches CUDA itself: it asks `python -m decodemon.probes.copy_bandwidth` (its own process),
which answers from its cache or measures 1 GiB device-to-device copies. A recording keeps the figure in its
header's note, so a replay prices the floor as the live attach did.
"""

from __future__ import annotations

import json
import subprocess
import sys

TIMEOUT_S = 30.0


def measured_copy_gbs(gpu) -> float | None:
    """GB/s (read + write) for a `wire.GpuInfo`, or None when it cannot be measured here."""
    if gpu is None or not gpu.uuid:
        return None
    cmd = [sys.executable, "-m", "decodemon.probes.copy_bandwidth", "--device", str(gpu.index), "--uuid", gpu.uuid,
           "--driver", gpu.driver_version or "?", "--json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
        return float(json.loads(r.stdout)["copy_gbs"]) if r.returncode == 0 else None
    except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
        return None


def header_note(copy_gbs: float | None) -> str:
    """What a recording's header keeps of it."""
    return json.dumps({"copy_gbs": copy_gbs}) if copy_gbs else ""


def from_note(note: str) -> float | None:
    """The figure a recording's header kept, if any."""
    try:
        v = json.loads(note).get("copy_gbs") if note else None
        return float(v) if v else None
    except (ValueError, AttributeError, TypeError):
        return None
