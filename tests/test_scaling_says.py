"""`decodemon scaling` says what its two recordings leave open, or refuses: two ranks of one run are not two runs,
a run with no model facts is not matched to the other, and a change of launch mode is not a rank count's."""

from __future__ import annotations

import json

from tests.conftest import DATA, assert_one_line_error, cli


def test_two_ranks_of_one_run_are_refused_by_their_facts():
    r = cli("scaling", DATA / "h200_tp2_graph_rank0.dmon", DATA / "h200_tp2_graph_rank1.dmon")
    assert_one_line_error(r)
    assert "ranks 0 and 1 of one run at tp 2" in r.stderr


def test_a_run_with_no_model_facts_is_said_to_be_unmatched():
    r = cli("scaling", DATA / "h200_unmarked_manual_1.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json")
    assert r.returncode == 0, r.stderr
    c = json.loads(r.stdout)["cautions"]
    assert len(c) == 1 and "h200_unmarked_manual_1.dmon carries no model facts" in c[0]


def test_a_graphed_run_against_an_eager_one_is_said_to_mix_two_changes():
    r = cli("scaling", DATA / "h200_tp1_graph_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon")
    assert r.returncode == 0, r.stderr
    assert "caution:" in r.stdout and "replays CUDA graphs" in r.stdout
    assert "launches its kernels one by one" in r.stdout


def test_two_runs_of_one_mode_and_one_model_carry_no_caution():
    r = cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cautions"] == []
