"""Shared by the device scripts: run one experiment in a fresh Python process and read its JSON answer."""

from __future__ import annotations

import json
import subprocess
import sys
import time


def run_child_json(code: str, args: list[str], timeout: float, **labels) -> dict:
    """`python -c code *args`; its last stdout line as JSON, or `labels` with why it failed. Adds wall_s.

    A child that dies (a CUDA error, a crash inside CUPTI) ends only its own experiment: the result says
    survived False, its exit code and the tail of its stderr.
    """
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    try:
        res = json.loads(line)
    except ValueError:
        res = {**labels, "survived": False, "rc": r.returncode, "stderr": r.stderr.strip().splitlines()[-4:]}
    res["wall_s"] = round(time.time() - t0, 1)
    return res
