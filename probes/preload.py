"""cupti-python brought into a running process without stopping its decode thread (agent thread, first attach).

On an H200 `from cupti import cupti` in an eager loop's process took 263-400 ms and made tokens of 118-231 ms
against 4 ms: the import machinery loads each of the package's Cython modules (30 MB of them) while holding the
GIL, and a decode thread that needs the GIL waits for every load in full. `libc.dlopen` called through a ctypes
CDLL function gives the GIL up for the call (a spinning thread was never held off for more than 0.3 ms by a
160 ms load), and a library loaded once is only counted up by the next load of the same path. So the modules'
libraries are loaded here that way first, then the modules are imported with a sleep before each in proportion to
the CPU the imports took since the last one, so the decode thread runs between them.

On the H200 (an eager loop of 3.9 ms tokens, driver 580.159.04) the import paced at a ratio of 1 took 0.5 s, with
tokens of 8-38 ms while it ran, the longest under cupti.cupti's own module set-up, which no pause can split. What
cannot be made small is made elsewhere: `decodemon run` loads all of this while the program starts
(agent.start_from_env), and a first attach to such a loop made no token slower than its first traced window's
(2.2x the median).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

from decodemon.probes.held import Pacer

# seconds slept before a module per second of CPU the imports took since the last one: at 1.0 an H200 eager loop's
# tokens ran 2.1-2.7x their median for the 0.5 s the import took (the agent had half the GIL); at 4 it has a fifth
SLEEP_RATIO = 4.0
SLEEP_MIN_S = 0.001

_dlopen = None


def _libc_dlopen():
    """libc's dlopen as a ctypes CDLL function (which releases the GIL for the call), or None."""
    global _dlopen
    if _dlopen is None:
        try:
            f = ctypes.CDLL(None).dlopen
            f.argtypes, f.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_void_p
            _dlopen = f
        except (OSError, AttributeError):
            _dlopen = False
    return _dlopen or None


def load_without_gil(path: str | os.PathLike, mode: int = os.RTLD_NOW) -> bool:
    """dlopen `path` with the GIL given up; True if it is loaded now."""
    f = _libc_dlopen()
    return bool(f and f(os.fsencode(path), mode))


def cupti_package_libraries() -> list[Path]:
    """The shared libraries of the cupti package (its Cython modules), or [] without it."""
    try:
        spec = importlib.util.find_spec("cupti")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    out: list[Path] = []
    for root in spec.submodule_search_locations:
        out.extend(sorted(Path(root).rglob("*.so")))
    return out


def no_pause(_s: float) -> None:
    """The sleep of an unpaced preload (at a program's start, where its own imports would wait out the pauses)."""


def preload_cupti(sleep=time.sleep, imports: bool = True) -> dict[str, float]:
    """Load the cupti package's modules without holding the GIL, then (`imports`) import them paced. Returns
    {step: ms}; never raises (the real import then does the rest, as before).

    Without `imports` only the libraries are loaded: what a program's start can have beside it. An import there
    runs beside the program's own (cupti-python imports numpy, as torch does), and two threads importing one
    package at once can hand one of them the package half set up (the import system's deadlock escape): a CI run
    in which it did saw the CPU demo engine's `import torch` fail once under `decodemon run` (27 tries since did
    not reproduce it).

    libcupti and the PM libraries beside it are left to cupti-python to load, as it always has: loaded here first
    (libc's dlopen, RTLD_NOW | RTLD_GLOBAL, from cuda-pathfinder's own path), PM no longer armed in the target on
    the H200 (`ERROR_INVALID_PARAMETER` at the first attach, "could not load the nvperf* libraries" at the next),
    and libcupti's own load took 7 ms."""
    spent: dict[str, float] = {}
    t0 = time.perf_counter()
    try:
        for so in cupti_package_libraries():
            load_without_gil(so, os.RTLD_NOW)  # as the import system loads an extension module
    except Exception:  # an unreadable package folder: the import below loads them as usual
        pass
    spent["load"] = 1e3 * (time.perf_counter() - t0)
    if not imports:
        return spent
    t1 = time.perf_counter()
    try:
        with PacedImports(sleep):
            from cupti import cupti  # noqa: F401, PLC0415
    except Exception:  # the caller's own import says why
        pass
    spent["import"] = 1e3 * (time.perf_counter() - t1)
    return spent


class PacedImports:
    """While this thread imports, it sleeps before each module it is about to load, SLEEP_RATIO times the CPU it
    spent since the last one (held.Pacer): a thread that needs the GIL waits for one module's load at a time and
    has it between modules. A finder that finds nothing (it only delays). The import system asks finders while
    holding its global lock, so another thread's import waits out a pause too: paced only where a loop is already
    decoding (its decode thread imports nothing by then), not at a program's start."""

    def __init__(self, sleep=time.sleep) -> None:
        self.ident = threading.get_ident()
        self.pace = Pacer(SLEEP_RATIO, SLEEP_MIN_S, sleep)

    def find_spec(self, name, path=None, target=None):
        if threading.get_ident() == self.ident:
            self.pace()
        return None

    def __enter__(self):
        sys.meta_path.insert(0, self)
        return self

    def __exit__(self, *exc):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        return False
