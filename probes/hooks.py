"""Attach and detach hooks: what an engine adapter patches in while a monitor watches, and takes out after.

The agent runs `attach()` on its own thread when a monitor connects, before it sends its hello (so model facts
an adapter reports travel in it), and `detach()` when the monitor leaves. The probes never import an adapter:
adapters register themselves (`decodemon.engine_adapter.auto`, loaded by the bootstrap).
"""

from __future__ import annotations

import sys
from typing import Callable

_hooks: list[tuple[str, Callable[[], str | None], Callable[[], None]]] = []
_active: list[str] = []


def register(name: str, on_attach: Callable[[], str | None], on_detach: Callable[[], None]) -> None:
    """Add an adapter: `on_attach` returns a short description of what it hooked, or None if it does not apply."""
    if all(n != name for n, _, _ in _hooks):
        _hooks.append((name, on_attach, on_detach))


def attach() -> list[str]:
    """Install every adapter that applies; returns what was hooked. An adapter that fails is skipped."""
    _active.clear()
    for name, on_attach, _ in _hooks:
        try:
            what = on_attach()
        except Exception as exc:  # an adapter never stops an attach
            print(f"decodemon: adapter {name} not installed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        if what:
            _active.append(what)
    return list(_active)


def detach() -> None:
    """Remove every adapter installed by `attach`."""
    for _name, _, on_detach in _hooks:
        try:
            on_detach()
        except Exception as exc:
            print(f"decodemon: adapter {_name} not removed cleanly: {type(exc).__name__}: {exc}", file=sys.stderr)
    _active.clear()


def active() -> list[str]:
    """What the adapters hooked at the last attach."""
    return list(_active)
