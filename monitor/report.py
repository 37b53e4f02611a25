"""DIAGNOSIS.md and plain-text verdicts, re-exported from `decodemon.monitor.render`."""

from __future__ import annotations

from decodemon.monitor.render.markdown import diagnosis_markdown
from decodemon.monitor.render.text import diagnose_text

__all__ = ["diagnose_text", "diagnosis_markdown"]
