"""The seventeenth session's H200 runs 38-40 (one command, three times, both modes) and its scripts: what
docs/benchmarks.md, the README and the closing note quote, from the committed raw files."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
H200 = ROOT / "docs" / "h200"
RUNS = (38, 39, 40)


def _load(name: str):
    return json.loads((H200 / f"{name}_2026-11-30.json").read_text())


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs():
    return {n: {r["mode"]: r for r in _load(f"overhead_session17_run{n}")["results"]} for n in RUNS}


def test_runs_38_to_40_are_one_command_with_each_modes_own_phase_length():
    """--eager-phase-s: the eager attaches ran ~10 s, the graphed ones ~4 s, in each of the three runs, and each
    run records the same command."""
    for n in RUNS:
        run = _load(f"overhead_session17_run{n}")
        assert run["env"]["command"] == ("python benchmarks/overhead.py --phase-s 4 --pairs 5 --long-s 20 "
                                         "--eager-pairs 8 --eager-phase-s 10 --profiler-phase-s 4 --modes eager,graph")
        assert run["env"]["driver"] == "580.159.04" and run["env"]["gpu"] == "NVIDIA H200"
        for r in run["results"]:
            want = 10.0 if r["mode"] == "eager" else 4.0
            assert r["accuracy"]["seconds_per_attach"] == want
            spans = [p["t1_unix_s"] - p["t0_unix_s"] for p in r["phases"] if p["phase"] == "D"]
            assert len(spans) == (8 if r["mode"] == "eager" else 5)
            assert all(want < s < want + 1.2 for s in spans)


def test_the_seventeenth_sessions_figures_are_the_committed_runs_own():
    r2 = lambda x: round(x, 2)  # noqa: E731
    r3 = lambda x: round(x, 3)  # noqa: E731
    got = _runs()
    eager = [got[n]["eager"] for n in RUNS]
    graph = [got[n]["graph"] for n in RUNS]
    assert [e["speeds"]["u_slow"] for e in eager] == [[3, 12], [4, 12], [6, 12]]
    # graph: met in all three
    assert [r2(g["D"]["overhead_pct_median"]) for g in graph] == [0.04, 0.04, -0.8]
    assert [r2(g["D"]["noise_floor_bracketed_pct"]) for g in graph] == [0.07, 0.31, 2.52]
    assert [r3(g["D"]["p99_ratio_median"]) for g in graph] == [1.006, 1.012, 1.014]
    assert [r3(g["D"]["p99_ratio_median_after_first"]) for g in graph] == [1.005, 1.011, 1.011]
    assert [r3(g["Dlong"]["p99_ms"] / g["U_all"]["p99_ms"]) for g in graph] == [1.01, 1.008, 1.001]
    # eager, three views
    assert [r2(e["D"]["overhead_pct_median"]) for e in eager] == [1.98, 1.27, 1.51]
    assert [r2(e["D"]["noise_floor_bracketed_pct"]) for e in eager] == [10.72, 6.96, 20.9]
    assert [r2(e["D"]["overhead_pct_median_after_first"]) for e in eager] == [2.67, 0.63, -2.42]
    assert [r2(e["core"]["D"]["overhead_pct_median"]) for e in eager] == [1.51, 1.86, 3.03]
    assert [r2(e["core"]["D"]["noise_floor_bracketed_pct"]) for e in eager] == [2.11, 1.25, 8.83]
    assert [r2(e["core_c"]["D"]["overhead_pct_median"]) for e in eager] == [-0.54, 0.36, 1.81]
    assert [r2(e["core_c"]["D"]["noise_floor_bracketed_pct"]) for e in eager] == [2.23, 1.69, 7.12]
    assert [(r3(e["D"]["p99_ratio_median"]), r3(e["D"]["p99_ratio_median_after_first"])) for e in eager] == [
        (1.152, 1.148), (1.099, 1.088), (0.992, 0.991)]
    assert [(r3(e["core_c"]["D"]["p99_ratio_median"]), r3(e["core_c"]["D"]["p99_ratio_median_after_first"]))
            for e in eager] == [(1.109, 1.105), (1.053, 1.052), (1.064, 1.068)]
    assert [r3(e["D_later"]["p99_ms"] / e["U_all"]["p99_ms"]) for e in eager] == [0.984, 0.992, 0.972]
    assert [r3(e["Dlong"]["p99_ms"] / e["U_all"]["p99_ms"]) for e in eager] == [0.998, 1.189, 1.004]
    assert [r3(e["core_c"]["long_p99_ratio"]) for e in eager] == [1.065, 1.047, 0.99]
    assert (r2(eager[1]["Dlong"]["median_ms"]), r2(eager[1]["U_all"]["median_ms"])) == (30.38, 22.77)
    canary = [e["core"]["canary"] for e in eager]
    assert [(round(c["U"]["median_us"], 1), round(c["D"]["median_us"], 1)) for c in canary] == [
        (32.1, 31.7), (33.7, 32.7), (36.4, 44.7)]
    assert [(r2(c["U"]["c_median_us"]), r2(c["D"]["c_median_us"])) for c in canary] == [
        (23.84, 24.01), (24.78, 24.55), (26.89, 32.65)]
    assert [(e["switches"]["D"]["per_s"], e["switches"]["D"]["share_with"]) for e in eager] == [
        (20.7, 0.127), (20.6, 0.132), (21.7, 0.155)]
    assert [e["quiet"]["raw_quiet_pct"] for e in eager] == [1.2, 0.69, 0.66]
    assert [e["quiet"]["core_quiet_pct"] for e in eager] == [1.13, 1.63, 3.02]
    assert [r2(e["P"]["overhead_pct_median"]) for e in eager] == [53.19, 49.48, 52.15]
    assert [r2(g["P"]["overhead_pct_median"]) for g in graph] == [34.44, 38.37, 47.23]
    # accuracy, both modes
    for rs, launches in ((eager, 1863.0), (graph, 1864.0)):
        for r in rs:
            a = r["accuracy"]
            assert a["decodemon_launches_per_token"] == launches == round(a["profiler_kernels_per_token"], 1)
    kms = lambda a: round(100 * (a["decodemon_kernel_ms_per_token"] / a["profiler_kernel_ms_per_token"] - 1), 1)  # noqa: E731
    assert [kms(e["accuracy"]) for e in eager] == [-0.2, -0.2, -0.1]
    assert [kms(g["accuracy"]) for g in graph] == [-0.2, -0.2, -0.2]
    pm = lambda a: round(a["pm_vs_window"]["pm_gpu_busy_pct"] - a["pm_vs_window"]["traced_gpu_busy_pct"], 1)  # noqa: E731
    assert [pm(e["accuracy"]) for e in eager] == [1.4, 1.4, 1.2]
    assert [pm(g["accuracy"]) for g in graph] == [4.1, 4.3, 4.3]


def test_the_process_counters_quoted_are_the_runs_own():
    """The first H200 runs of the per-phase process counters: the engine's CPU and minor faults, the machine's TLB
    shootdowns and function-call IPIs, the monitor's CPU, the agent thread's CPU (the bill) and the collector."""
    got = _runs()
    eager = [got[n]["eager"] for n in RUNS]
    graph = [got[n]["graph"] for n in RUNS]
    vm = lambda r, k: [round(x, 1) for x in r["vm"][k]]  # noqa: E731  unobserved vs default attaches, a second
    assert [vm(e, "engine_cpu_ms") for e in eager] == [[1000.9, 1028.8], [1000.9, 1029.0], [1000.9, 1030.6]]
    assert [round(e["vm"]["engine_minflt"][1]) for e in eager] == [243, 226, 187]
    assert [round(g["vm"]["engine_minflt"][1]) for g in graph] == [418, 414, 399]
    assert [vm(e, "irq_TLB") for e in eager] == [[0.5, 41.2], [0.4, 39.9], [0.4, 31.5]]
    assert [round(g["vm"]["irq_TLB"][1]) for g in graph] == [93, 101, 92]
    assert [round(e["vm"]["irq_CAL"][1]) for e in eager] == [109, 110, 104]
    assert [round(e["vm"]["monitor_cpu_ms"][1]) for e in eager] == [221, 221, 230]
    assert [round(g["vm"]["monitor_cpu_ms"][1]) for g in graph] == [501, 505, 513]
    assert [e["attach"][-1]["observer_cost"]["agent_cpu_ms_per_s"] for e in eager] == [15.7, 17.5, 17.1]
    assert all(e["gc"][k]["collections_per_s"] == 0 for e in eager for k in ("U", "D", "Dlong"))
    assert [e["gc"]["D"]["other_threads_ms_per_s"] for e in eager] == [0.045, 0.041, 0.047]


def _specs():
    return [f"{H200}/overhead_session17_run{n}_2026-11-30.json:{H200}/overhead_session17_run{n}_times_eager_dm"
            f"_2026-11-30.json" for n in RUNS]


def test_the_pooled_figures_are_pool_runs_own_output_on_the_committed_runs():
    """scripts/pool_runs.py on the three committed runs gives the committed pooled JSON, whose figures the doc
    quotes; and one run pooled alone gives that run's own medians in every view (the runs' arithmetic, not new)."""
    pr = _script("pool_runs")
    r = subprocess.run([sys.executable, str(ROOT / "scripts/pool_runs.py"), *_specs()], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == _load("pool_session17_runs38-40_eager")  # the committed file is this output
    p = out["pooled"]
    assert {v: p[v]["pairs"] for v in p} == {"raw": 24, "core": 24, "core_c": 24}
    assert [(p[v]["overhead_pct_median"], p[v]["overhead_pct_interval_90"]) for v in ("raw", "core", "core_c")] == [
        (1.599, [-4.083, 3.115]), (1.989, [0.05, 3.083]), (0.363, [-1.376, 1.454])]
    assert [p[v]["overhead_pct_median_after_first"] for v in ("raw", "core", "core_c")] == [1.289, 1.653, 0.139]
    assert [p[v]["noise_floor_bracketed_pct"] for v in ("raw", "core", "core_c")] == [13.66, 2.11, 2.69]
    assert [(p[v]["p99_ratio_median"], p[v]["p99_ratio_median_after_first"]) for v in ("raw", "core", "core_c")] == [
        (1.103, 1.089), (1.08, 1.073), (1.073, 1.068)]
    assert out["pooled_p99_ratio_per_run"] == [0.984, 0.992, 0.972]
    # one run alone: its own figures, as the benchmark computed them on the H200 (within 0.01 points: the
    # committed phases' bounds are rounded to the millisecond, so a token on a bound may change sides)
    for n in RUNS:
        run = _load(f"overhead_session17_run{n}")
        e = next(x for x in run["results"] if x["mode"] == "eager")
        one = pr.pool([pr.run_pairs(run, _load(f"overhead_session17_run{n}_times_eager_dm"))])
        assert one["raw"]["overhead_pct_median"] == pytest.approx(e["D"]["overhead_pct_median"], abs=0.01)
        assert one["core"]["overhead_pct_median"] == pytest.approx(e["core"]["D"]["overhead_pct_median"], abs=0.01)
        assert one["core_c"]["overhead_pct_median"] == pytest.approx(e["core_c"]["D"]["overhead_pct_median"],
                                                                     abs=0.01)
        assert one["raw"]["p99_ratio_median"] == pytest.approx(e["D"]["p99_ratio_median"], abs=0.002)
        lo, hi = one["core_c"]["overhead_pct_interval_90"]
        assert lo <= one["core_c"]["overhead_pct_median"] <= hi


def test_pool_runs_bootstrap_is_seeded_and_brackets_the_median():
    pr = _script("pool_runs")
    xs = [-3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 4.0, 9.0]
    assert pr.bootstrap_median(xs) == pr.bootstrap_median(xs)
    lo, hi = pr.bootstrap_median(xs)
    assert -3.0 <= lo < 0.75 < hi <= 9.0
    assert pr.bootstrap_median([1.0] * 5) == (1.0, 1.0)


def test_pool_runs_bad_input_is_one_line_and_a_nonzero_exit(tmp_path):
    for args in (["nope.json"], [f"{tmp_path}/a.json:{tmp_path}/b.json"]):
        r = subprocess.run([sys.executable, str(ROOT / "scripts/pool_runs.py"), *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and r.stderr.startswith("pool_runs: ") and len(r.stderr.strip().splitlines()) == 1


def test_unmaps_counts_a_real_strace_by_thread_and_call():
    """scripts/h200_unmaps.py's count() on an strace it wrote here: a 4 s attach to the tiny CPU engine (pid
    19250), where the attach's thread mapped its stack and its malloc arena and unmapped the arena's trimmings."""
    um = _script("h200_unmaps")
    got = um.count(ROOT / "tests/data/strace_cpu_attach_2026-11-30.txt", {19250: "main (decode thread)"})
    calls = got["calls"]
    assert calls["munmap"] == {"tid 19262": 4}
    assert calls["brk"] == {"main (decode thread)": 2}
    assert calls["mmap"] == {"tid 19251": 1, "tid 19262": 3, "main (decode thread)": 1}
    assert got["munmap_bytes"] == {"tid 19262": 35651584 + 31457280 + 34547 + 16384}


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace on this machine")
def test_unmaps_runs_on_the_tiny_cpu_engine(tmp_path):
    """End to end on CPU: an unobserved phase and an attach of 2 s each under strace; the attach's threads
    show up in the second phase only, and the attach itself succeeded."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts/h200_unmaps.py"), str(tmp_path), "--cpu",
                        "--phase-s", "2"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-1500:]
    d = json.loads((tmp_path / "unmaps.json").read_text())
    assert d["D"]["attach_rc"] == 0 and "main (decode thread)" in d["D"]["threads"]
    assert len(d["D"]["threads"]) > len(d["U"]["threads"])
    assert "main (decode thread)" in d["U"]["minor_faults_per_s"]  # the tiny engine's own, faulting all along
    n = lambda ph: sum(sum(v.values()) for v in d[ph]["calls"].values())  # noqa: E731
    assert n("D") > n("U")


def test_the_benchmark_reads_issue_5s_limits_off_a_run():
    """acceptance_lines on the committed runs: what met and what did not, mode by mode. The eager windows came
    4.98-5.33 s apart in runs 38-40 (20 of 24 default attaches at 5.25 s or more) (the agent's 0.25 s ticks; agent.window_due's slack since), over the 5 s the
    issue asks; the graphed ones 4.0 s."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overhead

    want = {
        38: ["- eager: median +1.98% raw (not met); -0.54% by the C canary (met); p99 1.152× raw (not met); 1.109× "
             "by the C canary (not met); windows every 5.32 s at most (not met); PM sampling armed and nothing lost "
             "in 9 of 9 attaches (met); launches 1863.0 vs 1863.0 (met); kernel ms -0.2% (met); PM +1.4 points "
             "(met).",
             "- graph: median +0.04% raw (met); p99 1.006× raw (met); windows every 4.00 s at most (met); PM sampling "
             "armed and nothing lost in 6 of 6 attaches (met); launches 1864.0 vs 1864.0 (met); kernel ms -0.2% "
             "(met); PM +4.1 points (met)."],
        39: ["- eager: median +1.27% raw (not met); +0.36% by the C canary (met); p99 1.099× raw (met); 1.053× by "
             "the C canary (met); windows every 5.32 s at most (not met); PM sampling armed and nothing lost in 9 "
             "of 9 attaches (met); launches 1863.0 vs 1863.0 (met); kernel ms -0.2% (met); PM +1.4 points (met).",
             "- graph: median +0.04% raw (met); p99 1.012× raw (met); windows every 4.00 s at most (met); PM sampling "
             "armed and nothing lost in 6 of 6 attaches (met); launches 1864.0 vs 1864.0 (met); kernel ms -0.2% "
             "(met); PM +4.3 points (met)."],
    }
    for n, lines in want.items():
        run = _load(f"overhead_session17_run{n}")
        assert overhead.acceptance_lines(run["results"])[2:] == lines
    eager = {n: next(r for r in _load(f"overhead_session17_run{n}")["results"] if r["mode"] == "eager") for n in RUNS}
    assert [overhead.window_gaps(e) for e in eager.values()] == [
        [5.3, 5.29, 5.28, 5.02, 5.26, 5.27, 5.32, 5.05], [5.28, 5.31, 5.32, 5.28, 5.28, 5.28, 5.01, 5.31],
        [5.28, 4.98, 5.25, 5.29, 5.28, 5.33, 5.3, 5.29]]
    assert [overhead.window_gaps(e, "Dlong") for e in eager.values()] == [[5.25], [5.25], [5.26]]
    gaps = [g for e in eager.values() for g in overhead.window_gaps(e)]
    assert sum(g >= 5.25 for g in gaps) == 20 and sorted(g for g in gaps if g < 5.25) == [4.98, 5.01, 5.02, 5.05]
    doc = (ROOT / "docs/benchmarks.md").read_text()
    assert all(line in doc for line in want[39])  # the generated block says it too


def test_the_canary_bias_figures_are_the_committed_cpu_runs_own():
    """docs/benchmarks.md's CPU finding (seventeenth session): on the tiny engine, the Python canary ran faster
    attached in all five pairs, the C canary within ±0.22%; the in-process micro-benchmark beside it. The pairs
    are recomputed from the committed per-phase medians with the script's own pair_shifts."""
    cb = _script("canary_bias")
    d = json.loads((ROOT / "docs/cpu/canary_bias_session17_2026-11-30.json").read_text())
    assert d["machine"] == "2 CPUs, no GPU" and d["date"].startswith("2026-11-30")
    e = d["engine"]
    assert [p["phase"] for p in e["phases"]] == ["U", "D"] * 5 + ["U"]
    assert cb.pair_shifts(e["phases"], "canary_us") == e["python_pct"] == [-1.675, -1.571, -0.621, -0.108, -0.799]
    assert cb.pair_shifts(e["phases"], "canary_c_us") == e["c_pct"] == [0.03, 0.058, -0.135, 0.224, 0.111]
    assert all(x < 0 for x in e["python_pct"]) and max(abs(x) for x in e["c_pct"]) < 0.25
    assert d["micro"] == {"rounds": 40, "python_pct_median": -0.79, "python_faster_rounds": 26,
                          "c_pct_median": -0.03, "c_faster_rounds": 24}


def test_pair_shifts_brackets_each_attached_phase_by_its_neighbours():
    cb = _script("canary_bias")
    rows = [{"phase": "U", "x": 10.0}, {"phase": "D", "x": 9.9}, {"phase": "U", "x": 10.2},
            {"phase": "D", "x": 10.1}, {"phase": "U", "x": 10.0}]
    assert cb.pair_shifts(rows, "x") == [round(100 * (9.9 / 10.1 - 1), 3), 0.0]


def test_the_canary_micro_benchmark_runs_and_reports_both_canaries():
    cb = _script("canary_bias")
    m = cb.micro(rounds=2, tokens=20)
    assert m["rounds"] == 2 and 0 <= m["python_faster_rounds"] <= 2 and 0 <= m["c_faster_rounds"] <= 2
    assert isinstance(m["python_pct_median"], float) and isinstance(m["c_pct_median"], float)


def test_pm_continuity_counts_attaches_that_lost_samples_or_re_armed():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overhead

    phases = [{"phase": p} for p in ("U", "D", "U", "D", "U", "Ddense", "U", "Dlong", "U")]
    armed = {"pm": "armed (in process, 2000 us interval)"}
    attach = [{"probe": armed}, {"probe": {**armed, "pm_lost": "2 pumps found more samples"}},
              {"probe": {"pm": "off"}},  # the dense attach: not counted
              {"probe": {"pm": armed["pm"] + "; re-armed 1x after CuptiError"}}]
    assert overhead.pm_continuous({"phases": phases, "attach": attach}) == (1, 3)
    lines = overhead.acceptance_lines([{"mode": "eager", "D": {"overhead_pct_median": 0.5, "p99_ratio_median": 1.0},
                                        "phases": phases, "attach": attach}])
    assert "PM sampling armed and nothing lost in 1 of 3 attaches (not met)" in lines[-1]


def test_pm_stayed_continuous_in_every_default_and_long_attach_of_runs_38_to_40():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import overhead

    got = _runs()
    assert [[overhead.pm_continuous(got[n][m]) for m in ("eager", "graph")] for n in RUNS] == [
        [(9, 9), (6, 6)]] * 3
