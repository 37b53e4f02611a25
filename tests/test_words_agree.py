"""Exit codes and files that say what happened: a ledger that is not there is a wrong path (2), not a loop with
nothing measured (3); DIAGNOSIS.md ends in one newline however it is written."""

from __future__ import annotations

import json

from tests.conftest import REC, cli


def test_grade_without_a_ledger_is_bad_input_and_with_nothing_open_is_nothing_to_grade(tmp_path):
    r = cli("grade", REC["graph"], "--ledger", tmp_path / "missing.jsonl", cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert "no ledger at" in r.stderr and "decodemon predict" in r.stderr
    assert not (tmp_path / "missing.jsonl").exists()  # nothing written in its place
    r = cli("predict", REC["eager"], "--change", "graph", "--expect", "-50%", "--ledger", tmp_path / "l.jsonl")
    assert r.returncode == 0, r.stderr
    assert cli("grade", REC["graph"], "--ledger", tmp_path / "l.jsonl").returncode == 0
    r = cli("grade", REC["graph"], "--ledger", tmp_path / "l.jsonl")  # graded once: nothing open is left
    assert r.returncode == 3 and "no open prediction" in r.stderr


def _ends_in_one_newline(text: str) -> bool:
    return text.endswith("\n") and not text.endswith("\n\n")


def test_diagnosis_md_ends_in_one_newline_to_a_file_to_stdout_and_with_its_ledger(tmp_path):
    assert cli("report", REC["graph"], "-o", tmp_path / "D.md").returncode == 0
    assert _ends_in_one_newline((tmp_path / "D.md").read_text())
    r = cli("report", REC["graph"])
    assert r.returncode == 0 and _ends_in_one_newline(r.stdout)
    ledger = tmp_path / "l.jsonl"
    assert cli("predict", REC["eager"], "--change", "graph", "--expect", "-50%", "--ledger", ledger).returncode == 0
    label = json.loads(ledger.read_text().splitlines()[0])["source"]
    r = cli("report", REC["graph"], "-o", tmp_path / "L.md", "--ledger", ledger, "--label", label)
    text = (tmp_path / "L.md").read_text()
    assert r.returncode == 0 and "graded the open prediction" in r.stderr
    assert "## Predictions and grades" in text and _ends_in_one_newline(text)
