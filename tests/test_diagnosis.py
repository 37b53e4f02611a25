"""The seeds' worked numbers, reproduced by `decodemon diagnose`; the rolling verdict; Amdahl."""

from __future__ import annotations

import json

import pytest

from decodemon.monitor import diagnosis as dx
from decodemon.monitor.ceilings import LAUNCH_IDLE_THRESHOLD
from decodemon.monitor.rolling import Rolling, advance
from tests.conftest import DATA, assert_one_line_error, cli


def diagnose(*args):
    r = cli("diagnose", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_bandwidth_ceiling_3600_tok_s_is_not_the_constraint():
    d = diagnose("--ms-per-token", 281.6, "--bytes-per-token", 10.6e9, "--bandwidth-gbs", 38000)
    bw = d["candidates"]["bandwidth"]
    assert bw["state"] == "ruled_out"
    assert bw["value"] == pytest.approx(1009, rel=0.01)  # ~1000x below the floor
    assert 1e3 / d["bandwidth_floor_ms"] == pytest.approx(3585, rel=0.01)  # the ~3600 tok/s ceiling


def test_101_us_per_kernel_is_not_launch_the_kernels_are_slow():
    d = diagnose("--ms-per-token", 281.6, "--kernels-per-token", 2790)
    assert d["us_per_kernel"] == pytest.approx(101, abs=0.5)
    assert d["candidates"]["launch"]["state"] == "ruled_out"
    # the kernels are the cost, and with no bytes per token nothing says which ceiling: unknown, and what decides
    assert d["ceiling"] == "unknown" and "bytes per token" in d["remedy"]


def test_6_us_per_kernel_is_launch_bound():
    d = diagnose("--ms-per-token", 16.6, "--kernels-per-token", 2790)
    assert d["us_per_kernel"] == pytest.approx(5.95, abs=0.1)
    assert d["ceiling"] == "launch"


def test_launch_has_one_rule_worded_once_whatever_prices_its_idle():
    """Kernel time traced, a floor, PM's GPU busy, or the launch count alone: each estimates the idle its own way
    (said in the detail), and every one is held to the same threshold."""
    ways = {"traced": dx.Inputs(ms_per_token=20.0, kernels_per_token=1864, kernel_sum_ms_per_token=4.0),
            "floor": dx.Inputs(ms_per_token=20.0, kernels_per_token=1864, bytes_per_token=1.2e9, bandwidth_gbs=4081),
            "pm": dx.Inputs(ms_per_token=12.0, gpu_busy_pct=14.0, untraced=True),
            "count": dx.Inputs(ms_per_token=3.93, kernels_per_token=1864),
            "nothing": dx.Inputs(ms_per_token=3.93)}
    for way, i in ways.items():
        c = dx.diagnose(i).candidates["launch"]
        assert c.threshold == LAUNCH_IDLE_THRESHOLD, way
        assert c.state == (dx.UNKNOWN if way == "nothing" else dx.BINDING), way
    # launches that cannot fill the gap over the floor at an eager launch's cost do not explain it alone; the
    # estimate leaves LAUNCH unknown (not ruled out at 100% of the step idle), and kernel time is what decides
    far = dx.diagnose(dx.Inputs(ms_per_token=20.0, kernels_per_token=200, bytes_per_token=1.2e9, bandwidth_gbs=4081))
    assert far.candidates["launch"].state == dx.UNKNOWN and "do not explain" in far.candidates["launch"].detail
    assert far.ceiling == "unknown" and "kernels' time per token" in far.remedy
    assert "kernels fill the step" not in far.remedy + far.falsify  # no kernel time was given
    # too many launches for the gap: under an eager launch's least cost a host could not have launched them one by
    # one (the graphed step's 1864 kernels in 3.93 ms), so the estimate does not bind LAUNCH either
    quick = dx.diagnose(dx.Inputs(ms_per_token=3.93, kernels_per_token=1864, bytes_per_token=1.2e9,
                                  bandwidth_gbs=4081)).candidates["launch"]
    assert quick.state == dx.UNKNOWN and "less than the 5 µs an eager launch costs at least" in quick.detail


def test_one_diagnosis_reads_the_steps_idle_one_way_for_launch_and_occupancy():
    """A TP rank on the H200: its traced kernels fill 11% of the step, while PM's device-wide GPU busy reads 79%.
    LAUNCH binds on the step's idle; OCCUPANCY does not read the GPU as busy from the other instrument."""
    i = dx.Inputs(ms_per_token=34.87, kernels_per_token=1891, kernel_sum_ms_per_token=3.8, gpu_busy_pct=79.0,
                  small_grid_share_pct=70.3, sm_count=132)
    d = dx.diagnose(i)
    assert d.candidates["launch"].state == dx.BINDING and d.candidates["occupancy"].state == dx.UNKNOWN
    assert "the kernel share is 11% of it" in d.candidates["occupancy"].detail
    busy = dx.diagnose(dx.Inputs(ms_per_token=4.0, kernels_per_token=1891, kernel_sum_ms_per_token=3.8,
                                 gpu_busy_pct=79.0, small_grid_share_pct=70.3, sm_count=132))
    assert busy.candidates["occupancy"].state == dx.BINDING  # kernels filling the step: grids are what binds


def test_92_collectives_are_2_percent_comm_ruled_out():
    d = diagnose("--ms-per-token", 281.6, "--collectives-per-token", 92, "--us-per-collective", 58.7)
    c = d["candidates"]["comm"]
    assert c["value"] == pytest.approx(1.92, abs=0.05)
    assert c["state"] == "ruled_out"


def test_below_the_floor_17_us_per_kernel_is_launch():
    d = diagnose("--ms-per-token", 7.80, "--bytes-per-token", 1.19e9, "--bandwidth-gbs", 380,
                 "--kernels-per-token", 280)
    assert d["bandwidth_floor_ms"] == pytest.approx(3.13, abs=0.01)
    assert d["us_per_kernel"] == pytest.approx(16.7, abs=0.1)
    assert d["ceiling"] == "launch"
    assert d["candidates"]["bandwidth"]["state"] == "unknown"  # 2.5x: neither within 2x nor 10x below


def test_a_serial_fraction_outside_0_1_says_amdahl_does_not_apply():
    r = cli("diagnose", "--speedup", 3, "--n", 2)
    assert r.returncode == 3 and "Amdahl's s solved: -0.333, not a fraction (outside 0..1" in r.stdout and "does not apply" in r.stdout
    r = cli("diagnose", "--speedup", 3, "--n", 2, "--json")
    j = json.loads(r.stdout)
    assert r.returncode == 3 and j["serial_fraction"] is None and j["serial_fraction_solved"] == pytest.approx(-0.3333, abs=1e-4)
    assert "outside" not in cli("diagnose", "--speedup", 1.5, "--n", 2).stdout


@pytest.mark.parametrize("speedup,s", [(2.44, 0.33), (1.10, 0.90)])
def test_serial_fraction_from_speedup(speedup, s):
    d = diagnose("--speedup", speedup, "--n", 8)
    assert d["serial_fraction"] == pytest.approx(s, abs=0.005)


def test_json_contract_has_every_key():
    d = diagnose("--ms-per-token", 10, "--kernels-per-token", 100)
    assert {"ceiling", "candidates", "remedy", "falsify"} <= set(d)
    assert set(d["candidates"]) == {"bandwidth", "occupancy", "launch", "comm"}
    for c in d["candidates"].values():
        assert {"value", "unit", "threshold", "state"} <= set(c)
        assert c["state"] in ("binding", "ruled_out", "unknown")


def test_the_kernels_own_time_lets_launch_read_the_idle_as_a_recording_does():
    """The eager H200 recording's figures (report: LAUNCH, 19.87 µs/launch): without the kernels' time the gap over
    the floor is 21.8 µs a launch, more than an eager launch costs, so LAUNCH cannot be named; with it, it is."""
    figs = ["--ms-per-token", 40.9, "--kernels-per-token", 1863, "--bytes-per-token", 1.242e9, "--bandwidth-gbs", 4128]
    assert diagnose(*figs)["ceiling"] == "unknown"  # 32.9x the floor: neither bandwidth nor grids bind
    d = diagnose(*figs, "--kernel-ms-per-token", 3.88)
    launch = d["candidates"]["launch"]
    assert d["ceiling"] == "launch" and d["us_per_kernel"] == pytest.approx(19.87, abs=0.01)
    # the number is what its threshold reads: the idle's share of the step
    assert launch["value"] == pytest.approx(100 * (40.9 - 3.88) / 40.9, abs=0.01)
    assert launch["unit"] == "% of step GPU idle" and launch["quantity"] == "idle_pct_of_step"


def test_nothing_known_is_unknown_and_exits_as_nothing_measured():
    r = cli("diagnose", "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["ceiling"] == "unknown"


@pytest.mark.parametrize("args", [["--ms-per-token", "0"], ["--ms-per-token", "-1"], ["--ms-per-token", "nan"],
                                  ["--ms-per-token", "1e30"], ["--n", "8"], ["--speedup", "2", "--n", "1"],
                                  ["--kernels-per-token", "abc"], ["--us-per-collective", "3"],
                                  ["--ms-per-token", "4", "--kernel-ms-per-token", "9"],
                                  ["--ms-per-token", "10", "--bytes-per-token", "1e9"], ["--bandwidth-gbs", "4000"]])
def test_bad_numbers_are_one_line(args):
    assert_one_line_error(cli("diagnose", *args))


def test_rolling_verdict_needs_two_windows_to_change():
    r = Rolling()
    r = advance(r, "launch", "12:00:00", {"ms/token": 13.1, "GPU busy %": 24})
    assert r.ceiling == "launch"
    r = advance(r, "occupancy", "12:00:04", {"ms/token": 3.2, "GPU busy %": 95})
    assert r.ceiling == "launch" and r.pending == "occupancy"
    r = advance(r, "launch", "12:00:08", {"ms/token": 13.0, "GPU busy %": 25})  # a flap resets the streak
    assert r.pending == ""
    r = advance(r, "occupancy", "12:03:06", {"ms/token": 3.3, "GPU busy %": 94})
    r = advance(r, "occupancy", "12:03:10", {"ms/token": 3.2, "GPU busy %": 95})
    assert r.ceiling == "occupancy"
    assert r.history[-1].text() == "LAUNCH → OCCUPANCY at 12:03:10: ms/token 13 → 3.2, GPU busy % 25 → 95"


def test_scaling_figure_before_the_last_verdict_change_is_stale():
    sc = dx.scaling(2.44, 8, measured_at="2026-09-01T10:00", last_change_at="2026-10-01T10:00")
    assert sc.stale and sc.serial_fraction == pytest.approx(0.326, abs=0.001)
    assert not dx.scaling(1.1, 8, "2026-11-01T00:00", "2026-10-01T10:00").stale


# "The kernels are the cost" (§3.1) resolves into a ceiling whenever the counters can decide.
FULL = dict(ms_per_token=7.7, kernels_per_token=2256, kernel_sum_ms_per_token=7.6, gpu_busy_pct=99.0,
            collectives_per_token=0.0, sm_count=132)


def test_kernels_filling_the_step_past_twice_the_floor_are_not_bandwidth_and_say_what_was_measured():
    """The seeds' rule: within 2x of bytes ÷ bandwidth is BANDWIDTH. A step 2.4x its floor whose kernels fill it,
    with big grids and SM active high (llama.cpp's 1B graphed step on an H100 read 2.64x, DRAM 39% of peak, SM
    active 83%), is left open, saying what was measured and what would decide."""
    d = dx.diagnose(dx.Inputs(**FULL, bytes_per_token=15e9, bandwidth_gbs=4700, small_grid_share_pct=10.0,
                              sm_active_pct=83.0, dram_gbs=1830.0, top_kernel=("mul_mat_vec_f16", 5100.0)))
    assert d.ceiling == "unknown" and d.candidates["bandwidth"].state == dx.UNKNOWN
    assert "2.41× the bandwidth floor" in d.remedy and "DRAM at 39% of 4700 GB/s" in d.remedy
    assert "10% of kernel time in small grids" in d.remedy and "SM active 83%" in d.remedy
    assert "seeds' 2×" in d.remedy and "mul_mat_vec_f16" in d.falsify
    within = dx.diagnose(dx.Inputs(**FULL, bytes_per_token=19e9, bandwidth_gbs=4700, small_grid_share_pct=10.0))
    assert within.ceiling == "bandwidth"  # 1.9x: the 2x rule binds it


def test_kernels_filling_the_step_far_above_the_floor_with_small_grids_are_occupancy():
    d = dx.diagnose(dx.Inputs(**FULL, bytes_per_token=1.2e9, bandwidth_gbs=4200, small_grid_share_pct=40.0))
    assert d.candidates["bandwidth"].value > 20 and d.ceiling == "occupancy"
    # SM active far below GPU busy says the same with no grid read
    d = dx.diagnose(dx.Inputs(**FULL, bytes_per_token=1.2e9, bandwidth_gbs=4200, sm_active_pct=20.0))
    assert d.ceiling == "occupancy"


def test_kernels_filling_the_step_with_nothing_to_decide_is_unknown_naming_the_measurement():
    d = dx.diagnose(dx.Inputs(**FULL))
    assert d.ceiling == "unknown" and not any(c.state == dx.BINDING for c in d.candidates.values())
    assert "bytes per token" in d.remedy and "BANDWIDTH" in d.falsify and "OCCUPANCY" in d.falsify


def test_the_headline_is_always_a_binding_candidate_or_unknown():
    """One rule (diagnosis.verdict): within 2x of the floor BANDWIDTH binds; past it, with nothing leaning to
    grids, nothing binds, however full of kernels the step is."""
    near = dx.diagnose(dx.Inputs(**FULL, bytes_per_token=4e9, bandwidth_gbs=1000.0))  # 7.7 ms / a 4 ms floor
    assert near.ceiling == "bandwidth" and near.candidates["bandwidth"].state == dx.BINDING
    far = dx.diagnose(dx.Inputs(**FULL, bytes_per_token=4e9, bandwidth_gbs=4000.0))  # 7.7x the floor
    assert far.ceiling == "unknown" and far.candidates["bandwidth"].state == dx.UNKNOWN
    for d in (near, far):
        assert d.ceiling == "unknown" or d.candidates[d.ceiling].state == dx.BINDING


def test_launch_bound_between_graph_replays_does_not_say_capture_a_graph():
    # a graphed step whose host work between replays binds (transformers' static-cache generate on the H200)
    i = dx.Inputs(ms_per_token=4.0, kernels_per_token=553, kernel_sum_ms_per_token=1.9, gpu_busy_pct=47.0,
                  collectives_per_token=0.0, graph_launches_per_token=1.0, sm_count=132)
    d = dx.diagnose(i)
    assert d.ceiling == "launch"
    assert "between replays" in d.remedy and "capture" not in d.falsify.lower()
    assert "host" in d.falsify
    eager = dx.diagnose(dx.Inputs(ms_per_token=31.0, kernels_per_token=1636, kernel_sum_ms_per_token=3.4,
                                  gpu_busy_pct=12.0, collectives_per_token=0.0, graph_launches_per_token=0.0))
    assert "CUDA graph" in eager.falsify


def test_the_dram_counters_price_the_floor_with_no_token_clock():
    # a graphed Llama-8B-shaped loop that marks nothing: 2.87 TB/s of DRAM traffic against a 4.25 TB/s copy
    d = dx.diagnose(dx.Inputs(dram_gbs=2870.0, bandwidth_gbs=4250.0, gpu_busy_pct=93.0))
    bw = d.candidates["bandwidth"]
    assert d.ceiling == "bandwidth" and bw.state == dx.BINDING
    assert bw.value == pytest.approx(4250 / 2870) and "no token count" in bw.detail
    # an eager loop moving 1% of it is nowhere near its floor
    assert dx.diagnose(dx.Inputs(dram_gbs=40.0, bandwidth_gbs=4250.0)).candidates["bandwidth"].state == dx.RULED_OUT


def test_watched_from_outside_an_idle_gpu_is_the_hosts_step_with_its_number():
    """A server's token clock and PM's GPU busy, no traced window (no launch count): the idle share prices the host."""
    d = dx.diagnose(dx.Inputs(ms_per_token=12.0, gpu_busy_pct=14.0, untraced=True))
    launch = d.candidates["launch"]
    assert d.ceiling == "launch" and launch.state == dx.BINDING
    assert launch.value == pytest.approx(86.0) and launch.unit == "% of step GPU idle"
    assert "1.68 ms" in d.falsify and "host" in d.falsify  # toward the GPU's busy time, 14% of 12 ms
    assert d.us_per_kernel is None  # no launch count: no µs a launch is claimed
    # where a traced window is still to come, the counters alone do not price LAUNCH: the window will
    assert dx.diagnose(dx.Inputs(ms_per_token=12.0, gpu_busy_pct=14.0)).candidates["launch"].state == dx.UNKNOWN


def test_watched_from_outside_a_busy_gpu_resolves_by_the_counters():
    busy = dict(ms_per_token=7.7, gpu_busy_pct=97.0, untraced=True)
    assert dx.diagnose(dx.Inputs(**busy, dram_gbs=3900.0, bandwidth_gbs=4300.0)).ceiling == "bandwidth"
    assert dx.diagnose(dx.Inputs(**busy, sm_active_pct=38.0)).ceiling == "occupancy"  # SM active < half of busy
    d = dx.diagnose(dx.Inputs(**busy))
    assert d.candidates["launch"].state == dx.RULED_OUT and d.ceiling == "unknown"  # busy, nothing says why
    assert dx.diagnose(dx.Inputs(ms_per_token=7.7, gpu_busy_pct=65.0, untraced=True)).ceiling == "unknown"  # 35% idle: undecided


def test_occupancy_has_a_number_from_the_counters_when_no_window_gives_grids():
    """The graphed demo engine with its marks off (H200: SM active 21% of a 95%-busy GPU, no traced window): the
    OCCUPANCY candidate is priced by SM active over GPU busy, so the verdict comes with its number."""
    d = dx.diagnose(dx.Inputs(ms_per_token=3.97, gpu_busy_pct=95.0, sm_active_pct=21.0, untraced=True))
    occ = d.candidates["occupancy"]
    assert occ.state == dx.BINDING and occ.value == pytest.approx(22.1, abs=0.1) and "no grid dims" in occ.detail
    assert d.ceiling == "occupancy"
    full = dx.diagnose(dx.Inputs(ms_per_token=3.97, gpu_busy_pct=95.0, sm_active_pct=90.0, untraced=True))
    assert full.candidates["occupancy"].state == dx.RULED_OUT
    idle = dx.diagnose(dx.Inputs(ms_per_token=12.0, gpu_busy_pct=14.0, sm_active_pct=3.0))
    assert idle.candidates["occupancy"].state == dx.UNKNOWN  # an idle GPU: grids are not yet what binds
    assert dx.diagnose(dx.Inputs(ms_per_token=3.97)).candidates["occupancy"].value is None  # nothing to price it
    # near the bandwidth floor the counters' ratio alone does not bind (gaps inside a graph count as busy), and at
    # 2.5x the floor neither does BANDWIDTH (the seeds' 2x)
    near = dx.diagnose(dx.Inputs(ms_per_token=10.0, gpu_busy_pct=90.0, sm_active_pct=40.0, untraced=True,
                                 bytes_per_token=16e9, bandwidth_gbs=4000.0))
    assert near.candidates["occupancy"].state == dx.UNKNOWN and near.ceiling == "unknown"
    nearer = dx.diagnose(dx.Inputs(ms_per_token=7.0, gpu_busy_pct=90.0, sm_active_pct=40.0, untraced=True,
                                   bytes_per_token=16e9, bandwidth_gbs=4000.0))
    assert nearer.ceiling == "bandwidth"


def test_diagnose_refuses_the_physically_impossible_and_its_words_follow_what_was_given():
    """1,190 GB/s achieved on a 380 GB/s card and COMM at 540% of the step are refused in one line; a lone
    --ms-per-token prices nothing (exit 3, as no figure at all does) and LAUNCH asks only for what is missing."""
    import subprocess
    import sys

    def dm(*args):
        return subprocess.run([sys.executable, "-m", "decodemon.monitor.cli", "diagnose", *args],
                              capture_output=True, text=True, timeout=60)

    r = dm("--ms-per-token", "1", "--bytes-per-token", "1.19e9", "--bandwidth-gbs", "380")
    assert r.returncode == 2 and "more than the device's 380 GB/s" in r.stderr and len(r.stderr.splitlines()) == 1
    r = dm("--ms-per-token", "1", "--collectives-per-token", "54", "--us-per-collective", "100")
    assert r.returncode == 2 and "540% of the 1 ms step" in r.stderr
    r = dm("--ms-per-token", "7.8")
    assert r.returncode == 3 and "needs kernels/token" in r.stdout and "needs ms/token" not in r.stdout
    assert dm().returncode == 3
    assert dm("--ms-per-token", "7.8", "--kernels-per-token", "900").returncode == 0


def test_two_sources_for_gpu_busy_that_disagree_are_flagged_with_the_likely_reason():
    """PM's GPU busy and the traced kernels' share of the step 2× apart on a TP rank: flagged, with why. The
    static-cache generate() window, read between marks made ahead of the GPU, was 4.3× apart; read on the GPU's
    step it agrees."""
    from decodemon.monitor.analysis.agreement import busy_disagreement
    from decodemon.monitor.render import summary_json
    from decodemon.monitor.sources.collect import collect_recording

    j = summary_json(collect_recording(DATA / "h200_tp2_eager_samewindow_rank0.dmon").snapshot())
    # the TP rank's traced token waited for its peer inside the window: PM 42% over the last 5 s against kernels 8%
    # of the step, their 6.8 ms of waiting taken out as the diagnosis does; PM over the traced tokens themselves
    # reads as low as the kernels, so the words name the span's average as what stands apart, not tracing
    near = j["pm_vs_window"]["pm_gpu_busy_pct"]
    assert "5.6× apart" in j["busy_sources_disagree"] and "CUPTI's own cost" not in j["busy_sources_disagree"]
    assert f"over the traced tokens PM itself read {near:.1f}%" in j["busy_sources_disagree"]
    assert j["kernel_share_of_step_pct"] == pytest.approx(7.6, abs=0.1)
    j = summary_json(collect_recording(DATA / "h200_hf_generate_static.dmon").snapshot())
    assert j["busy_sources_disagree"] is None
    assert busy_disagreement(50.0, 40.0) is None and busy_disagreement(None, 40.0) is None
    assert "ahead of the GPU" in busy_disagreement(20.0, 90.0)


def test_launch_never_binds_on_a_replayed_graph_with_the_gpu_busy():
    """The step a replayed CUDA graph, the GPU 94% busy: whatever the idle between launches works out to, the host
    is not what the step waits for. The same numbers eager still bind."""
    graphed = dx.diagnose(dx.Inputs(ms_per_token=5.9, kernels_per_token=776, graph_launches_per_token=1.0,
                                    gpu_busy_pct=94.0))
    assert graphed.candidates["launch"].state == dx.RULED_OUT and "94% busy" in graphed.candidates["launch"].detail
    eager = dx.diagnose(dx.Inputs(ms_per_token=5.9, kernels_per_token=776, gpu_busy_pct=94.0))
    assert eager.candidates["launch"].state == dx.BINDING


def test_a_host_that_idles_the_gpu_between_replays_is_named_when_its_share_is_the_largest():
    """A graphed step of 3.1 ms whose kernels take 2.03 (transformers' static-cache generate() on an H200): 35% of
    the step has no kernel, more than the small grids (37% of the kernel time, 24% of the step) or the floor could
    claim. LAUNCH binds as the host's work between replays, and the falsifier is to move that work, not to capture
    a graph; with the kernels filling the step it does not."""
    i = dx.Inputs(ms_per_token=3.1, kernels_per_token=553, kernel_sum_ms_per_token=2.03, gpu_busy_pct=60.0,
                  graph_launches_per_token=1.0, small_grid_share_pct=37.0, collectives_per_token=0.0,
                  bytes_per_token=1.2e9, bandwidth_gbs=4248.0, sm_count=132)
    d = dx.diagnose(i)
    assert d.ceiling == "launch" and "between replays" in d.candidates["launch"].detail
    assert "between replays" in d.remedy and "graph" not in d.falsify.split(":")[0].lower()
    full = dx.diagnose(dx.Inputs(**{**i.__dict__, "kernel_sum_ms_per_token": 3.0}))
    assert full.candidates["launch"].state == dx.RULED_OUT and full.ceiling != "launch"


def test_static_cache_generate_injected_into_plain_python_is_the_host_between_replays():
    """transformers' static-cache compiled generate(), started with plain python3 and injected on an H200
    (`bash benchmarks/h200.sh OUT static`, 2026-12-03): LAUNCH as the host's work between replays, with its idle
    share and the kernel time beside it."""
    from tests.conftest import DATA, cli

    r = cli("replay", DATA / "h200_hf_static_plain.dmon", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    launch = j["candidates"]["launch"]
    assert j["verdict"] == "launch" and launch["state"] == "binding"
    # over the whole recording (idle 46% over its last 5 s)
    assert "between replays" in launch["detail"] and "idle 47%" in launch["detail"]
    assert j["kernel_sum_ms_per_token"] == pytest.approx(1.81, abs=0.05) and j["graph_launches_per_token"] == 1.0
    assert j["kernel_sum_ms_per_token"] < 0.6 * j["ms_per_token"]


def test_a_cpu_target_with_no_token_timed_is_told_how_to_give_it_a_clock():
    from decodemon.monitor.advice import NO_CLOCK_REMEDY, NO_GPU_REMEDY

    d = dx.diagnose(dx.Inputs(no_gpu=True))
    assert d.ceiling == "unknown" and d.remedy == NO_CLOCK_REMEDY and "mark_token()" in d.remedy
    assert dx.diagnose(dx.Inputs(no_gpu=True, ms_per_token=4.2)).remedy == NO_GPU_REMEDY


def test_collectives_that_are_a_tenth_of_the_step_do_not_outrank_an_idle_that_is_most_of_it():
    # 21 collectives of 100 µs (10.5% of a 20 ms step) beside 1863 kernels that fill 3.88 ms of it: LAUNCH binds
    d = dx.diagnose(dx.Inputs(ms_per_token=20.0, kernels_per_token=1863, kernel_sum_ms_per_token=3.88,
                              collectives_per_token=21, us_per_collective=100))
    assert d.ceiling == "launch", d.candidates
    assert d.candidates["comm"].state == dx.UNKNOWN and "not what binds" in d.candidates["comm"].detail
    # the same collectives in a step the kernels fill: COMM still binds
    d = dx.diagnose(dx.Inputs(ms_per_token=20.0, kernels_per_token=200, kernel_sum_ms_per_token=19.5,
                              collectives_per_token=21, us_per_collective=100))
    assert d.ceiling == "comm", d.candidates


def test_a_launch_count_is_not_taken_for_the_kernels_launch_divides_by():
    """A launch is a host call: the graphed recording's one launch a token runs 1,864 kernels. Given as the kernels,
    it would price 2.7 ms of idle per kernel and call LAUNCH binding; diagnose refuses it, naming the flag it wants."""
    r = cli("diagnose", "--ms-per-token", "3.7278", "--launches-per-token", "1", "--kernel-ms-per-token", "1.0")
    assert_one_line_error(r)
    assert "give --kernels-per-token" in r.stderr and r.stdout == ""  # no verdict priced from it
