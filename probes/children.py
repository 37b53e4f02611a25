"""The command lines of decodemon's own Python processes (the ptrace helper, the sidecar, the copy-bandwidth
measure, the `decodemon run` the demo starts, the benchmarks' ranks): they run decodemon's code and nothing else.

decodemon often runs as root on a machine others share. A plain `python -m decodemon...` puts the directory it
was started in first on sys.path and reads PYTHONPATH, PYTHONSTARTUP and the user's site-packages: another user's
`decodemon/__init__.py` in a 1777 directory ran as root when root ran `decodemon attach PID` there. Isolated mode
(-I) reads none of them, and the child starts in "/", so nothing is read relative to where root stood. The
environment is otherwise passed on (CUDA_VISIBLE_DEVICES, LD_LIBRARY_PATH, a rank's rendezvous): -I ignores the
PYTHON* variables only. Standard library only: the engines use it too.
"""

from __future__ import annotations

import os
import re
import sys

CWD = "/"
ISOLATED = ("-I",)
# a process that must read the PYTHONPATH `decodemon run` gives it (the agent's bootstrap), and nothing else: the
# user site and the start directory stay off sys.path (-P is 3.11's; on 3.10 "/" is the start directory)
AGENT_LOADED = ("-s", "-P") if sys.version_info >= (3, 11) else ("-s",)
# NVML's and CUDA's spellings: GPU-8-4-4-4-12 hex, MIG-<uuid>, and the older MIG-GPU-<uuid>/gi/ci
GPU_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Fa-f-]{1,64}|MIG-GPU-[0-9A-Fa-f-]{1,64}/[0-9]{1,4}/[0-9]{1,4}")
DRIVER_VERSION = re.compile(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,3}")


def python_argv(module: str, *args: str, flags: tuple[str, ...] = ISOLATED) -> list[str]:
    """`python -I -m module args...` with this interpreter; start it with cwd=CWD."""
    return [sys.executable, *flags, "-m", module, *args]


def same_flags() -> tuple[str, ...]:
    """The isolation this interpreter was started with, for a rank of the same command (-I, else -s/-P/-E)."""
    if sys.flags.isolated:
        return ISOLATED
    return tuple(f for f, on in (("-s", sys.flags.no_user_site), ("-P", getattr(sys.flags, "safe_path", False)),
                                 ("-E", sys.flags.ignore_environment)) if on)


def without_python_vars(env: dict | None = None) -> dict:
    """`env` (default: this process's) less PYTHON*: for a child whose own children must not read them either."""
    return {k: v for k, v in (os.environ if env is None else env).items() if not k.startswith("PYTHON")}


def gpu_uuid(text: str | None) -> str:
    """A GPU UUID fit for a child's command line ('' for anything else: a target's hello is its own text)."""
    return text if text and GPU_UUID.fullmatch(text) else ""


def driver_version(text: str | None) -> str:
    """A driver version fit for a child's command line ('?' for anything else)."""
    return text if text and DRIVER_VERSION.fullmatch(text) else "?"
