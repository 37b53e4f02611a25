"""A light start for the monitor process, which shares its machine with the decode loop it watches.

Imported by the CLI before anything imports numpy. Most of a short `decodemon attach --json`'s CPU goes to its
first half second, and most of that to compiling numpy's modules from source: where site-packages is read-only
(a container image), no bytecode is ever cached beside them, so every start compiles them again. A process
starting on another CPU slows an eager decode thread while it runs, and a benchmark attaches every few seconds.

- bytecode_cache(): where numpy's bytecode is neither cached nor cachable beside its source, keep it (and every
  later import's) under the user's cache directory (`sys.pycache_prefix`, this process only), so only the first
  start compiles; never where another user could have put bytecode (probes/own_files.py), and nowhere else.
- quiet_blas(): import numpy with one BLAS thread (the monitor does no linear algebra), then put the environment
  back as it was, so a loop started by `decodemon run` inherits nothing from it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


def cache_dir() -> str:
    """The user's cache directory for decodemon's bytecode."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "decodemon", "pycache")


def needs_prefix(origin: str, writable=lambda p: os.access(p, os.W_OK)) -> bool:
    """Would importing the module at `origin` compile it from source, and fail to cache the result?"""
    cached = importlib.util.cache_from_source(origin)
    if os.path.exists(cached):
        return False
    pyc_dir = os.path.dirname(cached)
    return not writable(pyc_dir if os.path.isdir(pyc_dir) else os.path.dirname(origin))


def bytecode_cache(module: str = "numpy") -> str | None:
    """Set sys.pycache_prefix if `module`'s bytecode is neither cached nor cachable; return it (or None)."""
    if sys.pycache_prefix or sys.dont_write_bytecode or module in sys.modules:
        return None
    try:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin or not spec.origin.endswith(".py") or not needs_prefix(spec.origin):
            return None
    except (ValueError, ImportError, NotImplementedError):
        return None
    # the prefix is imported from as much as written to: only a directory of this user's own, under directories
    # no one else can write (never a shared /tmp, where another user could make it first or link it elsewhere)
    from decodemon.probes import own_files

    try:
        fd, prefix = own_files.open_dir(cache_dir(), create=True, mine=True)
    except OSError:
        return None
    os.close(fd)
    if not os.access(prefix, os.W_OK):
        return None
    sys.pycache_prefix = prefix
    return prefix


def quiet_blas() -> None:
    """Import numpy with one BLAS thread, leaving os.environ as it was."""
    if "numpy" in sys.modules:
        return
    set_here = [k for k in BLAS_THREADS if k not in os.environ]
    for k in set_here:
        os.environ[k] = "1"
    try:
        import numpy  # noqa: F401, PLC0415
    except ImportError:
        pass
    finally:
        for k in set_here:
            os.environ.pop(k, None)


def start() -> None:
    """Both, in order: the bytecode cache must be set before numpy's first import."""
    bytecode_cache()
    quiet_blas()
