"""Each figure on the bundled and committed recordings says what it measured: the rate the bandwidth ratio implies is
told from the DRAM counters' rate, LAUNCH's number is in its threshold's unit, a batched engine with no depth is not
"priced at depth 0", PM's idle is not blamed on the host, the report names which window's kernel time it shows, the
top level's counts are told from the span's, and a provisional clock says so in the report too."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from decodemon.monitor.analysis.agreement import kernels_past_step
from decodemon.monitor.ceilings import Inputs
from decodemon.monitor.render.markdown import diagnosis_markdown
from decodemon.monitor.sources.collect import collect_recording
from decodemon.monitor.span import summary_snapshot
from tests.conftest import BUNDLED, DATA, cli


def _json(path, *args):
    r = cli("replay", (BUNDLED if path.startswith("h100_eager") or path.startswith("h100_graph") else DATA) / path,
            "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_bandwidths_rate_is_named_as_the_median_tokens_beside_the_dram_counters_mean():
    j = _json("h100_eager.dmon")
    detail, i = j["candidates"]["bandwidth"]["detail"], j
    rate = i["bytes_per_token"] / (i["ms_per_token"] * 1e-3) / 1e9
    assert f"in the {i['ms_per_token']:.4g} ms median token is {rate:.4g} GB/s" in detail
    moved = float(re.search(r"\(DRAM moved ([\d.]+) GB/s on average, PM's byte counters: dram_gbs\)", detail).group(1))
    assert moved == pytest.approx(i["dram_gbs"], rel=1e-3) and abs(moved - rate) > 1  # two rates, both named
    assert "achieved" not in detail
    plain = _json("h200_eager.dmon")["candidates"]["bandwidth"]["detail"]  # no PM: the model's bytes, said so
    assert "(the model's bytes: no DRAM counters)" in plain and "DRAM moved" not in plain


@pytest.mark.parametrize("path", ["h100_eager.dmon", "h100_graph.dmon", "h100_llama_cpp_server1b_np4.dmon",
                                  "h200_compiled_llama8b_nomarks.dmon"])
def test_launchs_number_is_the_idle_share_its_threshold_reads(path):
    j = _json(path)
    c = j["candidates"]["launch"]
    assert c["unit"].startswith("% of step GPU idle") and c["threshold"].startswith("GPU idle > 50% of the step")
    assert c["state"] == ("binding" if c["value"] >= 50 else "ruled_out" if c["value"] < 20 else "unknown") \
        or "graph" in c["detail"]  # a replayed graph's rule is its other candidates' shares
    if j["kernel_busy_ms_per_token"] is not None and j["kernels_per_token"]:
        # the idle the kernels' union leaves: kernels that run at once count once
        idle = max(0.0, j["ms_per_token"] - j["kernel_busy_ms_per_token"])
        assert c["value"] == pytest.approx(100 * idle / j["ms_per_token"], abs=0.01)
        assert j["us_per_kernel"] == pytest.approx(1e3 * idle / j["kernels_per_token"], abs=0.01)


def test_a_batched_engine_with_no_depth_is_priced_at_its_weights_and_says_so():
    j = _json("h200_hf_cb_4.dmon")
    detail = j["candidates"]["bandwidth"]["detail"]
    assert "no KV depth was reported, so no KV is counted" in detail and "KV depth 0" not in detail


def test_pms_idle_watched_from_outside_is_not_blamed_on_the_host():
    c = _json("h100_llama_cpp_server1b_np4.dmon")["candidates"]["launch"]
    assert c["state"] == "unknown" and "PM says how long the GPU idles, not why" in c["detail"]
    assert "the host's work between steps;" not in c["detail"]


def test_the_reports_kernel_time_names_its_window_and_the_median_launch_reads():
    s = summary_snapshot(collect_recording(str(DATA / "h200_eager.dmon")))
    md = diagnosis_markdown(s)
    line = next(ln for ln in md.splitlines() if "kernel time" in ln and "kernels/token:" in ln)
    assert f"kernel time {s.window.kernel_sum_ms_per_token:.3f} ms/token in the latest window" in line
    med = s.inputs.kernel_sum_ms_per_token
    assert (f"LAUNCH reads the span's windows' median, {med:.3f}" in line) == (
        f"{med:.3f}" != f"{s.window.kernel_sum_ms_per_token:.3f}")


def test_the_top_levels_counts_are_told_from_the_spans():
    whole, last = _json("h200_hf_cb_1.dmon"), _json("h200_hf_cb_1.dmon", "--last", "2")
    assert last["span"]["covers"] == "last" and last["span"]["tokens"] < last["tokens"] == whole["tokens"]
    assert last["steps"] == whole["steps"] and last["clock_steps"] < last["steps"]
    counts = last["span"]["counts"]
    assert "top level's tokens, steps and windows count the whole source" in counts and "span.tokens" in counts


def test_a_provisional_clock_says_so_in_the_report_as_in_json():
    for path, provisional in (("h200_hf_cb_16.dmon", True), ("h200_hf_cb_1.dmon", False)):
        assert _json(path)["clock_provisional"] is provisional
        md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / path))))
        assert ("provisional: the rate rests on fewer than 100 steps" in md) is provisional


def test_a_counted_clocks_mean_is_called_a_mean_wherever_its_ms_is_quoted():
    j = _json("h100_llama_cpp_server1b_np4.dmon")
    assert j["token_clock"] == "server_metrics" and "(a mean)" in j["ms_per_token_note"]
    detail = j["candidates"]["bandwidth"]["detail"]
    assert f"in the {j['ms_per_token']:.4g} ms mean step" in detail and "median" not in detail
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h100_llama_cpp_server1b_np4.dmon"))))
    assert "median step" not in md and "ms/step mean" in md


def test_diagnose_by_hand_says_its_figures_were_given_and_its_graph_win_is_at_best_the_floor():
    r = cli("diagnose", "--ms-per-token", 21.79, "--kernels-per-token", 1863, "--bytes-per-token", 1235129185,
            "--bandwidth-gbs", 2906, "--json")
    j = json.loads(r.stdout)
    assert "(the figures given)" in j["candidates"]["bandwidth"]["detail"]
    assert "median" not in j["candidates"]["bandwidth"]["detail"]
    assert j["us_per_kernel_note"].startswith("estimated: (ms/token − the bandwidth floor)")
    assert "at best ~0.425 ms/token" in j["predicted_win"] and "not traced" in j["predicted_win"]
    traced = json.loads(cli("diagnose", "--ms-per-token", 21.79, "--kernels-per-token", 1863, "--kernel-ms-per-token",
                            3.997, "--json").stdout)
    assert traced["us_per_kernel_note"].startswith("from the figures given:") and "at best" not in traced["predicted_win"]


def test_compare_says_when_the_kv_type_or_the_batch_differ_and_gives_a_one_sequence_loops_throughput():
    def both(a, b):
        r = cli("compare", a, b, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    j = both(DATA / "h100_llama_cpp_server1b_kvq8.dmon", DATA / "h100_llama_cpp_server1b_np4.dmon")
    assert "q8_0" in j["differ"]["kv"] and "f16" in j["differ"]["kv"]
    assert j["differ"]["batch"].startswith("A ran 1 token a step, B 4")
    assert "the KV cache type and the batch differ" in j["b_over_a_of"]["bytes_per_token"]
    j = both(BUNDLED / "h100_eager.dmon", DATA / "h200_hf_cb_4.dmon")
    t = j["throughput_tokens_per_s"]
    assert t["a"] == j["a"]["tokens_per_s"] and "compare the throughput" in j["differ"]["clock"]
    assert t["b"] == j["b"]["throughput_tokens_per_s"]  # the batched side's own figure
    assert j["b_over_a"]["throughput_tokens_per_s"] == pytest.approx(t["b"] / j["a"]["tokens_per_s"], rel=1e-3)


def test_the_serving_panel_says_its_rate_is_the_spans_and_its_count_since_the_start():
    from decodemon.monitor.widgets.serving import serving_lines
    from tests.test_screens_reasoning import texts

    s, t = texts(DATA / "h200_hf_cb_16.dmon", 6.0)
    line = next(ln for ln in serving_lines(s).plain.splitlines() if "tok/s in all" in ln)
    # the rate over the seconds the clock's steps cover (the header's), the count over the whole source
    assert f"(over {s.tokens.span_s:.1f} s of steps; {s.tokens_total} tokens since the start)" in line
    from decodemon.monitor.widgets.timeline import TimelinePanel
    # the calls' times were not traced; their count (the launches panel's) comes from the kernels
    assert "launch calls' times not traced" in t[TimelinePanel] and "counted from the kernels" in t[TimelinePanel]


def test_the_hot_kernels_columns_name_what_they_hold_and_the_sort_is_one_of_them():
    import asyncio

    from decodemon.monitor.widgets.kernels import KernelsPanel
    from tests.test_screens_reasoning import _app

    async def shown():
        app = _app(BUNDLED / "h100_eager.dmon", 6.0)
        async with app.run_test(size=(200, 50)) as pilot:
            await pilot.pause()
            panel = app.query(KernelsPanel).first()
            return str(panel.border_title), [str(c.label) for c in panel.columns.values()]
    title, cols = asyncio.run(shown())
    assert cols == ["kernel", "calls", "µs/call", "share", "grid/SMs", "warps"]  # warps: not the OCCUPANCY ceiling
    assert "sorted by share of kernel time" in title  # a column on screen, not an unseen µs/token


def test_occupancys_small_grid_share_says_how_much_of_it_only_fusing_shortens():
    j = _json("h100_graph.dmon")
    c = j["candidates"]["occupancy"]
    short = float(re.search(r"\((\d+)% of kernel time in calls under 4 µs, which fusing shortens", c["detail"]).group(1))
    us = float(re.search(r"kernels of calls under 4 µs \((\d+) µs/token\)", c["detail"]).group(1))
    assert short == pytest.approx(100 * us / (1e3 * j["kernel_sum_ms_per_token"]), abs=1)
    assert short < c["value"]  # a part of the small grids' share, named


def test_a_batched_engine_with_no_request_starts_says_why_it_has_no_time_to_first_token():
    j = _json("h200_hf_cb_4.dmon")
    assert j["time_to_first_token"] is None and j["time_to_first_token_note"].startswith("not seen")
    assert _json("h100_eager.dmon")["time_to_first_token_note"] is None  # one sequence: no such figure is asked


def test_comm_past_its_tenth_does_not_bind_where_the_idle_or_the_bytes_are_more_of_the_step():
    def diag(*figs):
        return json.loads(cli("diagnose", *figs, "--json").stdout)
    j = diag("--ms-per-token", 10, "--kernels-per-token", 500, "--kernel-ms-per-token", 6,
             "--collectives-per-token", 12, "--us-per-collective", 100)
    assert j["ceiling"] == "unknown" and j["candidates"]["comm"]["state"] == "unknown"
    assert "4 ms a token, LAUNCH's" in j["candidates"]["comm"]["detail"]  # 40% idle against 12% collectives
    j = diag("--ms-per-token", 8, "--bytes-per-token", 14e9, "--bandwidth-gbs", 3350,
             "--collectives-per-token", 10, "--us-per-collective", 100)
    assert j["ceiling"] == "bandwidth" and "BANDWIDTH binds" in j["candidates"]["comm"]["detail"]
    assert "more binds unless the GPU's idle or a binding floor is more of it" in j["candidates"]["comm"]["threshold"]


def test_launch_with_neither_kernel_time_nor_floor_is_unknown_across_a_launchs_range():
    c = json.loads(cli("diagnose", "--ms-per-token", 8, "--kernels-per-token", 300, "--json").stdout)["candidates"]
    assert c["launch"]["state"] == "unknown" and "idle 19–75% of the step" in c["launch"]["detail"]
    few = json.loads(cli("diagnose", "--ms-per-token", 80, "--kernels-per-token", 300, "--json").stdout)
    assert few["candidates"]["launch"]["state"] == "ruled_out"  # 20 µs a launch leaves the step 7.5% idle at most


def test_one_dtype_spelled_two_ways_is_one_model_and_one_token_steps_are_tokens():
    r = cli("compare", DATA / "h100_llama_cpp_lcpp8b_graphs.dmon", DATA / "h100_llama_cpp_server8b.dmon", "--json")
    differ = json.loads(r.stdout)["differ"]
    assert r.returncode == 0 and set(differ) == {"clock"}, r.stderr  # float16 and f16: one dtype, no "model"
    # what does differ: the loop's median token against the server's mean step (one token a step, so not units)
    assert differ["clock"].startswith("A's ms/token is a median (mark_token), B's a mean (server_metrics)")


def test_compare_json_refuses_the_apps_playback_options():
    for extra in (["--at", 3], ["--paused"], ["--speed", 4]):
        r = cli("compare", BUNDLED / "h100_eager.dmon", BUNDLED / "h100_graph.dmon", "--json", *extra)
        assert r.returncode == 2 and "place the app's playback" in r.stderr and not r.stdout


def test_the_report_says_when_the_floors_bytes_and_pms_dram_are_apart():
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h200_compiled_llama8b_nomarks.dmon"))))
    assert "- ⚠ bytes per token × tokens/s is 2743 GB/s, PM's DRAM 37% of 4814 GB/s is 1775: +55%" in md
    assert "⚠ bytes per token × tokens/s" not in diagnosis_markdown(
        summary_snapshot(collect_recording(str(BUNDLED / "h100_eager.dmon"))))


def test_a_grade_of_no_change_is_not_the_other_direction_and_says_it_is_the_sealed_state(tmp_path):
    from decodemon.monitor import ledger

    assert ledger.how_wrong(0.0, -60.0) == "no change to speak of (+0.0%), where -60.0% was predicted"
    led = tmp_path / "ledger.jsonl"
    assert cli("predict", BUNDLED / "h100_eager.dmon", "--change", "x", "--expect", "-60%", "--ledger", led).returncode == 0
    r = cli("grade", BUNDLED / "h100_eager.dmon", "--ledger", led)
    # graded against the very state it sealed: refused, in one line, and the prediction stays open
    assert r.returncode != 0 and not r.stdout and "Traceback" not in r.stderr
    assert "this is the recording the prediction was sealed from" in r.stderr  # its sealed state, by its bytes
    assert len(r.stderr.strip().splitlines()) == 1 and len(led.read_text().splitlines()) == 1


def test_a_serial_fraction_is_a_fraction_or_null_and_diagnose_refuses_collectives_past_their_kernels():
    r = cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon", "--json")
    j = json.loads(r.stdout)
    assert r.returncode == 0 and j["amdahl_applies"] is False and j["serial_fraction"] is None and j["solved_s"] > 1
    r = cli("diagnose", "--ms-per-token", 5, "--collectives-per-token", 64, "--us-per-collective", 50,
            "--kernels-per-token", 400, "--kernel-ms-per-token", 1)
    assert r.returncode == 2 and "more than the 1 ms of kernels they are part of" in r.stderr


def test_the_report_names_each_clocks_step():
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h200_eager_nomarks.dmon"))))
    assert "(a clock step, one the screen's tokens timed: one period of the GPU's kernels in a traced window), in the traced windows alone" in md
    assert "from one token mark to the next" not in md
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h200_known_kv262k.dmon"))))
    assert "(a clock step, one the screen's tokens timed: one CUDA graph replay the agent counted)" in md


def test_the_timeline_shows_no_share_for_a_lateness_json_calls_not_measured():
    from decodemon.monitor.widgets.timeline import TimelinePanel
    from tests.test_screens_reasoning import texts

    s, t = texts(DATA / "h200_hf_cb_4.dmon", 5.0)
    assert _json("h200_hf_cb_4.dmon")["gap_ms_per_token"]["host_late"] is None
    line = next(ln for ln in t[TimelinePanel].splitlines() if ln.startswith("idle gaps"))
    assert "host launched late" not in line and "not split" in line


def test_the_report_gives_a_tokens_bytes_measured_beside_the_models_in_the_caches_type():
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h100_llama_cpp_server1b_kvq8.dmon"))))
    assert ("- bytes a token: 3.088 GB measured (PM DRAM over the tokens counted), the model's 3.125 GB "
            "(weights + q8_0 KV at depth 60112, the latest reported)") in md
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h100_llama_cpp_server1b_np4.dmon"))))
    j = _json("h100_llama_cpp_server1b_np4.dmon")  # a step's ÷ its tokens, as --json's bytes_per_token_measured
    assert f"- bytes a token: {j['bytes_per_token_measured'] / 1e9:.3f} GB measured" in md
    assert "a step's ÷ its 4 tokens" in md


def test_a_span_the_clock_reaches_past_says_so_and_a_step_starts_clock_says_it_counts_every_step():
    j = _json("h200_unmarked_manual_1.dmon", "--last", "2")
    assert j["span"]["clock_reaches_back"].startswith(f"the rate's {j['clock_steps']} clock steps cover ")
    assert j["clock_span_s"] > 1.05 * j["span"]["seconds"]
    assert _json("h100_eager.dmon")["span"]["clock_reaches_back"] is None
    note = _json("h200_unmarked_manual_1.dmon")["ms_per_token_note"]
    assert "every step counts, those the observer's own steps slowed too" in note and "left out" not in note


def test_kernels_past_a_counted_clocks_step_call_it_a_mean():
    s = SimpleNamespace(inputs=Inputs(ms_per_token=6.0, kernel_sum_ms_per_token=6.6, kernel_busy_ms_per_token=6.3),
                        token_clock="server_metrics")
    assert kernels_past_step(s) == ("kernels 6.3 ms are 105% of the 6 ms mean step: traced kernels run longer "
                                    "than untraced ones")


def test_kernels_that_run_at_once_count_once_in_the_idle_and_the_kernel_share():
    # llama-server 8B under `decodemon run` (H100): its kernels overlap on two streams, 6.28 ms summed in a 6.07 ms
    # step; their union is what keeps the GPU busy, and the idle LAUNCH prices is the step less that
    j = _json("h100_llama_cpp_server8b_injected.dmon")
    busy, ksum, ms = j["kernel_busy_ms_per_token"], j["kernel_sum_ms_per_token"], j["ms_per_token"]
    assert busy < ksum / 1.05 and ksum > ms > busy
    assert j["kernels_past_step"] is None
    c = j["candidates"]["launch"]
    assert c["value"] == pytest.approx(100 * (ms - busy) / ms, abs=0.05) and c["value"] > 5
    assert "ms summed: some run at once" in c["detail"]
    assert j["kernel_share_of_step_pct"] == pytest.approx(100 * busy / ms, abs=0.1)
    assert "ms summed: some run at once" in j["kernel_share_of_step_note"]
    md = diagnosis_markdown(summary_snapshot(collect_recording(str(DATA / "h100_llama_cpp_server8b_injected.dmon"))))
    assert "summed: some kernels run at once" in md


@pytest.mark.parametrize("path", ["h200_hf_generate_static.dmon", "h200_eager.dmon", "h200_tp2_eager_rank0.dmon",
                                  "h100_llama_cpp_lcpp8b_nographs.dmon"])
def test_the_runtimes_launch_calls_are_some_of_the_hosts(path):
    # the runtime's calls are matched to the token's kernels by correlation id: on a host that runs ahead
    # (transformers' static-cache generate), the calls made while a step runs on the GPU are other tokens'
    j = _json(path)
    assert j["runtime_launch_calls_per_token"] <= j["kernel_launch_calls_per_token"]
    assert j["host_launch_calls_per_token"] == pytest.approx(j["kernel_launch_calls_per_token"]
                                                             + j["graph_launches_per_token"], abs=0.01)


def test_pm_against_the_window_has_names_of_its_own():
    j = _json("h200_hf_generate_static.dmon")
    c = j["pm_vs_window"]
    assert "traced_token_busy_pct" not in c and "traced_gpu_busy_pct" not in c  # the top level's, another figure
    assert abs(c["pm_gpu_busy_pct"] - c["window_gpu_busy_pct"]) <= 5  # one GPU time, two instruments
    assert c["over"] == f"the {c['samples']} PM samples wholly inside the span's traced tokens, each instrument " \
                        "over the same GPU time"


def test_diagnose_by_hand_with_the_kernels_union_reads_the_launch_share_the_replay_reads():
    j = _json("h100_llama_cpp_lcpp8b_nographs.dmon")
    # the span's windows' median union, as the kernel share states it (kernel_busy_ms_per_token is the latest's)
    busy = float(re.match(r"the traced kernels ([\d.]+) ms/token", j["kernel_share_of_step_note"]).group(1))
    assert busy == pytest.approx(j["kernel_share_of_step_pct"] * j["ms_per_token"] / 100, rel=2e-3)
    r = cli("diagnose", "--ms-per-token", j["ms_per_token"], "--kernels-per-token", j["kernels_per_token"],
            "--kernel-ms-per-token", busy, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["candidates"]["launch"]["value"] == pytest.approx(
        j["candidates"]["launch"]["value"], abs=0.05)
    assert j["candidates"]["launch"]["value"] > 5  # kernels at once: their sum would leave no idle
    assert "their union" in cli("diagnose", "--help").stdout


def test_scaling_calls_a_solved_s_outside_0_to_1_not_a_serial_fraction():
    r = cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon")
    j = json.loads(cli("scaling", DATA / "h200_tp1_eager_rank0.dmon", DATA / "h200_tp2_eager_rank0.dmon",
                       "--json").stdout)
    assert j["serial_fraction"] is None
    assert f"Amdahl's s solved = {j['solved_s']:.3f}, not a fraction" in r.stdout and "serial fraction s =" not in r.stdout


def test_compare_shows_on_each_side_the_throughput_its_ratio_divides():
    c = json.loads(cli("compare", BUNDLED / "h100_eager.dmon", BUNDLED / "h100_graph.dmon", "--json").stdout)
    a, b = c["throughput_tokens_per_s"]["a"], c["throughput_tokens_per_s"]["b"]
    assert a == c["a"]["tokens_per_s"] and b == c["b"]["tokens_per_s"]  # one sequence each: its tokens/s
    assert c["b_over_a"]["throughput_tokens_per_s"] == pytest.approx(b / a, rel=1e-3)
    # each side's summary is as `replay --json` prints it: a loop of one sequence has no throughput of its own
    assert c["a"]["throughput_tokens_per_s"] is None and c["b"]["throughput_tokens_per_s"] is None
    solo = json.loads(cli("replay", BUNDLED / "h100_eager.dmon", "--json").stdout)
    assert {k: v for k, v in c["a"].items() if k != "rolling_5s"} == \
        {k: v for k, v in solo.items() if k != "rolling_5s"}


def test_a_sweep_rows_model_floor_is_its_model_bytes():
    # with the engine's model facts a row's model bytes are the model's at the swept depth, and its model floor
    # multiple is theirs; the verdict's floor multiple stands under its own name
    d = json.loads(cli("sweep", "--replay", DATA / "h200_sweep_hf_generate", "--json").stdout)
    pts = d["points"] if isinstance(d, dict) else d
    assert pts and all(p["bytes_per_token_model"] for p in pts)
    for p in pts:
        assert p["bandwidth_x_model_floor"] == pytest.approx(
            p["ms_per_token"] / (p["bytes_per_token_model"] / p["bandwidth_gbs"] / 1e6), rel=1e-6)
        assert p["bandwidth_x_floor"] == pytest.approx(
            p["ms_per_token"] / (p["bytes_per_token"] / p["bandwidth_gbs"] / 1e6), rel=1e-3)


def test_a_clock_read_from_the_gpus_steps_says_its_tokens_are_those_steps_alone():
    j = _json("h200_compiled_llama8b_nomarks.dmon")
    assert j["token_clock"] == "graph replays" and j["tokens"] == j["clock_steps"]
    assert "tokens counts those steps alone, not every token the loop made" in j["token_clock_note"]


def test_a_batched_engines_dram_check_says_its_rate_is_a_steps_bytes_times_steps_a_second():
    j = _json("h100_llama_cpp_server1b_np4.dmon")
    c = j["dram_check"]
    assert c["of"].startswith("bytes_per_step_measured × tokens_per_s (steps a second): the DRAM byte counters'")
    assert c["of"].endswith("it checks neither the token clock nor bytes_per_token")
    assert c["bytes_x_tokens_per_s_gbs"] == pytest.approx(j["bytes_per_step_measured"] * j["tokens_per_s"] / 1e9, abs=0.1)
    assert c["bytes_x_tokens_per_s_gbs"] == pytest.approx(
        j["bytes_per_token_measured"] * j["throughput_tokens_per_s"] / 1e9, rel=1e-3)


def test_replay_refuses_seconds_in_words_as_report_and_compare_do():
    for verb in ("replay", "report"):
        r = cli(verb, BUNDLED / "h100_eager.dmon", "--json" if verb == "replay" else "-o", *([] if verb == "replay"
                                                                                            else ["-"]), "--seconds", 5)
        assert r.returncode == 2 and not r.stdout and "Traceback" not in r.stderr
        assert f"decodemon {verb}: --seconds is how long a live pid is watched" in r.stderr


def test_kernels_a_token_are_the_analysed_tokens_own_not_a_guard_tokens():
    # llama-cpp-python 8B, graphs on (H100): each analysed token is one graph launch of 485 kernels; the guard token
    # after it (traced, not analysed) launched 609 kernels one by one, which a count over the window took in
    j = _json("h100_llama_cpp_lcpp8b_graphs.dmon")
    assert j["kernels_per_token"] == 485 and j["graph_launches_per_token"] == 1
    c = j["candidates"]["launch"]
    assert "1 graph launch a token for 485 kernels" in c["detail"]
    idle_ms = j["ms_per_token"] * c["value"] / 100
    assert j["us_per_kernel"] == pytest.approx(1e3 * idle_ms / j["kernels_per_token"], rel=0.01)
    # a host that runs ahead still counts what its calls launched inside the tokens (transformers' static generate)
    assert _json("h200_hf_generate_static.dmon")["kernels_per_token"] == 553


def test_diagnose_by_hand_does_not_call_the_figures_it_was_given_measured():
    j = json.loads(cli("diagnose", "--ms-per-token", 21.79, "--kernels-per-token", 1863, "--kernel-ms-per-token",
                       4.0, "--json").stdout)
    assert j["us_per_kernel_note"].startswith("from the figures given: the idle the traced kernels leave")


def test_a_reports_verdict_history_says_it_reaches_before_the_span():
    r = cli("report", BUNDLED / "h100_eager.dmon", "--last", 1, "-o", "-")
    assert r.returncode == 0, r.stderr
    head, _, hist = r.stdout.partition("## Verdict history (a diagnosis has a shelf life)")
    assert hist.lstrip().startswith("The source's verdict changes from its start to the span's end, those before "
                                    "the span among them (each at its UTC time).")
    assert re.search(r"- UNKNOWN → [A-Z]+ at \d\d:\d\d:\d\d UTC", hist)


def test_occupancys_threshold_states_the_rule_that_made_it_bind_under_50():
    j = _json("h200_llama8b_graph.dmon")
    c = j["candidates"]["occupancy"]
    assert c["state"] == "binding" and c["value"] < 50 and "(≥25%)" in c["detail"]
    assert "where the kernels fill the step and no ceiling binds, ≥25% in small grids binds too" in c["threshold"]


@pytest.mark.parametrize("path", ["h200_tp2_eager_samewindow_rank1.dmon", "h200_known_reduce1.5_marks.dmon"])
def test_us_per_kernel_can_be_done_again_from_its_note(path):
    j = _json(path)
    m = re.search(r": \(the ([\d.]+) ms (?:median|mean) step − ([\d.]+) ms, the kernels' union in the median of "
                  r".*\) ÷ (\d+) kernels = ([\d.]+) µs$", j["us_per_kernel_note"])
    step, kernels, n, said = float(m.group(1)), float(m.group(2)), int(m.group(3)), float(m.group(4))
    assert step == pytest.approx(j["ms_per_token"], rel=1e-3) and n == round(j["kernels_per_token"])
    assert 1e3 * max(step - kernels, 0) / n == pytest.approx(j["us_per_kernel"], rel=2e-3)
    assert said == pytest.approx(j["us_per_kernel"], rel=1e-3)


def test_pm_against_the_window_says_when_its_window_is_before_the_span():
    j = _json("h100_eager.dmon", "--last", 1)
    assert j["kernels_from"]["windows_in_span"] == 0
    assert "latest traced window's tokens, before the span (it traced none)" in j["pm_vs_window"]["over"]


def test_a_replays_status_tells_an_end_from_a_point_short_of_it():
    from decodemon.monitor.player import RecordingPlayer

    p = RecordingPlayer(str(BUNDLED / "h100_eager.dmon"))
    p.seek(8_000_000_000)
    p.paused = True
    assert p.status() == f"  8.00/{p.end_ns / 1e9:.2f} s paused" and p.end_ns > 8_005_000_000
    p.seek(p.end_ns)
    assert p.status() == f"{p.end_ns / 1e9:.2f} s, end of recording"


def test_bytes_per_token_that_are_the_models_say_so_where_no_dram_counter_read_the_span():
    """The H200 eager recording has no PM bytes: its bytes_per_token is the model's, and the note says it is not
    measured; a recording with the counters' bytes needs no such note."""
    from tests.conftest import DATA

    j = json.loads(cli("replay", DATA / "h200_eager.dmon", "--json").stdout)
    assert j["bytes_per_token_measured"] is None and j["bytes_per_token"] == j["bytes_per_token_model"]
    assert "is the model's" in j["bytes_per_token_note"] and "not measured" in j["bytes_per_token_note"]
    k = json.loads(cli("replay", DATA.parent.parent / "monitor" / "data" / "h100_graph.dmon", "--json").stdout)
    assert k["bytes_per_token_measured"] and k["bytes_per_token_note"] is None


def test_a_reports_bytes_of_a_tiny_model_are_not_printed_as_zero():
    from decodemon.monitor.render.markdown import _gb

    assert _gb(685_056) == "0.000685" and _gb(1.252e9) == "1.252" and _gb(0) == "0.000"


def test_a_batched_engines_floor_is_a_steps_and_says_so(tmp_path):
    """A step of 4 sequences: the floor is the step's bytes over the bandwidth, held against ms_per_step, and the
    JSON and the report say so (bytes_per_token, a token's share, would give a quarter of it)."""
    j = json.loads(cli("replay", DATA / "h200_hf_cb_4.dmon", "--json").stdout)
    assert j["bandwidth_floor_ms"] == pytest.approx(j["bytes_per_step"] / j["bandwidth_gbs"] / 1e6, rel=1e-3)
    assert "a step's floor" in j["bandwidth_floor_note"]
    md = tmp_path / "r.md"
    assert cli("report", DATA / "h200_hf_cb_4.dmon", "-o", md).returncode == 0
    assert f"bandwidth floor {j['bandwidth_floor_ms']:.3f} ms/step ({j['bytes_per_step'] / 1e9:.3f} GB/step" in md.read_text()
    e = json.loads(cli("replay", DATA / "h200_eager.dmon", "--json").stdout)
    assert e["bandwidth_floor_note"] is None
