"""`decodemon diagnose`: its text and its JSON name the one verdict the headline rule (diagnosis.verdict) gives for
the candidates they print, and an unknown verdict's remedy names the measurement that is missing."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor import diagnosis as dx
from tests.conftest import cli

# the kernels fill a 3.93 ms step 13.4x above the bandwidth floor: nothing binds until the grids are read
KERNELS_FILL_FAR_ABOVE_FLOOR = ["--ms-per-token", 3.93, "--kernels-per-token", 1864, "--kernel-ms-per-token", 3.90,
                                "--bytes-per-token", 1.2e9, "--bandwidth-gbs", 4081]
CASES = {
    "kernels fill, far above the floor": KERNELS_FILL_FAR_ABOVE_FLOOR,
    "near the floor": ["--ms-per-token", 0.5, "--bytes-per-token", 1.2e9, "--bandwidth-gbs", 4081],
    "idle between launches": ["--ms-per-token", 20, "--kernels-per-token", 1864, "--kernel-ms-per-token", 4],
    "collectives": ["--ms-per-token", 10, "--collectives-per-token", 64, "--us-per-collective", 50],
}


def _both(args):
    text, js = cli("diagnose", *args), cli("diagnose", *args, "--json")
    assert text.returncode == js.returncode == 0, (text.stderr, js.stderr)
    return text.stdout, json.loads(js.stdout)


@pytest.mark.parametrize("args", CASES.values(), ids=CASES.keys())
def test_text_and_json_name_the_verdict_of_the_candidates_they_print(args):
    text, d = _both(args)
    cands = {k: dx.Candidate(value=c["value"], unit=c["unit"], threshold=c["threshold"], state=c["state"],
                             detail=c["detail"]) for k, c in d["candidates"].items()}
    assert d["ceiling"] == dx.verdict(cands)
    assert text.splitlines()[0] == f"ceiling: {d['ceiling'].upper()}"
    for k, c in d["candidates"].items():  # the text's rows are the JSON's states
        row = next(ln for ln in text.splitlines() if ln.split()[:1] == [k])
        assert row.split()[1] == c["state"]


def test_kernels_that_fill_the_step_far_above_the_floor_ask_for_the_grids_not_the_floor():
    text, d = _both(KERNELS_FILL_FAR_ABOVE_FLOOR)
    assert d["candidates"]["bandwidth"]["state"] == "ruled_out"
    assert d["ceiling"] == "unknown" and "KERNELS" not in text
    remedy = next(ln for ln in text.splitlines() if ln.startswith("remedy:"))
    assert "grids" in remedy and "traced window" in remedy
    assert "price the floor" not in text.lower()  # the floor is priced already: never asked for


def test_figures_that_price_nothing_exit_3():
    r = cli("diagnose", "--kernels-per-token", 100)
    assert r.returncode == 3 and "ceiling: UNKNOWN" in r.stdout


def test_a_serial_fraction_alone_is_priced_and_exits_0_as_the_help_says():
    r = cli("diagnose", "--speedup", 1.5, "--n", 2)
    assert r.returncode == 0 and "serial fraction: 0.333" in r.stdout, r.stderr
    js = cli("diagnose", "--speedup", 1.5, "--n", 2, "--json")
    assert js.returncode == 0 and json.loads(js.stdout)["serial_fraction"] == pytest.approx(1 / 3, abs=1e-4)
    epilog = " ".join(cli("diagnose", "--help").stdout.split())
    assert "0 when a candidate or the serial fraction (--speedup with --n, an s between 0 and 1) could be priced" \
        in epilog
    assert "3 when neither could (an s solved outside 0..1 is no fraction)" in epilog
    assert cli("diagnose", "--speedup", 3, "--n", 2).returncode == 3  # s = -0.333: nothing priced, as it says


@pytest.mark.parametrize("text", ["abc", "1e9x", "1_0", "0x10"])
def test_a_figure_that_is_not_a_number_is_refused_with_a_true_description(text):
    from tests.conftest import assert_one_line_error

    r = cli("diagnose", "--ms-per-token", text)
    assert_one_line_error(r)
    assert f"--ms-per-token must be a number, e.g. 3.93 or 1.2e9, not '{text}'" in r.stderr
    assert "digits 0-9" not in r.stderr  # an exponent is accepted, so the message does not say digits only
    assert cli("diagnose", "--ms-per-token", 0.5, "--bytes-per-token", "1.2e9", "--bandwidth-gbs", 4081).returncode == 0
