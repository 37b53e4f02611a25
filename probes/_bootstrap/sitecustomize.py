"""Loaded by `decodemon run -- CMD` through PYTHONPATH: start the agent, then chain to any other sitecustomize."""

import importlib.util as _ilu
import os as _os
import sys as _sys

if _ilu.find_spec("decodemon") is None and _os.environ.get("DECODEMON_PKG_ROOT"):
    import types as _types  # installed for another interpreter: map the package by its folder, as an attach does

    _pkg = _types.ModuleType("decodemon")
    _pkg.__path__ = [_os.environ["DECODEMON_PKG_ROOT"]]
    _sys.modules["decodemon"] = _pkg
try:  # the engine adapters' attach hooks (they import no engine), registered before the agent can take an attach
    import decodemon.engine_adapter.auto  # noqa: F401
except Exception as _exc:
    print(f"decodemon: engine adapters not loaded: {_exc}", file=_sys.stderr)
try:
    from decodemon.probes.agent import start_from_env as _start

    _start()
except Exception as _exc:  # never stop the user's program from starting
    print(f"decodemon: agent not loaded: {_exc}", file=_sys.stderr)

_here = _os.path.dirname(_os.path.abspath(__file__))
_rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_spec = None
for _p in _rest:
    _cand = _os.path.join(_p or ".", "sitecustomize.py")
    if _os.path.isfile(_cand) and _os.path.dirname(_os.path.abspath(_cand)) != _here:
        _spec = _ilu.spec_from_file_location("_decodemon_chained_sitecustomize", _cand)
        break
if _spec is not None and _spec.loader is not None:
    try:
        _spec.loader.exec_module(_ilu.module_from_spec(_spec))
    except Exception:
        pass
