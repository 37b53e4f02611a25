"""The eighteenth session's H200 runs 41-42 and its diagnostics (monitor CPU, migrations, the PM image reset):
what docs/benchmarks.md, the README and the closing note quote, from the committed raw files."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
H200 = ROOT / "docs" / "h200"
RUNS = (41, 42)
DOC = (ROOT / "docs" / "benchmarks.md").read_text()
SEC = DOC.split("## Eighteenth session (", 1)[1].split("## Seventeenth session", 1)[0]


def _load(name: str):
    return json.loads((H200 / f"{name}_2026-11-30.json").read_text())


def _overhead():
    spec = importlib.util.spec_from_file_location("overhead", ROOT / "benchmarks" / "overhead.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _runs():
    return {n: {r["mode"]: r for r in _load(f"overhead_session18_run{n}")["results"]} for n in RUNS}


def test_runs_41_and_42_are_the_seventeenth_sessions_command():
    for n in RUNS:
        run = _load(f"overhead_session18_run{n}")
        assert run["env"]["command"] == ("python benchmarks/overhead.py --phase-s 4 --pairs 5 --long-s 20 "
                                         "--eager-pairs 8 --eager-phase-s 10 --profiler-phase-s 4 --modes eager,graph")
        assert run["env"]["driver"] == "580.159.04" and run["env"]["gpu"] == "NVIDIA H200"
        assert run["env"]["date"] == "2026-11-30"


def test_the_quoted_medians_p99s_and_accuracy_are_the_runs_own():
    r2 = lambda x: round(x, 2)  # noqa: E731
    r3 = lambda x: round(x, 3)  # noqa: E731
    got = _runs()
    e41, e42, g41, g42 = got[41]["eager"], got[42]["eager"], got[41]["graph"], got[42]["graph"]
    assert [r2(e["D"]["overhead_pct_median"]) for e in (e41, e42)] == [7.78, 5.1]
    assert [r2(e["D"]["noise_floor_bracketed_pct"]) for e in (e41, e42)] == [14.81, 0.76]
    assert [r2(e["D"]["overhead_pct_median_after_first"]) for e in (e41, e42)] == [9.63, 3.18]
    assert [r2(e["core_c"]["D"]["overhead_pct_median"]) for e in (e41, e42)] == [0.97, -2.8]
    assert [r2(e["core_c"]["D"]["noise_floor_bracketed_pct"]) for e in (e41, e42)] == [1.35, 0.83]
    assert [r2(e["core"]["D"]["overhead_pct_median"]) for e in (e41, e42)] == [0.47, -2.01]
    assert [(r3(e["D"]["p99_ratio_median"]), r3(e["D"]["p99_ratio_median_after_first"])) for e in (e41, e42)] == [
        (1.08, 1.082), (1.002, 0.983)]
    assert [r3(e["core_c"]["D"]["p99_ratio_median"]) for e in (e41, e42)] == [1.043, 1.025]
    assert [e["speeds"]["u_slow"] for e in (e41, e42)] == [[2, 12], [1, 12]]
    assert [e["speeds"]["observed_slow"] for e in (e41, e42)] == [[6, 11], [5, 11]]
    assert [r2(g["D"]["overhead_pct_median"]) for g in (g41, g42)] == [-0.23, -0.94]
    assert [r3(g["D"]["p99_ratio_median"]) for g in (g41, g42)] == [1.015, 1.026]
    assert [r2(x["P"]["overhead_pct_median"]) for x in (e41, g41, e42, g42)] == [44.28, 39.14, 86.83, 37.81]
    sw = e42["switches"]["D"]
    assert (round(sw["median_ms_with"], 2), round(sw["median_ms_without"], 2), sw["share_with"]) == (22.13, 19.87,
                                                                                                  0.117)
    assert [e["switches"]["D"]["per_s"] for e in (e41, e42)] == [20.3, 20.2]
    assert [round(e["D_all"]["median_ms"], 2) for e in (e41, e42)] == [25.01, 20.1]
    assert [round(e["U_all"]["median_ms"], 2) for e in (e41, e42)] == [23.35, 20.51]
    for r in (e41, e42, g41, g42):
        acc = r["accuracy"]
        assert round(acc["decodemon_launches_per_token"], 1) == round(acc["profiler_kernels_per_token"], 1)
        assert abs(acc["decodemon_kernel_ms_per_token"] / acc["profiler_kernel_ms_per_token"] - 1) < 0.004
    for row in ("| eager median raw (noise floor) | +7.78% (±14.81%) | +5.10% (±0.76%) |",
                "| eager median, C canary (floor) | +0.97% (±1.35%) | −2.80% (±0.83%) |",
                "| graph median (noise floor) | −0.23% (±0.27%) | −0.94% (±1.72%) |",
                "| torch.profiler, eager / graph | +44.28% / +39.14% | +86.83% / +37.81% |"):
        assert row in SEC


def test_windows_came_within_5_s_in_run_42_and_just_over_in_run_41():
    ov = _overhead()
    got = _runs()
    g41, g42 = ov.window_gaps(got[41]["eager"]), ov.window_gaps(got[42]["eager"])
    assert (min(g41), max(g41)) == (5.0, 5.05) and (min(g42), max(g42)) == (4.76, 4.81)
    assert ov.window_gaps(got[42]["eager"], "Dlong") == [4.76]
    assert all(ov.window_gaps(got[n]["graph"], "Dlong") == [4.0] for n in RUNS)
    assert [ov.pm_continuous(got[n][m]) for n in RUNS for m in ("eager", "graph")] == [(9, 9), (6, 6)] * 2
    lines = ov.acceptance_lines(_load("overhead_session18_run42")["results"])
    assert "windows every 4.81 s at most (met)" in lines[2] and "median +5.10% raw (not met)" in lines[2]
    assert "-2.80% by the C canary (met)" in lines[2] and "median -0.94% raw (met)" in lines[3]
    assert "4.76–4.81 s" in SEC and "5.00–5.05 s" in SEC


def test_the_monitor_and_machine_counters_quoted_are_the_runs_own():
    got = _runs()
    vm = {(n, m): got[n][m]["vm"] for n in RUNS for m in ("eager", "graph")}
    assert [round(vm[(n, m)]["monitor_cpu_ms"][1], 1) for n in RUNS for m in ("eager", "graph")] == [
        223.3, 507.4, 41.8, 98.2]
    assert [round(vm[(n, m)]["irq_TLB"][1], 1) for n in RUNS for m in ("eager", "graph")] == [41.2, 93.9, 3.6, 6.0]
    assert [round(vm[(n, m)]["engine_minflt"][1]) for n in RUNS for m in ("eager", "graph")] == [220, 429, 235, 417]
    # the seventeenth session's runs, for the "before" figures
    before = [{r["mode"]: r for r in _load(f"overhead_session17_run{n}")["results"]} for n in (38, 39, 40)]
    mon = [b[m]["vm"]["monitor_cpu_ms"][1] for b in before for m in ("eager",)] + [vm[(41, "eager")]["monitor_cpu_ms"][1]]
    assert 220 < min(mon) and max(mon) < 231
    assert "| monitor CPU a second, eager / graph | 223 / 507 ms | 42 / 98 ms |" in SEC


def test_the_monitors_start_was_numpys_compile_and_the_pools_are_pool_runs_own():
    for mode, wall in (("eager", 10.77), ("graph", 6.76)):
        live = _load(f"monitor_cpu_live_session18_{mode}")
        tl = dict((round(t, 1), c) for t, c in live["plain"]["cpu_timeline"])
        assert live["plain"]["wall_s"] == wall and tl[0.5] == 2.18 and live["plain"]["children_cpu_s"] > 2.2
    prof = (H200 / "monitor_profile_session18_eager_2026-11-30.txt").read_text()
    assert re.search(r"\n\s+202\s+1\.120\s+.*builtins\.compile", prof)
    specs = [f"{H200}/overhead_session1{7 if n < 41 else 8}_run{n}_2026-11-30.json:"
             f"{H200}/overhead_session1{7 if n < 41 else 8}_run{n}_times_eager_dm_2026-11-30.json"
             for n in (38, 39, 40, 41, 42)]
    r = subprocess.run([sys.executable, str(ROOT / "scripts/pool_runs.py"), *specs], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == _load("pool_session18_runs38-42_eager")
    p = out["pooled"]
    assert [(p[v]["pairs"], p[v]["overhead_pct_median"], p[v]["overhead_pct_interval_90"]) for v in
            ("raw", "core", "core_c")] == [(40, 2.442, [0.356, 4.166]), (40, 0.802, [-0.572, 1.692]),
                                           (40, 0.072, [-1.282, 0.844])]
    assert "| raw | +2.44% | +0.36% .. +4.17% |" in SEC and "| C canary | +0.07% | −1.28% .. +0.84% |" in SEC


def test_the_decode_thread_never_moved_and_its_waits_did_not_follow_the_ticks():
    for name, cpu, first in (("defaults", "12", 256.2), ("tick1", "15", 263.9)):
        m = _load(f"migrations_session18_{name}")
        assert all(list(p["cpus_seen"]) == [cpu] and p["nr_migrations_per_s"] == 0.0 for p in m["phases"])
        u = [p["voluntary_ctxt_switches_per_s"] for p in m["phases"] if p["label"] == "U"]
        d = [p["voluntary_ctxt_switches_per_s"] for p in m["phases"] if p["label"] == "D"]
        assert set(u) == {0.0} and d[0] == first and all(21.0 < x < 23.5 for x in d[1:])
    assert _load("migrations_session18_tick1")["agent_args"] == "--agent-tick 1.0"


def test_the_pm_image_layout_and_reset_figures_are_the_scripts_output():
    r = _load("pm_reset_session18")
    assert r["sizes"] == {"256": 3744492, "512": 7486444, "1024": 14970348}
    assert (r["header_bytes"], r["bytes_per_sample"]) == (2540.0, 14617.0)
    pumps = r["pumps"]
    assert all(p["written_to_byte"] == p["predicted_extent"] == 2540 + 14617 * p["samples"] for p in pumps)
    assert all(p["equal_to_template_after_reset"] and p["overflow"] == 0 for p in pumps)
    times = {m: [p["reset_ms"] for p in pumps if p["reset"] == m] for m in ("copy", "init")}
    assert (min(times["copy"]), max(times["copy"])) == (2.625, 3.796)
    assert (min(times["init"]), max(times["init"])) == (3.753, 5.428)
    part = [p["partial_copy_ms"] for p in pumps]
    assert (min(part), max(part)) == (0.923, 1.596)
    assert max(p["gap_from_last_pump_us"] or 0 for p in pumps) == 1.5
    # the agent's own account of the new reset, in two attaches on the H200
    chk = _load("pm_check_attach_session18")
    for k, (cpu, reset) in ((1, ("1.88", "1.01")), (2, ("1.75", "0.93"))):
        probe = chk[f"attach{k}"]["probe"]
        assert probe["pm"].startswith("armed") and not probe.get("pm_lost")
        assert probe["pm_cpu"].startswith(f"{cpu} ms of agent CPU per pump") and f"{reset} of it resetting 5.2 MB" in \
            probe["pm_cpu"]


def test_the_migration_and_monitor_cpu_scripts_run_on_the_tiny_cpu_engine(tmp_path):
    """Dry runs of the device scripts of calls 2 and 4 on this machine: each writes its JSON with the phases it
    ran (what the H200's figures were read from)."""
    r = subprocess.run([sys.executable, str(ROOT / "scripts/h200_migrations.py"), str(tmp_path / "m"), "--cpu",
                        "--phase-s", "1.5", "--rounds", "1"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    m = json.loads((tmp_path / "m" / "migrations.json").read_text())
    assert [p["label"] for p in m["phases"]] == ["U", "D", "U"]
    assert all(p["samples"] > 50 and "voluntary_ctxt_switches_per_s" in p for p in m["phases"])
    assert all(0.0 <= p["asleep_share"] <= 1.0 and isinstance(p["asleep_on"], dict) for p in m["phases"])
    r = subprocess.run([sys.executable, str(ROOT / "scripts/h200_migrations.py"), str(tmp_path / "v"), "--cpu",
                        "--phase-s", "1", "--rounds", "1", "--variants", ";--no-pm"], capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    v = json.loads((tmp_path / "v" / "migrations.json").read_text())
    assert [p["label"] for p in v["phases"]] == ["U", "D0", "U", "D1", "U"]
    assert v["variants"] == {"D0": "", "D1": "--no-pm"} and v["by_label"]["U"]["phases"] == 3
    assert v["by_label"]["U"]["voluntary_ctxt_switches_per_s"] < 2.0  # an unobserved decode thread hardly waits
    r = subprocess.run([sys.executable, str(ROOT / "scripts/h200_monitor_cpu_live.py"), str(tmp_path / "c"), "--cpu",
                        "--phase-s", "2"], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-1500:] + r.stderr[-1500:]
    live = json.loads((tmp_path / "c" / "monitor_cpu_live.json").read_text())
    assert live["plain"]["rc"] == 0 and live["plain"]["children_cpu_s"] > 0 and live["profiled_rc"] == 0
    assert {"U1", "D", "U2", "Dprof", "U3"} <= set(live["engine_threads"])
    assert "cumulative" in (tmp_path / "c" / "monitor_profile.txt").read_text()


def test_the_tiny_engines_per_thread_faults_quoted_are_the_dry_runs_own():
    d = json.loads((ROOT / "docs/cpu/monitor_cpu_live_tiny_session18_2026-11-30.json").read_text())
    faults = {k: v["threads"]["python"]["minflt_per_s"] for k, v in d["engine_threads"].items()}
    assert (min(faults[k] for k in ("U1", "U2", "U3")), max(faults[k] for k in ("U1", "U2", "U3"))) == (28.0, 35.0)
    assert sorted(faults[k] for k in ("D", "Dprof")) == [40.7, 47.2]
    assert {"dm-agent", "dm-session"} <= set(d["engine_threads"]["D"]["threads"])  # the agent's named threads
    assert "from 28–35 to 41–47 a second while attached" in SEC
