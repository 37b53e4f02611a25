"""The house stays legible: no module of the product grows past MAX_LINES, and the trace library (export/) never
reaches back into the verbs (cli/), which import it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("monitor", "probes", "engine_adapter")
MAX_LINES = 450


def _python_files(rooms=ROOMS) -> list[Path]:
    return sorted(p for room in rooms for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts)


def too_long(paths, max_lines: int = MAX_LINES) -> dict[str, int]:
    """The files among `paths` over `max_lines` lines, with their line counts."""
    counts = {p: len(p.read_text(encoding="utf-8").splitlines()) for p in paths}
    return {str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p): n for p, n in counts.items() if n > max_lines}


def imported_modules(path: Path, package: str) -> set[str]:
    """Every module `path` imports, at any depth of the file (a lazy import inside a function too), as a dotted
    name; a relative import resolved against `package`, the module's own package."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def reaches_into(paths, package: str, forbidden: str) -> dict[str, list[str]]:
    """For each file among `paths` (all of `package`), the imports of `forbidden` or anything under it."""
    hits = {}
    for p in paths:
        bad = sorted(m for m in imported_modules(p, package) if m == forbidden or m.startswith(forbidden + "."))
        if bad:
            hits[p.name] = bad
    return hits


def test_the_product_has_python_files_to_measure():
    files = _python_files()
    assert len(files) > 50 and all(p.suffix == ".py" for p in files)  # C sources are not measured


def test_no_product_module_is_over_450_lines():
    assert too_long(_python_files()) == {}


def test_the_line_count_catches_a_long_module(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("x = 1\n" * (MAX_LINES + 1))
    short = tmp_path / "short.py"
    short.write_text("x = 1\n" * MAX_LINES)
    assert too_long([long, short]) == {str(long): MAX_LINES + 1}


def test_export_imports_nothing_from_cli():
    export = sorted((ROOT / "monitor" / "export").glob("*.py"))
    assert export, "monitor/export/ holds the trace library"
    assert reaches_into(export, "decodemon.monitor.export", "decodemon.monitor.cli") == {}


@pytest.mark.parametrize("line", [
    "from decodemon.monitor.cli._common import bounded",
    "from decodemon.monitor.cli import _common",
    "import decodemon.monitor.cli",
    "def f():\n    from decodemon.monitor.cli._common import say\n",
    "from ..cli import _common",
])
def test_the_import_check_catches_each_spelling_of_a_reach_into_cli(tmp_path, line):
    f = tmp_path / "trace.py"
    f.write_text(line + "\n")
    assert reaches_into([f], "decodemon.monitor.export", "decodemon.monitor.cli") == {"trace.py": [
        m for m in sorted(imported_modules(f, "decodemon.monitor.export")) if m.startswith("decodemon.monitor.cli")]}
    assert reaches_into([f], "decodemon.monitor.export", "decodemon.monitor.cli")


MAX_FUNCTION_LINES = 80


def long_functions(paths, max_lines: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """The functions among `paths` (methods and nested ones too) over `max_lines` lines, with their lengths."""
    out = {}
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > max_lines:
                    out[f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{node.name}"] = n
    return out


def test_no_product_function_is_over_80_lines():
    assert long_functions(_python_files()) == {}


def test_the_function_check_finds_a_long_one(tmp_path):
    f = tmp_path / "long.py"
    f.write_text("def short():\n    return 1\n\n\ndef long():\n" + "    x = 1\n" * 81)
    assert long_functions([f]) == {f"{f}:long": 82}
