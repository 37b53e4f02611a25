"""Shared by the device scripts: the header every result file carries, and one experiment run in a fresh Python
process whose JSON answer is read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def device_header(command: str) -> dict:
    """Date, GPU and driver (from nvidia-smi; "cpu" for a BENCH_CPU=1 dry run) and the command, for a result file."""
    q = ["cpu", "-"]
    if os.environ.get("BENCH_CPU") != "1":
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip().split(", ")
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": q[0], "driver": (q + ["?"])[1],
            "command": command, "cpus": cpu_topology()}


def start(a, script: str) -> tuple:
    """A device script's start: its output folder (`a.out`, made) and its result header (the command as run)."""
    from pathlib import Path

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    return out, device_header(f"python3 scripts/{script} " + " ".join(sys.argv[2:]))


def eager_model():
    """The demo model on the GPU as the device scripts decode it (Qwen3-0.6B shape, bf16, 4,096 positions), reset."""
    import torch

    from decodemon.engine_adapter.model import SHAPES, DecodeModel

    model = DecodeModel(SHAPES["qwen3-0.6b"], "cuda", torch.bfloat16, 4096)
    model.reset()
    return model


def cpu_topology() -> dict:
    """How many CPUs, and which of them share a core (SMT siblings, from sysfs; empty where it is not exposed)."""
    sib = set()
    for n in range(os.cpu_count() or 0):
        try:
            with open(f"/sys/devices/system/cpu/cpu{n}/topology/thread_siblings_list") as fh:
                sib.add(fh.read().strip())
        except OSError:
            pass
    return {"count": os.cpu_count(), "thread_siblings": sorted(sib)}


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
