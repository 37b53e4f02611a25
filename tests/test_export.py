"""`decodemon export`: a recording's traced windows as a Kineto-style Chrome trace that HTA's parser loads, with
decodemon's kernel count per token, its classified gaps, token clock and PM counters on the timeline."""

from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys

import numpy as np
import pytest
from hta.common.trace import parse_trace_file

from decodemon.monitor.export import NothingToExport, export, trace_of, write_trace
from decodemon.monitor.export.lanes import Clock, nvtx_lane
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.sources.collect import collect
from decodemon.probes import wire
from tests.conftest import DATA, REC

HALF_NS_US = 0.0005  # the trace's times are µs with ns decimals: half a ns absorbs float sums


@pytest.fixture(scope="module")
def eager():
    return collect(DATA / "h200_eager_api2.dmon")


@pytest.fixture(scope="module")
def graph():
    return collect(REC["graph"])


def _hta(path, monkeypatch):
    # decodemon's records are ns; without this HTA rounds every event inward to whole µs
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    meta, df, symbols = parse_trace_file(str(path))
    df = df.assign(cat_name=df["cat"].map(lambda i: symbols.sym_table[i]),
                   name_str=df["name"].map(lambda i: symbols.sym_table[i]))
    return meta, df


@pytest.mark.parametrize("which,suffix", [("eager", ".json"), ("graph", ".json.gz")])
def test_hta_loads_the_trace_with_decodemons_kernels_per_token(which, suffix, request, tmp_path, monkeypatch):
    sess = request.getfixturevalue(which)
    path = write_trace(trace_of(sess), tmp_path / f"trace{suffix}")
    meta, df = _hta(path, monkeypatch)
    last = sess.feed.latest_window()
    assert meta["distributedInfo"]["rank"] == 0
    assert meta["deviceProperties"][0]["numSms"] == 132
    win = df[(df.cat_name == "window") & (df.name_str == f"window {last.window_id}")]
    assert len(win) == 1
    lo, hi = float(win.ts.iloc[0]), float(win.end.iloc[0])
    kernels = df[(df.cat_name == "kernel") & (df.stream >= 0) & (df.correlation >= 0)]
    inside = kernels[(kernels.ts >= lo - HALF_NS_US) & (kernels.end <= hi + HALF_NS_US)]
    per_token = len(inside) / last.tokens
    assert per_token == pytest.approx(summary_json(sess.snapshot())["kernels_per_token"], abs=0.05)
    # every kernel of every window came through, and HTA linked each to the launch call that queued it
    assert len(kernels) == sum(len(w.kernels["start"].array()) for _rx, w in sess.feed.windows)
    launched = kernels[kernels.index_correlation > 0]
    want = sum(np.isin(w.kernels["correlation"].array(), w.apis["correlation"].array()).sum()
               for _rx, w in sess.feed.windows if w.apis_traced and w.apis)
    assert len(launched) == want > 0
    cpu = df.loc[launched.index_correlation.to_numpy()]
    assert set(cpu.cat_name) == {"cuda_runtime"}
    assert (cpu.ts.to_numpy() <= launched.ts.to_numpy() + HALF_NS_US).all()  # a launch precedes its kernel


def _check_event(e: dict) -> None:
    for key in ("ph", "ts", "pid", "tid", "name"):
        assert key in e, (key, e)
    assert isinstance(e["ts"], (int, float)) and math.isfinite(e["ts"]) and e["ts"] >= 0
    assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
    if e["ph"] == "X":
        assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
    elif e["ph"] == "C":
        assert e["args"] and all(isinstance(v, (int, float)) and math.isfinite(v) for v in e["args"].values()), e
    elif e["ph"] == "i":
        assert e["s"] in ("t", "p", "g")
    elif e["ph"] in ("s", "f"):
        assert isinstance(e["id"], int)
    else:
        assert e["ph"] == "M" and e["name"] in ("process_name", "process_labels", "process_sort_index",
                                                "thread_name")


def test_every_event_follows_the_trace_event_format(eager, tmp_path):
    trace = json.loads((write_trace(trace_of(eager), tmp_path / "t.json")).read_text())
    events = trace["traceEvents"]
    for e in events:
        _check_event(e)
    phases = {e["ph"] for e in events}
    assert {"X", "C", "i", "s", "f", "M"} <= phases
    starts = {e["id"] for e in events if e["ph"] == "s"}
    assert starts == {e["id"] for e in events if e["ph"] == "f"}  # every flow arrow has both ends
    kernel = next(e for e in events if e.get("cat") == "kernel")
    assert {"device", "stream", "correlation", "External id", "grid", "block", "registers per thread",
            "shared memory"} <= set(kernel["args"])
    assert len(kernel["args"]["grid"]) == 3 and len(kernel["args"]["block"]) == 3
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]
    assert runtime and all(e["pid"] == eager.feed.hello.pid for e in runtime)
    assert any(e["name"].startswith("cudaLaunchKernel") for e in runtime)


def test_gap_slices_add_up_to_the_analysis_classes(eager, graph):
    for sess in (eager, graph):
        trace = trace_of(sess)
        for _rx, m in sess.metrics:
            got: dict = {}
            for e in trace["traceEvents"]:
                if e.get("cat") == "gpu_idle" and e["args"]["window"] == m.window_id:
                    got[e["args"]["class"]] = got.get(e["args"]["class"], 0.0) + e["dur"] / 1e3
            want = {k: v * m.tokens for k, v in m.gap_ms_per_token.items() if v > 0}
            assert got.keys() == want.keys()
            for k in want:
                assert got[k] == pytest.approx(want[k], abs=1e-6), (sess.label, m.window_id, k)


def test_kernels_that_share_a_name_are_told_apart_as_the_screen_tells_them(eager):
    """Three `native::elementwise_kernel`s in one eager window: each slice name is its own, and it is the label the
    hot-kernels table (the screen, `--json`, the report) gives that kernel, index included."""
    trace = trace_of(eager)
    by_mangled: dict = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "kernel":
            by_mangled.setdefault(e["args"]["mangled name"], set()).add(e["name"])
    assert all(len(v) == 1 for v in by_mangled.values())  # one slice name per kernel
    names = [next(iter(v)) for v in by_mangled.values()]
    assert len(set(names)) == len(names)  # and no two kernels share it
    elementwise = [n for n in names if n.startswith("native::elementwise_kernel")]
    assert len(elementwise) >= 2 and all(n.startswith("native::elementwise_kernel<") for n in elementwise)
    table = eager.snapshot(span_ns=None).window.kernels  # the hot-kernels table: the trace names each row as it does
    assert table and all(by_mangled[r.name] == {r.label} for r in table)
    assert any("#" in r.label for r in table)  # an index among those only told apart by place, said alike


@pytest.mark.parametrize("name", ["h200_narrow12_graph.dmon", "h200_compiled_llama8b_enqueue_synced_2.dmon",
                                  "h200_unmarked_manual_1.dmon"])
def test_a_kernel_keeps_one_slice_name_across_a_traces_windows_and_it_is_the_screens(name):
    """Windows whose tables order alike-named kernels differently (timing noise), a window re-timed by the GPU's
    steps, kernels outside the latest window's table: each kernel has one name in the whole trace, no two kernels
    share one, and the latest window's rows are named as the screen names them."""
    sess = collect(DATA / name)
    by_mangled, by_name = {}, {}
    for e in trace_of(sess)["traceEvents"]:
        if e.get("cat") == "kernel":
            by_mangled.setdefault(e["args"]["mangled name"], set()).add(e["name"])
            by_name.setdefault(e["name"], set()).add(e["args"]["mangled name"])
    assert all(len(v) == 1 for v in by_mangled.values()) and all(len(v) == 1 for v in by_name.values())
    table = sess.snapshot(span_ns=None).window.kernels
    assert table and all(by_mangled[r.name] == {r.label} for r in table)


def test_tokens_are_profiler_steps_between_boundary_instants(graph):
    events = trace_of(graph)["traceEvents"]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    analysed = sum(w.tokens for _rx, w in graph.feed.windows)
    assert [e["name"] for e in steps] == [f"ProfilerStep#{i}" for i in range(analysed)]
    guards = [e for e in events if e["name"] == "guard token"]
    assert len(guards) == sum(w.guard_tokens for _rx, w in graph.feed.windows) > 0
    bounds = [e for e in events if e["ph"] == "i" and e["name"] == "token boundary"]
    assert len(bounds) == sum(len(w.token_bounds_ns.array()) for _rx, w in graph.feed.windows)
    ms = [e["dur"] / 1e3 for e in steps]
    assert np.median(ms) == pytest.approx(np.median([m.traced_ms_per_token for _rx, m in graph.metrics]),
                                          rel=1e-6)


def test_pm_counters_are_counter_tracks_inside_the_windows():
    sess = collect(DATA / "h200_eager_pm.dmon")
    events = trace_of(sess)["traceEvents"]
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["name"] for e in counters} >= {"GPU busy (%)", "SM active (%)"}
    assert all(0 <= e["args"]["value"] <= 100 for e in counters)
    windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "user_annotation"
               or e["name"] == "guard token"]
    lo, hi = min(w[0] for w in windows), max(w[1] for w in windows)
    assert all(lo <= e["ts"] <= hi for e in counters)


def test_nvtx_ranges_appear_when_the_window_carries_them(eager):
    window = eager.feed.latest_window()
    clock = Clock(int(window.token_bounds_ns.array()[0]))
    assert nvtx_lane(window, clock, 1) == []  # no nvtx field: no lane
    t0 = int(window.token_bounds_ns.array()[0])
    import msgspec

    carrying = msgspec.structs.replace(window, window_id=7, nvtx_names=["decode_step"], nvtx={
        "name": wire.Column.of([0]), "start": wire.Column.of([t0 + 1000]), "end": wire.Column.of([t0 + 5000]),
        "level": wire.Column.of([0])})
    carrying = wire.decode_frame(wire.encode(carrying))  # as a recording carries it
    (r,) = nvtx_lane(carrying, clock, 1)
    assert (r["name"], r["cat"], r["ts"], r["dur"], r["args"]["level"]) == ("decode_step", "nvtx", 1.0, 4.0, 0)


def test_one_window_by_id_and_a_missing_one(eager):
    wid = eager.feed.latest_window().window_id
    assert trace_of(eager, wid)["decodemon"]["windows"] == [wid]
    from decodemon.monitor.sources.errors import SourceError

    with pytest.raises(SourceError, match="no traced window 999") as exc:
        trace_of(eager, 999)
    assert not isinstance(exc.value, NothingToExport)  # bad input (exit 2), not "nothing measured" (3)


def _run(argv):
    from decodemon.monitor.cli import main

    return main(["export", *map(str, argv)])


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_export_verb_writes_a_trace(tmp_path, capsys):
    out = tmp_path / "trace.json.gz"
    assert _run([REC["eager"], "-o", out]) == 0
    trace = json.loads(gzip.decompress(out.read_bytes()))
    said = capsys.readouterr()
    assert trace["traceEvents"] and str(out) in said.err and said.out == ""  # stdout stays free for a pipe
    assert [p.name for p in tmp_path.iterdir()] == ["trace.json.gz"]  # no temporary file left beside it


@pytest.mark.parametrize("where", ["dir", "nodir", "file_as_dir"])
def test_export_verb_bad_output_is_one_line(where, tmp_path, capsys):
    (tmp_path / "plain").write_text("")
    target = {"dir": tmp_path, "nodir": tmp_path / "missing" / "t.json", "file_as_dir": tmp_path / "plain" / "t.json"}
    assert _run([REC["eager"], "-o", target[where]]) == 2
    assert _one_line(capsys.readouterr().err).startswith("decodemon export: cannot write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # nothing written, no temporary file


def test_export_verb_without_windows_exits_3(tmp_path, capsys):
    rec = tmp_path / "marks.dmon"
    header = wire.RecordingHeader(wire_version=wire.WIRE_VERSION, created_unix_s=0.0, decodemon_version="test")
    marks = wire.TokenMarks(t_ns=wire.Column.of(list(range(0, 10_000_000, 1_000_000))), depth=wire.Column.of([1] * 10))
    rec.write_bytes(wire.recording_bytes([(1, marks)], header))
    assert _run([rec, "-o", tmp_path / "t.json"]) == 3
    assert "holds no traced window" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "t.json").exists()


def test_export_reads_a_recording_path_directly():
    trace = export(REC["graph"])
    assert trace["decodemon"]["windows"] and trace["baseTimeNanoseconds"] > 0


def test_export_from_a_live_cpu_engine_says_it_traced_no_window(engine, tmp_path, capsys):
    # the CPU demo engine has no GPU, so the probe traces no window: one line, exit 3, no file
    assert _run([engine.pid, "-o", tmp_path / "t.json", "--seconds", "1.5"]) == 3
    assert f"pid {engine.pid}" in _one_line(capsys.readouterr().err)
    assert not list(tmp_path.iterdir())


def test_export_and_prometheus_import_without_the_app():
    code = ("import sys, decodemon.monitor.cli.export, decodemon.monitor.exporter.serve; "
            "print(sorted(m for m in ('textual', 'torch') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
