"""The app's widgets: one per module, each styled by the `.tcss` file beside it."""

from __future__ import annotations

from pathlib import Path


def tcss(module_file: str) -> str:
    """The stylesheet beside a widget's module (`kernels.py` → `kernels.tcss`), for its DEFAULT_CSS.

    Widgets have no CSS_PATH of their own (only apps and screens do); read as DEFAULT_CSS, the rules keep the
    low specificity of a widget's defaults, so `app.tcss` can still override them.
    """
    return Path(module_file).with_suffix(".tcss").read_text(encoding="utf-8")
