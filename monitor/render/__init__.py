"""Rendering a `Snapshot`: JSON for scripts, Markdown for DIAGNOSIS.md, plain text for the terminal.

Pure: a snapshot in, a value or a string out; nothing here aggregates or decides.
"""

from __future__ import annotations

from decodemon.monitor.render.json import collectives_json, kernel_rows_json, summary_json
from decodemon.monitor.render.markdown import diagnosis_markdown
from decodemon.monitor.render.text import diagnose_text, observer_parts

__all__ = ["collectives_json", "diagnose_text", "diagnosis_markdown", "kernel_rows_json", "observer_parts",
           "summary_json"]
