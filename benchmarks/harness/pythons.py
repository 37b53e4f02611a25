"""The two Pythons of a GPU run, as a user has them: the engine's environment and decodemon's own.

- ENGINE_PY: the engine's environment (torch, transformers, llama-cpp-python), with nothing of decodemon installed.
- DM_PY: decodemon's environment, installed by the README's GPU line; the benchmarks' own code runs in it.

device_setup.sh makes both. Unset (the CPU machine, the tests), both are this interpreter. A loop that marks its
tokens calls decodemon's mark_token, which is the optional `pip install decodemon` in an engine's environment. Such
a loop alone gets ENGINE_MARKS_PATH (decodemon with no dependencies, standard library only) on its PYTHONPATH, so
the engine environment's `pip freeze` stays as it was. TOOLS_PATH holds the wheels of the helper processes that
are neither engine nor decodemon (the reference PM reader, the GGUF writer)."""

from __future__ import annotations

import os
import sys

ENGINE_PY = os.environ.get("ENGINE_PY", sys.executable)
DM_PY = os.environ.get("DM_PY", sys.executable)
DM = [DM_PY, "-m", "decodemon.monitor.cli"]


def marks(argv: list[str]) -> bool:
    """Whether the loop calls decodemon's mark_token (decodemon's own demo engine always does)."""
    if "decodemon.engine_adapter.demo" in argv:
        return True
    if any(a.endswith("manual_decode.py") for a in argv):
        return "--no-marks" not in argv
    return "--marks" in argv


def engine_env(argv: list[str], base: dict | None = None) -> dict:
    """The environment an engine starts with: the caller's, with decodemon's marks path only where the loop marks."""
    env = dict(os.environ if base is None else base)
    path = os.environ.get("ENGINE_MARKS_PATH")
    if path and marks(argv):
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def tools_env(base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    if os.environ.get("TOOLS_PATH"):
        env["PYTHONPATH"] = os.environ["TOOLS_PATH"]
    return env
