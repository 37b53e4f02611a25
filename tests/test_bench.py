"""The overhead benchmark (benchmarks/overhead.py and benchmarks/harness/): how it pairs and judges phases, what it
reads from the machine and the token log, its plan on a faked engine and on the tiny CPU engine, and the demo
engine's clocks it relies on."""

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import judge, limits, machine, phases, report, summary, tokens  # noqa: E402


def _ph(label, med, p99):
    return {"phase": label, "median_ms": med, "p99_ms": p99}


# -- pairing and noise floors ---------------------------------------------------------------------------------------

def test_pairs_are_judged_against_the_unobserved_phases_on_both_sides():
    # the loop drifts from 20 to 22 ms across the pair: against the phase before alone, an observer that
    # costs nothing would read +5%; against both sides it reads 0
    per = [_ph("U", 20.0, 30.0), _ph("D", 21.0, 33.0), _ph("U", 22.0, 36.0)]
    st = judge.pair_stats(per, "D")
    assert st["pairs"] == 1
    assert st["overhead_pct_median"] == pytest.approx(0.0)
    assert st["p99_ratio_median"] == pytest.approx(1.0)
    assert st["noise_floor_pct"] == pytest.approx(10.0)  # U after / U before: 22 / 20


def test_the_first_attach_is_shown_apart_and_a_plan_may_end_on_an_observed_phase():
    per = [_ph("U", 10.0, 11.0), _ph("D", 13.0, 20.0), _ph("U", 10.0, 11.0), _ph("D", 10.1, 11.0),
           _ph("U", 10.0, 11.0), _ph("D", 10.2, 11.0)]  # the last D has no U after it: the one before alone
    st = judge.pair_stats(per, "D")
    assert st["pairs"] == 3
    assert st["overhead_pct_median"] == pytest.approx(2.0)  # ratios 1.3, 1.01, 1.02
    assert st["overhead_pct_median_after_first"] == pytest.approx(1.5)
    assert st["overhead_pct_max"] == pytest.approx(30.0)
    assert st["noise_floor_pct"] == pytest.approx(0.0)
    assert judge.pair_stats(per, "P")["pairs"] == 0 and judge.pair_stats(per, "P")["overhead_pct_median"] is None


def test_an_observed_phase_not_preceded_by_an_unobserved_one_is_not_a_pair():
    per = [_ph("D", 12.0, 13.0), _ph("U", 10.0, 11.0), _ph("Ddense", 11.0, 12.0), _ph("D", 10.0, 11.0)]
    assert judge.pair_stats(per, "D")["pairs"] == 0
    assert judge.pair_stats(per, "Ddense")["pairs"] == 1
    # a phase that held no token is no pair either
    assert judge.pair_stats([_ph("U", 10.0, 11.0), _ph("D", None, None), _ph("U", 10.0, 11.0)], "D")["pairs"] == 0


def test_the_bracketed_noise_floor_judges_an_unobserved_phase_as_an_observed_one_is_judged():
    # a loop drifting 20 -> 21 -> 22 -> 23 ms: after/before reads 5% noise, the bracketed estimator none
    per = [_ph("U", 20.0, 30.0), _ph("D", 20.5, 31.0), _ph("U", 21.0, 31.0), _ph("D", 21.5, 32.0),
           _ph("U", 22.0, 33.0), _ph("D", 22.5, 33.0), _ph("U", 23.0, 34.0)]
    st = judge.pair_stats(per, "D")
    assert st["noise_floor_bracketed_pct"] == pytest.approx(0.0)
    assert st["noise_floor_pct"] == pytest.approx(100 * (22.0 / 21.0 - 1))  # 21/20, 22/21, 23/22: median 22/21
    per[4] = _ph("U", 22.0 * 1.03, 33.0)  # one unobserved phase 3% off its neighbours' mean
    st = judge.pair_stats(per, "D")
    assert st["bracketed_null_pct"][1] == pytest.approx(3.0, abs=0.01)
    assert len(st["bracketed_null_pct"]) == 2  # the first and last U have no U on one side
    # the p99 ratio gets the same noise floor: U p99s 30, 31, 33, 34 -> 31 / 31.5 and 33 / 32.5
    assert st["p99_noise_floor_bracketed_pct"] == pytest.approx(100 * statistics.median(
        [abs(31.0 / 31.5 - 1), abs(33.0 / 32.5 - 1)]))
    assert report.p99_noise(st) == f" (noise ±{st['p99_noise_floor_bracketed_pct']:.1f}%)"
    assert report.p99_noise({}) == ""


def test_the_mean_token_is_judged_like_the_median():
    per = [{"phase": "U", "median_ms": 20.0, "p99_ms": 30.0, "mean_ms": 21.0},
           {"phase": "D", "median_ms": 20.0, "p99_ms": 31.0, "mean_ms": 21.42},
           {"phase": "U", "median_ms": 20.0, "p99_ms": 30.0, "mean_ms": 21.0}]
    st = judge.pair_stats(per, "D")
    assert st["overhead_pct_median"] == pytest.approx(0.0)  # the median token untouched
    assert st["overhead_mean_pct_median"] == pytest.approx(2.0)  # the windows' slow tokens in the mean


def test_the_pairs_are_also_judged_with_each_attachs_start_up_left_out():
    """Only the default attaches (D) lose their first START_S; an attach slower in its start-up only is judged
    slower whole and not after it."""
    ph = [("U", 0.0, 4.0), ("D", 4.0, 8.0), ("U", 8.0, 12.0), ("Ddense", 12.0, 16.0), ("U", 16.0, 20.0)]
    shifted = judge.after_start_phases(ph)
    assert shifted[1] == ("D", 4.0 + judge.START_S - judge.PHASE_SKIP_S, 8.0) and shifted[3] == ph[3]
    ends = [i * 0.02 for i in range(1, 1000)]
    ms = [30.0 if 4.0 <= e < 6.2 else 20.0 for e in ends]  # slow for 2.2 s of the attach: most of it, start-up included
    whole = judge.pair_stats(judge.phase_rows(ph, ends, ms), "D")
    after = judge.pair_stats(judge.phase_rows(shifted, ends, ms), "D")
    assert whole["overhead_pct_median"] > 0 and after["overhead_pct_median"] == 0
    line = next(x for x in report.run_lines(_result(D_after_start=after)) if x.startswith("Each default attach"))
    assert "first 1.5 s left out" in line and "+0.00%" in line


def test_a_loop_that_runs_at_two_speeds_is_called_out():
    # a loop at ~20 ms that ran at ~30 for a stretch: one unobserved and two observed phases over 1.25x the fastest
    per = [_ph("U", 20.0, 25.0), _ph("D", 20.2, 25.0), _ph("U", 20.1, 25.0), _ph("D", 30.0, 36.0),
           _ph("U", 29.0, 35.0), _ph("D", 31.0, 37.0), _ph("U", 20.0, 25.0), _ph("D", 20.0, 25.0), _ph("U", 20.2, 25.0)]
    sp = judge.speed_regimes(per)
    assert sp["threshold_ms"] == pytest.approx(25.0)
    assert sp["u_slow"] == [1, 5] and sp["observed_slow"] == [2, 4]
    # only the pairs whose three phases all ran fast: +0.75% (20.2 / 20.05) and -0.5% (20.0 / 20.1)
    assert sp["one_speed_pairs_pct"] == [0.75, -0.5] and sp["one_speed_overhead_pct_median"] == pytest.approx(0.13)
    line = next(x for x in report.run_lines(_result(speeds=sp)) if x.startswith("Loop speed"))
    assert "1 of 5 unobserved and 2 of 4 decodemon phases ran over 25.0 ms/token" in line
    steady = judge.speed_regimes([_ph("U", 20.0, 30.0), _ph("D", 20.2, 31.0), _ph("U", 20.1, 30.0)])
    assert steady["observed_slow"] == [0, 1]
    assert not any(x.startswith("Loop speed") for x in report.run_lines(_result(speeds=steady)))


# -- one core speed --------------------------------------------------------------------------------------------------

def _slow_core_log(n=3000, seed=1):
    """Tokens of ~20 ms whose core runs 1.6x slower in every third block of 300 tokens; the canary slows with it."""
    rng = np.random.default_rng(seed)
    slow = np.array([(i // 300) % 3 == 2 for i in range(n)])
    factor = np.where(slow, 1.6, 1.0)
    return (20.0 * factor * rng.normal(1, 0.01, n), 30.0 * factor * rng.normal(1, 0.01, n), slow)


def test_core_speed_scales_a_slow_core_away_and_keeps_work_added_on_the_decode_thread():
    ms, canary, truth = _slow_core_log()
    cs = judge.core_speed(list(ms), list(canary), [True] * len(ms))
    slow, scaled = np.array(cs["slow"]), np.array(cs["ms"])
    assert np.mean(slow == truth) > 0.98  # the smoothed canary finds the slow blocks (all but their edges)
    assert np.median(ms[truth]) / np.median(ms[~truth]) > 1.5
    assert abs(np.median(scaled[truth]) / np.median(scaled[~truth]) - 1) < 0.02  # at one core speed
    # 1 ms of work on the decode thread in every other block of 200 tokens (the canary does not see it) survives
    extra = np.array([(i // 200) % 2 for i in range(len(ms))], dtype=float)
    cs2 = judge.core_speed(list(ms + extra), list(canary), [True] * len(ms))
    added = np.array(cs2["ms"]) - scaled
    assert np.median(added[extra == 1]) == pytest.approx(1.0, abs=0.15) and np.allclose(added[extra == 0], 0)
    # no canary (an older engine), or no unobserved token to take the reference from: nothing to scale by
    assert judge.core_speed(list(ms), None, [True] * len(ms)) is None
    assert judge.core_speed(list(ms), list(canary), [False] * len(ms)) is None


def test_the_c_canary_view_judges_the_default_attaches_at_one_core_speed():
    """A slow core that falls on an attach reads as a large raw overhead and as none by the C canary."""
    ends = [0.02 * (i + 1) for i in range(1000)]  # 20 s of 20 ms tokens: U D U D U of 4 s
    phs = [{"phase": lab, "t0_unix_s": 4.0 * k, "t1_unix_s": 4.0 * (k + 1)} for k, lab in enumerate("UDUDU")]
    on_slow = [4.0 <= e < 8.0 for e in ends]  # the first attach ran on a slow core
    ms = [32.0 if s else 20.0 for s in on_slow]
    cc = [29.0 if s else 18.0 for s in on_slow]
    raw = judge.pair_stats(judge.phase_rows([(p["phase"], p["t0_unix_s"], p["t1_unix_s"]) for p in phs], ends, ms), "D")
    assert raw["overhead_pct_median"] > 25
    v = judge.c_canary_view(phs, {"end_unix_s": ends, "ms": ms, "canary_c_us": cc})
    assert v["D"]["pairs"] == 2 and abs(v["D"]["overhead_pct_median"]) < 1.0
    assert judge.c_canary_view(phs, {"end_unix_s": ends, "ms": ms}) == {}  # no C canary in the log


def test_the_core_speed_table_shows_the_canaries_beside_the_eager_pairs_only():
    d = {"pairs": 2, "overhead_pct_median": 0.5, "overhead_pct_min": 0.1, "overhead_pct_max": 0.9,
         "overhead_pct_median_after_first": 0.9, "noise_floor_bracketed_pct": 1.2, "p99_ratio_median": 1.05}
    eager = _result(core={"D": d, "canary": {"U": {"median_us": 31.1, "c_median_us": 18.2, "slow_core_share": 0.05},
                                             "D": {"median_us": 30.5, "c_median_us": 18.3, "slow_core_share": 0.1}},
                          "long_p99_ratio": 1.02},
                    core_c={"D": {**d, "overhead_pct_median": -0.2}, "pooled_p99_ratio": 1.04, "long_p99_ratio": 1.0})
    lines = report.core_table([eager, _result(mode="graph")])
    rows = [ln for ln in lines if ln.startswith("| eager |")]
    assert len(rows) == 1 and rows[0].endswith("| 31.1 vs 30.5 | 5.0% vs 10.0% |")
    assert not any(ln.startswith("| graph |") for ln in lines)
    assert "Long attach at one core speed, eager: p99 ratio 1.020." in lines
    assert any("18.20 vs 18.30 µs" in ln and "defaults median -0.20%" in ln for ln in lines)
    assert report.core_table([_result(mode="graph")]) == []


# -- the machine and the token log -----------------------------------------------------------------------------------

def test_host_share_reads_steal_and_busy_between_two_readings():
    a = [100, 0, 50, 800, 50, 0, 0, 0]  # user nice system idle iowait irq softirq steal
    b = [200, 0, 100, 1000, 50, 0, 0, 50]  # +100 user, +50 system, +200 idle, +50 steal: 400 in all
    assert machine.host_share(a, b) == {"host_steal_pct": 12.5, "host_busy_pct": 50.0}
    assert machine.host_share(None, b) == {} and machine.host_share(a, a) == {}
    per = [{"phase": "U", "median_ms": m, "host_steal_pct": st, "host_busy_pct": 10.0}
           for m, st in ((20.0, 0.0), (30.0, 5.0), (40.0, 10.0))] + [{"phase": "D", "median_ms": 25.0}]
    h = machine.host_summary(per)
    assert h["u_steal_pct"] == [0.0, 10.0] and h["r_ms_vs_steal"] == pytest.approx(1.0)
    assert machine.host_ticks() is None or len(machine.host_ticks()) == 8


def test_the_kernels_memory_work_is_read_per_phase_and_summed_up(tmp_path):
    """/proc/vmstat's counters per second per phase, and the median per label (unobserved after the first vs
    default attaches), keys that never moved left out."""
    vm = tmp_path / "vmstat"
    vm.write_text("nr_free_pages 5\ncompact_stall 10\npgmigrate_success 100\npgfault 1000\nthp_fault_alloc 7\n")
    before = machine.vm_counters(str(vm), None)
    assert before == {"compact_stall": 10, "pgmigrate_success": 100, "pgfault": 1000, "thp_fault_alloc": 7}
    vm.write_text("compact_stall 12\npgmigrate_success 140\npgfault 3000\nthp_fault_alloc 7\n")
    rates = machine.vm_rates(before, machine.vm_counters(str(vm), None), 4.0)
    assert rates == {"vm_per_s": {"compact_stall": 0.5, "pgmigrate_success": 10.0, "pgfault": 500.0,
                                  "thp_fault_alloc": 0.0}}
    assert machine.vm_counters(str(tmp_path / "missing"), None) == {} and machine.vm_rates({}, before, 1.0) == {}
    per = [{"phase": "U", "vm_per_s": {"pgfault": 900.0, "compact_stall": 9.0}},  # the first: left out
           {"phase": "D", "vm_per_s": {"pgfault": 600.0, "compact_stall": 1.0, "thp_fault_alloc": 0.0}},
           {"phase": "U", "vm_per_s": {"pgfault": 100.0, "compact_stall": 0.0, "thp_fault_alloc": 0.0}},
           {"phase": "D", "vm_per_s": {"pgfault": 800.0, "compact_stall": 0.0, "thp_fault_alloc": 0.0}},
           {"phase": "U", "vm_per_s": {"pgfault": 300.0, "compact_stall": 0.0, "thp_fault_alloc": 0.0}}]
    assert machine.vm_summary(per) == {"compact_stall": [0.0, 0.5], "pgfault": [200.0, 700.0]}


def test_interrupts_sent_between_cpus_are_summed_over_cpus_and_join_the_memory_counters(tmp_path):
    irq = tmp_path / "interrupts"
    irq.write_text("           CPU0       CPU1       CPU2\n"
                   "  0:         40          0          0  IO-APIC   2-edge      timer\n"
                   "RES:        120         30          7   Rescheduling interrupts\n"
                   "CAL:          5          6          1   Function call interrupts\n"
                   "TLB:        900          0         11   TLB shootdowns\n"
                   "LOC:       1000       1000       1000   Local timer interrupts\n")
    assert machine.irq_counters(str(irq)) == {"irq_RES": 157, "irq_CAL": 12, "irq_TLB": 911}
    assert machine.irq_counters(str(tmp_path / "missing")) == {}
    vm = tmp_path / "vmstat"
    vm.write_text("pgfault 10\n")
    assert machine.vm_counters(str(vm), str(irq)) == {"pgfault": 10, "irq_RES": 157, "irq_CAL": 12, "irq_TLB": 911}


def test_proc_counters_read_the_engines_faults_and_cpu_and_the_finished_monitors_cpu():
    """Whose faults and CPU: the engine's own (/proc/PID/stat, here this process's) and the monitor processes a
    phase waited for (RUSAGE_CHILDREN)."""
    import mmap
    import time

    a = machine.proc_counters(os.getpid())
    fresh = mmap.mmap(-1, 8 << 20)  # pages never touched before: each first write is a minor fault
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        fresh.madvise(mmap.MADV_NOHUGEPAGE)
    for i in range(0, 8 << 20, 4096):
        fresh[i] = 1
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:
        pass
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.2: pass"],
                   check=True)
    b = machine.proc_counters(os.getpid())
    fresh.close()
    assert set(a) == set(b) == set(machine.PROC_KEYS)
    assert b["engine_minflt"] >= a["engine_minflt"] + 1000, (a, b)
    assert b["engine_cpu_ms"] >= a["engine_cpu_ms"] + 40, (a, b)
    assert b["monitor_cpu_ms"] - a["monitor_cpu_ms"] >= 150  # the child's 0.2 s of CPU, once it was waited for
    assert machine.proc_counters(None).keys() == {"monitor_cpu_ms"}  # no engine pid: the monitors' alone


def _udu_log():
    phases_ = [{"phase": "U", "t0_unix_s": float(k), "t1_unix_s": float(k + 1)} for k in range(5)]
    for k in (1, 3):
        phases_[k]["phase"] = "D"
    ends = [k / 10 + 0.1 for k in range(50)]  # ten 100 ms tokens a phase
    return phases_, ends


def test_switch_profile_counts_the_decode_threads_waits_per_label_after_the_first_attach():
    phs, ends = _udu_log()
    nv = [0] * 50
    for k in (31, 33, 35):  # the second attach's tokens 2, 4 and 6 waited, 2 switches each
        nv[k] = 2
    ms = [100.0 + (10.0 if x else 0.0) for x in nv]
    nv[12] = 5  # in the first attach: left out
    sw = tokens.switch_profile(phs, {"end_unix_s": ends, "ms": ms, "nvcsw": nv})
    assert set(sw) == {"U", "D"} and sw["U"]["per_s"] == 0 and sw["U"]["share_with"] == 0
    d = sw["D"]
    assert d["phases"] == 1 and d["tokens"] == 10 and d["share_with"] == 0.3
    assert d["per_s"] == round(1e3 * 6 / (7 * 100 + 3 * 110), 1)
    assert d["median_ms_without"] == 100.0 and d["median_ms_with"] == 110.0
    assert tokens.switch_profile(phs, {"end_unix_s": ends, "ms": ms}) == {}
    line = report.switch_line({"mode": "eager", "switches": sw})
    assert f"default attaches {d['per_s']:g}/s, 30.0% of tokens (median 100.00 ms without, 110.00 with)" in line
    assert "unobserved 0/s, 0.0% of tokens;" in line and report.switch_line({"mode": "graph"}) is None


def test_the_tokens_the_agent_never_touched_carry_none_of_the_waits():
    phs, ends = _udu_log()
    slow = set(range(10, 16)) | set(range(30, 36))  # six of each attach's ten tokens waited, 10 ms each
    ms = [100.0 + (10.0 if k in slow else 0.0) for k in range(50)]
    nv = [2 if k in slow else 0 for k in range(50)]
    q = tokens.quiet_overhead(phs, {"end_unix_s": ends, "ms": ms, "nvcsw": nv}, "D")
    assert q["raw_all_pct"] == 10.0 and q["raw_quiet_pct"] == 0.0
    assert tokens.quiet_overhead(phs, {"end_unix_s": ends, "ms": ms}, "D") == {}


def test_gc_profile_reads_the_collectors_columns_per_label():
    phs = [{"phase": p, "t0_unix_s": float(i), "t1_unix_s": float(i + 1)} for i, p in enumerate("UDUD")]
    ends = [i + 0.5 + j / 100 for i in range(4) for j in range(10)]  # ten 100 ms tokens per phase
    times = {"end_unix_s": ends, "ms": [100.0] * 40, "gc_n": [0] * 40, "gc_ms": [0.0] * 40, "gc_other_ms": [0.0] * 40}
    for k in (12, 15, 31):  # collections on the decode thread in the first D (two) and in the second (one)
        times["gc_n"][k], times["gc_ms"][k] = 1, 4.0
    times["gc_other_ms"][33] = 2.0
    g = tokens.gc_profile(phs, times)
    assert set(g) == {"U", "D"}  # the first D is the first attach: the phases after it only
    assert g["D"] == {"phases": 1, "collections_per_s": 1.0, "ms_per_s": 4.0, "other_threads_ms_per_s": 2.0,
                      "share_with": 0.1}
    assert g["U"]["collections_per_s"] == 0 and g["U"]["phases"] == 1
    assert "default attaches 1 collections and 4 ms a second" in report.gc_line({"mode": "eager", "gc": g})
    assert tokens.gc_profile(phs, {"end_unix_s": ends, "ms": [100.0] * 40}) == {}


def test_the_time_profile_bins_an_attachs_tokens_by_time_since_it_started():
    """Each token of a later attach over its unobserved neighbours, by when in the attach it ended."""
    spans = [("U", 0.0, 4.0), ("D", 4.0, 8.0), ("U", 8.0, 12.0), ("D", 12.0, 16.0), ("U", 16.0, 20.0)]
    phs = [{"phase": lab, "t0_unix_s": t0, "t1_unix_s": t1} for lab, t0, t1 in spans]
    ends = [0.02 * (i + 1) for i in range(1000)]
    ms = [22.0 if 12.0 <= e < 13.0 else 20.0 for e in ends]  # the second attach's first second 10% slower
    prof = tokens.time_profile([(phs, {"end_unix_s": ends, "ms": ms})], bin_s=1.0)
    assert [b["raw_pct"] for b in prof["bins"]][:4] == [10.0, 0.0, 0.0, 0.0]  # (a 5th: the token at 16.0 s)
    assert prof["bins"][0]["tokens"] == 47  # 12.05-13 s: the phase's first 50 ms are the switch, not counted
    line = next(x for x in report.run_lines(_result(start_profile=prof)) if x.startswith("Where in"))
    assert "0-1 s +10.00%" in line and "1-2 s +0.00%" in line


def test_pm_checks_pool_by_samples_and_keep_the_widest_attach():
    got = judge.pool_pm_checks([{"samples": 30, "pm_gpu_busy_pct": 10.0, "window_gpu_busy_pct": 9.0},
                                {"samples": 10, "pm_gpu_busy_pct": 14.0, "traced_gpu_busy_pct": 11.0},  # older name
                                None, {"samples": 0, "pm_gpu_busy_pct": 90.0, "window_gpu_busy_pct": 0.0}])
    assert got == {"samples": 40, "attaches": 2, "pm_gpu_busy_pct": 11.0, "window_gpu_busy_pct": 9.5,
                   "max_attach_gap_points": 3.0}
    assert judge.pool_pm_checks([None, {}]) is None


# -- the limits ------------------------------------------------------------------------------------------------------

def _result(mode="eager", **kw):
    """A mode's result as summary.summarize shapes it, with nothing measured unless given."""
    empty = {"pairs": 0, "overhead_pct_median": None, "p99_ratio_median": None}
    kind = {"median_ms": None, "p99_ms": None, "tokens": 0}
    return {"mode": mode, "attach": [], "D": empty, "P": empty, "Ddense": empty, "U_all": kind, "U_first": kind,
            "D_all": kind, "D_later": kind, "Dlong": {**kind, "seconds": 20, "slow_tokens_over_1.1x_u_p99": 0},
            "accuracy": {}, **kw}


def _attach(label, window_every_s, pm="armed", **probe):
    return {"label": label, "observer_cost": {"window_every_s": window_every_s}, "probe": {"pm": pm, **probe}}


def test_the_limits_are_met_or_not_met_figure_by_figure():
    ok = _result(D={"pairs": 5, "overhead_pct_median": 0.4, "p99_ratio_median": 1.04},
                 attach=[_attach("D", 4.8), _attach("D", 4.9), _attach("Ddense", 1.0, pm="off"), _attach("Dlong", 4.8)],
                 accuracy={"decodemon_kernels_per_token": 1863.0, "profiler_kernels_per_token": 1863.02,
                           "decodemon_kernel_ms_per_token": 3.958, "profiler_kernel_ms_per_token": 3.969,
                           "pm_vs_window": {"pm_gpu_busy_pct": 14.8, "window_gpu_busy_pct": 12.9}})
    line = limits.limit_lines([ok])[-1]
    assert "not met" not in line
    assert ("median +0.40% raw (met); p99 1.040× raw (met); windows every 4.90 s at most (met); PM sampling armed "
            "and nothing lost in 3 of 3 attaches (met); launches 1863.0 vs 1863.0 (met); kernel ms -0.3% (met); "
            "PM +1.9 points (met)") in line
    bad = _result(mode="graph", D={"pairs": 5, "overhead_pct_median": 1.6, "p99_ratio_median": 1.2},
                  attach=[_attach("D", 5.3), _attach("Dlong", 4.0, pm="armed; re-armed 1x after CuptiError")],
                  accuracy={"pm_vs_window": {"pm_gpu_busy_pct": 100.0, "traced_gpu_busy_pct": 94.0}})
    line = limits.limit_lines([bad])[-1]
    assert line.count("not met") == 5 and line.startswith("- graph: median +1.60% raw (not met)")
    assert "1 of 2 attaches (not met)" in line
    # the typed probe status says the same with counts
    assert not limits.pm_kept({"pm": "armed", "pm_restarts": 1}) and not limits.pm_kept({"pm": "armed",
                                                                                          "pm_full_pumps": 2})
    assert limits.pm_kept({"pm": "armed", "pm_restarts": 0}) and not limits.pm_kept({"pm": "unavailable"})
    # nothing measured: the run cannot tell, and says so
    assert "windows every n/a s at most (—)" in limits.limit_lines([_result()])[-1]


# -- the plan ----------------------------------------------------------------------------------------------------------

def test_probe_settings_are_passed_with_decodemons_expert_option():
    assert phases.probe_args({"hold_gil": False, "agent_tick_s": 0.05, "api_every": 0}) == [
        "--probe", "hold_gil=false", "--probe", "agent_tick_s=0.05", "--probe", "api_every=0"]
    assert phases.probe_args({}) == []


def _fake_engine(monkeypatch, calls: list) -> None:
    """engine_session's children replaced: a demo engine that writes its pid and an empty token log, and an attach
    that answers `{}`. `calls` gets ("engine"|"attach", the command) for each child."""

    class Engine:
        def __init__(self, cmd, stdout=None, stderr=None):
            calls.append(("engine", cmd))
            Path(cmd[cmd.index("--pid-file") + 1]).write_text("4242")
            self.times = Path(cmd[cmd.index("--times-file") + 1])
            stderr.write("decoding\n")
            stderr.flush()

        def poll(self):
            return None

        def wait(self, timeout=None):
            self.times.write_text(json.dumps({"end_unix_s": [], "ms": []}))

    def run(cmd, capture_output=True, text=True):
        calls.append(("attach", cmd))
        return subprocess.CompletedProcess(cmd, 0, stdout="{}", stderr="")

    monkeypatch.setattr(phases.subprocess, "Popen", Engine)
    monkeypatch.setattr(phases.subprocess, "run", run)
    monkeypatch.setattr(phases.os, "kill", lambda pid, sig: None)
    monkeypatch.setattr(phases.time, "sleep", lambda s: None)


def test_an_engine_session_attaches_each_label_with_its_own_arguments(tmp_path, monkeypatch):
    """U sleeps, D attaches at defaults, Ddense at the dense setting, Dlong for its own seconds, and a label given
    in `attach_args` attaches with those arguments."""
    calls = []
    _fake_engine(monkeypatch, calls)
    s = phases.engine_session("eager", "t", ["U", "D", "Ddense", ("Dlong", 20.0), "B"], 4.0, tmp_path,
                              attach_args={"B": phases.probe_args({"prepare_lead_tokens": 2})})
    assert [p[0] for p in s["phases"]] == ["U", "D", "Ddense", "Dlong", "B"] and len(s["attach"]) == 4
    attaches = [cmd[cmd.index("attach"):] for kind, cmd in calls if kind == "attach"]
    assert all(a[:2] == ["attach", "4242"] for a in attaches)
    assert [a[a.index("--seconds") + 1] for a in attaches] == ["4", "4", "20", "4"]
    assert [a[a.index("--seconds") + 2:] for a in attaches] == [
        [], ["--probe", "window_period_s=1", "--probe", "window_tokens=2", "--probe", "window_min_tokens=0"], [],
        ["--probe", "prepare_lead_tokens=2"]]
    engine = calls[0][1]
    assert "--cpu-clocks" in engine and "--tiny" not in engine  # the tiny CPU engine only when asked for


def test_an_engine_session_runs_a_screen_label_through_run_screen(tmp_path, monkeypatch):
    """A label in `screens` (and S) attaches with the live screen, with its own arguments; the others as before."""
    calls = []
    _fake_engine(monkeypatch, calls)
    seen = []
    monkeypatch.setattr(phases, "run_screen", lambda pid, extra, secs: seen.append((pid, extra, secs))
                        or {"screen": True})
    s = phases.engine_session("eager", "t", ["A", "B", "S"], 4.0, tmp_path,
                              attach_args={"A": [], "B": ["--refresh", "1"]}, screens={"B"})
    assert [p[0] for p in s["phases"]] == ["A", "B", "S"] and s["attach"][1] == ("B", {"screen": True})
    assert seen == [(4242, ["--refresh", "1"], 4.0), (4242, [], 4.0)]
    assert [k for k, _ in calls] == ["engine", "attach"]


def test_the_plans_interleave_unobserved_phases_and_end_on_the_long_attach():
    a, b = __import__("overhead").plans(pairs=2, dense_pairs=1, screen_pairs=1, profiler_pairs=2, long_s=20.0)
    assert a == ["U", "D", "U", "D", "U", "Ddense", "U", "S", "U", ("Dlong", 20.0), "U"]
    assert b == ["U", "P", "U", "P", "U"]
    assert __import__("overhead").plans(1, 0, 0, 0, 5.0) == (["U", "D", "U", ("Dlong", 5.0), "U"], None)


def test_bad_options_are_one_line_and_exit_2(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/overhead.py"), str(tmp_path), "--probe", "hold_gil"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--probe wants KEY=VALUE" in r.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/overhead.py"), str(blocked / "out"), "--cpu-dry-run"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "cannot write to" in r.stderr


def test_the_benchmark_runs_its_plan_on_the_tiny_cpu_engine(tmp_path):
    """The whole harness end to end without a GPU: one engine, a pair of 1 s default attaches and a long one,
    judged, its limits printed, its files written, every token kept."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/overhead.py"), str(out), "--cpu-dry-run", "--modes",
                        "eager", "--pairs", "1", "--phase-s", "1", "--long-s", "1.5", "--dense-pairs", "0",
                        "--profiler-pairs", "0"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-1500:]
    run = json.loads((out / "overhead.json").read_text())
    assert run["env"]["gpu"] == "none (CPU dry run)" and "--cpu-dry-run" in run["env"]["command"]
    (res,) = run["results"]
    assert [p["phase"] for p in res["phases"]] == ["U", "D", "U", "Dlong", "U"]
    assert all(p["tokens"] > 100 for p in res["phases"])  # the tiny engine decodes ~2,000 tokens a second
    assert res["attach_errors"] == [] and [a["label"] for a in res["attach"]] == ["D", "Dlong"]
    assert all(a["tokens"] > 100 and a["ms_per_token"] > 0 for a in res["attach"])  # each attach counted tokens
    assert res["D"]["pairs"] == 1 and res["D"]["overhead_pct_median"] is not None
    assert "core" in res and res["core_c"]["D"]["pairs"] == 1  # eager: judged at one core speed too
    times = list((out / "times").glob("times_eager_dm.json"))
    assert len(times) == 1 and len(json.loads(times[0].read_text())["ms"]) >= sum(p["tokens"] for p in res["phases"])
    md = (out / "benchmarks.md").read_text()
    assert md == r.stdout[r.stdout.index("# What watching costs"):]
    assert "| eager | decodemon, defaults | 1 |" in md and "The limits in this run" in md


def test_the_live_screen_attaches_in_a_pseudo_terminal_and_quits_on_q():
    """run_screen: the real `decodemon attach PID` (the app) on a tiny CPU engine, in a pseudo-terminal, for 3 s;
    it used CPU, quit on `q` by itself, and left the engine decoding."""
    from tests.conftest import Engine

    e = Engine()
    try:
        rep = phases.run_screen(e.pid, ["--refresh", "0.5"], 3.0, size=(120, 40))
        assert rep["screen"] and rep.get("quit_on_q") is True and "killed" not in rep
        assert 0 < rep["monitor_cpu_s"] < 3.0
        assert e.alive() and e.proc.poll() is None
    finally:
        e.stop()


def test_pooled_tokens_leave_the_phase_before_any_attach_apart():
    rows = [{"phase": "U", "median_ms": 30.0, "p99_ms": 31.0, "tokens": 3, "ms": [30.0, 30.0, 31.0]},
            {"phase": "D", "ms": [20.0, 21.0]}, {"phase": "U", "ms": [20.0, 20.0]},
            {"phase": "D", "ms": [20.0, 25.0]}, {"phase": "U", "ms": [20.0]}, {"phase": "Dlong", "ms": [20.0, 23.0]}]
    p = summary.pooled(rows, 20.0)
    assert p["U_first"] == {"median_ms": 30.0, "p99_ms": 31.0, "tokens": 3}
    assert p["U_all"]["tokens"] == 3 and p["U_all"]["median_ms"] == 20.0  # not the phase before any attach
    assert p["D_all"]["tokens"] == 4 and p["D_later"]["tokens"] == 2 and p["D_later"]["p99_ms"] == 25.0
    assert p["Dlong"]["slow_tokens_over_1.1x_u_p99"] == 1 and p["Dlong"]["seconds"] == 20.0


# -- the demo engine's clocks, which the benchmark reads -------------------------------------------------------------

def test_the_demo_engine_writes_both_clocks(tmp_path):
    """Inter-token latency (stamped as the token reaches the host) and the iteration clock (after the hook)."""
    f = tmp_path / "times.json"
    r = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--device", "cpu",
                        "--tokens", "40", "--times-file", str(f)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    d = json.loads(f.read_text())
    assert len(d["ms"]) == len(d["ms_iter"]) == len(d["end_unix_s"]) == 40
    # unattached, the hook costs next to nothing: the two clocks cover the same span, one boundary apart
    assert sum(d["ms_iter"]) == pytest.approx(sum(d["ms"]), rel=0.2)
    assert all(m > 0 for m in d["ms"]) and all(m > 0 for m in d["ms_iter"])
    assert "thread_cpu_ms" not in d  # per-token CPU clocks only when asked for


@pytest.mark.timing
def test_demo_engine_cpu_clocks_account_for_the_decode_threads_time(tmp_path):
    """--cpu-clocks: per token, the decode thread's CPU ms, the process's CPU ms, the run-queue wait, its page faults
    and context switches, the garbage collector's time, and both canaries."""
    f = tmp_path / "times.json"
    r = subprocess.run([sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--device", "cpu",
                        "--tokens", "40", "--times-file", str(f), "--cpu-clocks"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-500:]
    d = json.loads(f.read_text())
    assert len(d["thread_cpu_ms"]) == len(d["process_cpu_ms"]) == len(d["runq_wait_ms"]) == 40
    # a CPU decode loop is on its thread's CPU, or waiting in the run queue for one on a busy machine, for most of
    # each token, and no thread can use more CPU than the whole process (torch's intra-op threads may add to it)
    assert 0.3 * sum(d["ms"]) < sum(d["thread_cpu_ms"]) + sum(d["runq_wait_ms"])
    assert sum(d["thread_cpu_ms"]) <= sum(d["process_cpu_ms"]) + 1.0
    assert all(w >= 0 for w in d["runq_wait_ms"])
    assert len(d["canary_us"]) == 40 and all(c > 0 for c in d["canary_us"])
    assert len(d["canary_c_us"]) == 40 and all(0 < c < 5000 for c in d["canary_c_us"])
    assert all(len(d[k]) == 40 and all(x >= 0 and x == int(x) for x in d[k]) for k in ("minflt", "nvcsw", "nivcsw"))
    assert all(len(d[k]) == 40 and min(d[k]) >= 0 for k in tokens.GC_KEYS)


def test_the_demo_engines_gc_clock_sums_collections_per_thread():
    """Collections on the decode thread counted with their time, those on another thread (the agent's) apart."""
    import gc
    import threading

    from decodemon.engine_adapter.demo import GcClock

    clock = GcClock(threading.get_ident())
    gc.callbacks.append(clock)
    try:
        junk = []
        for _ in range(20000):  # cycles for the collector to walk
            a, b = [], []
            a.append(b)
            b.append(a)
            junk.append(a)
        gc.collect()
        other = threading.Thread(target=gc.collect)
        other.start()
        other.join()
    finally:
        gc.callbacks.remove(clock)
    assert clock.n >= 1 and clock.ms > 0 and clock.other_ms > 0 and len(junk) == 20000
    n = clock.n
    gc.collect()  # no longer counted
    assert clock.n == n


def test_cuda_graph_step_warms_up_outside_the_capture_and_replays_the_captured_step(monkeypatch):
    """The demo engine captures a step this one way (torch.cuda faked: no GPU in CI)."""
    import contextlib

    import torch

    from decodemon.engine_adapter.model import cuda_graph_step

    log = []

    class Stream:
        def wait_stream(self, other):
            log.append("wait")

    class Graph:
        def replay(self):
            log.append("replay")

    @contextlib.contextmanager
    def ctx(name):
        log.append(f"enter {name}")
        yield
        log.append(f"exit {name}")

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: ctx("side stream"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: ctx("capture"))
    n = [0]

    def step():
        n[0] += 1
        log.append("step")
        return f"out{n[0]}"

    replay = cuda_graph_step(step, lambda: log.append("reset"))
    assert log == ["wait", "enter side stream", "step", "step", "step", "exit side stream", "wait", "sync", "reset",
                   "enter capture", "step", "exit capture", "reset"]
    assert replay() == "out4" and log[-1] == "replay" and n[0] == 4  # replays the graph; no step runs again
