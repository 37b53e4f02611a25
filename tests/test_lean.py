"""The monitor's light start (monitor/_lean.py): bytecode cached where site-packages is read-only, and numpy
imported with one BLAS thread without changing the environment a `decodemon run` loop inherits."""

import importlib
import os
import subprocess
import sys

from decodemon.monitor import _lean


def test_needs_prefix_only_when_the_source_would_compile_and_could_not_be_cached(tmp_path):
    src = tmp_path / "m_lean_a.py"
    src.write_text("X = 1\n")
    assert _lean.needs_prefix(str(src), writable=lambda p: False)
    assert not _lean.needs_prefix(str(src), writable=lambda p: True)
    cached = importlib.util.cache_from_source(str(src))
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    open(cached, "wb").close()
    assert not _lean.needs_prefix(str(src), writable=lambda p: False)  # already compiled: nothing to do


def test_bytecode_goes_to_the_users_cache_when_the_source_dir_is_read_only(tmp_path, own_dir, monkeypatch):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m_lean_b.py").write_text("X = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(own_dir / "cache"))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    real = _lean.needs_prefix
    monkeypatch.setattr(_lean, "needs_prefix", lambda origin: real(origin, writable=lambda p: True))
    assert _lean.bytecode_cache("m_lean_b") is None and sys.pycache_prefix is None  # writable: left alone
    monkeypatch.setattr(_lean, "needs_prefix", lambda origin: real(origin, writable=lambda p: False))
    prefix = _lean.bytecode_cache("m_lean_b")
    assert prefix == str(own_dir / "cache" / "decodemon" / "pycache") and sys.pycache_prefix == prefix
    import m_lean_b  # noqa: F401, PLC0415

    pycs = [p for p in (own_dir / "cache").rglob("*.pyc") if "m_lean_b" in p.name]
    assert len(pycs) == 1  # compiled once, kept under the prefix for the next start
    assert not (tmp_path / "src" / "__pycache__").exists()
    sys.modules.pop("m_lean_b", None)


def test_the_cli_leaves_the_blas_environment_as_it_found_it():
    code = "import os, decodemon.monitor.cli, numpy; print(os.environ.get('OPENBLAS_NUM_THREADS'))"
    env = {k: v for k, v in os.environ.items() if k not in _lean.BLAS_THREADS}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "None"  # set for numpy's import only: a `decodemon run` child inherits nothing
    out = subprocess.run([sys.executable, "-c", code], env={**env, "OPENBLAS_NUM_THREADS": "3"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"
