"""NVTX ranges from Python: kept on the traced window's timeline, and a named one as the token clock.

The `nvtx` package is real (its calls are no-ops without an NVTX tool, and the wrappers see them all the same);
CUPTI is faked at the cupti-python boundary for the window, as in test_agent.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from decodemon.engine_adapter import nvtx_ranges
from decodemon.probes import agent, wire
from decodemon.probes import session as sess
from decodemon.probes.facts import PROCESS
from tests.conftest import as_monitor_reads, cli
from tests.test_agent import _fake_tracer

nvtx = pytest.importorskip("nvtx")


@pytest.fixture
def attached(monkeypatch):
    """A session as the agent holds it while a monitor is attached, with the range calls wrapped."""
    monkeypatch.setattr(PROCESS, "graph_kernels_seen", False)
    monkeypatch.setattr(PROCESS, "engine_cuda_graphs", False)

    def make(**settings):
        s = sess.Session(wire.Attach(window_tokens=2, **settings), _fake_tracer())
        monkeypatch.setattr(agent.ACTIVE, "session", s)
        nvtx_ranges.install()
        assert nvtx_ranges.installed()
        return s

    yield make
    nvtx_ranges.uninstall()


def _decode(n: int) -> None:
    for i in range(n):
        nvtx.push_range("token")
        with nvtx.annotate("forward"):
            nvtx.push_range("attention")
            nvtx.pop_range()
        nvtx.pop_range()
        agent.mark_token(i)


def test_ranges_closed_inside_a_window_travel_with_it_nested_levels_and_all(attached):
    s = attached()
    s.want_window = True
    _decode(4)  # the window opens at the first boundary and closes two tokens later
    s.window_ready.wait(2)
    w = as_monitor_reads(s.tracer.collect(0, guard_tokens=0))
    names = [w.nvtx_names[i] for i in w.nvtx["name"].array()]
    assert names.count("token") >= 1 and names.count("forward") == names.count("attention") >= 2
    levels = dict(zip(names, w.nvtx["level"].array().tolist()))
    assert levels == {"attention": 2, "forward": 1, "token": 0}
    start, end = w.nvtx["start"].array(), w.nvtx["end"].array()
    assert (end >= start).all()
    lo, hi = int(w.token_bounds_ns.array()[0]), int(w.token_bounds_ns.array()[-1])
    assert lo <= start.min() and end.max() <= hi  # inside the window, in CUPTI's clock
    from decodemon.monitor.analysis.window import nvtx_table

    rows = {name: (per_token, level) for name, per_token, _us, level in nvtx_table(w, w.tokens)}
    assert set(rows) == {"token", "forward", "attention"} and rows["forward"][1] == 1
    assert rows["forward"][0] == rows["attention"][0] == names.count("forward") / w.tokens


def test_a_named_range_is_the_token_clock_and_the_engines_own_marks_are_ignored(attached):
    s = attached(token_range="token")
    _decode(5)
    assert s.marks_queued == 5  # one per "token" range, none from mark_token
    s2 = attached()
    nvtx_ranges.uninstall()
    _decode(3)
    assert s2.marks_queued == 3  # unwrapped: the engine's marks again


def test_a_stalled_range_clocked_session_leaves_cupti_at_the_next_close_of_its_range(attached):
    """The agent gave up waiting for a boundary: its Closer keeps the token range, and the range's next close (the
    engine calls no mark_token) is where CUPTI is left; nothing raises into the engine on the way."""
    s = attached(token_range="token")
    s.want_window = True
    nvtx.push_range("token")
    nvtx.pop_range()  # the window opens here
    assert s.tracer.active
    tr = s.tracer
    s.finish(at_boundary=False)
    closer = agent.ACTIVE.session
    assert isinstance(closer, sess.Closer) and closer.token_range == "token"
    nvtx.push_range("other")
    nvtx.pop_range()
    assert agent.ACTIVE.session is closer  # not its range: no boundary yet
    nvtx.push_range("token")
    nvtx.pop_range()
    assert agent.ACTIVE.session is None and not tr.active and not tr.initialised


def test_keyword_pushes_stale_stacks_and_ranges_from_before_the_window(attached):
    s = attached()
    nvtx.push_range(message="kw")  # the nvtx package's keyword form, and no name at all
    nvtx.push_range()
    nvtx.pop_range()
    nvtx.pop_range()
    nvtx.push_range("left open")  # open across the detach: its pop goes by unwrapped
    nvtx_ranges.uninstall()
    nvtx.pop_range()
    s = attached()
    s.want_window = True
    _decode(3)
    s.window_ready.wait(2)
    w = as_monitor_reads(s.tracer.collect(0, guard_tokens=0))
    levels = {w.nvtx_names[i]: lv for i, lv in zip(w.nvtx["name"].array(), w.nvtx["level"].array())}
    assert levels == {"token": 0, "forward": 1, "attention": 2}  # not shifted by the stale "left open"
    tr = s.tracer
    tr.bounds = [1000]
    before = len(tr._ranges)
    tr.note_range("early", 900, 1100, 0)  # opened before the window did
    assert len(tr._ranges) == before


def test_uninstall_puts_the_originals_back():
    import nvtx as mod

    before = (mod.push_range, mod.pop_range, mod.annotate.__enter__, mod.annotate.__exit__)
    assert "nvtx" in nvtx_ranges.install()
    assert mod.push_range is not before[0] and nvtx_ranges.installed()
    nvtx_ranges.uninstall()
    assert (mod.push_range, mod.pop_range, mod.annotate.__enter__, mod.annotate.__exit__) == before


# a step that waits 4 ms with the GIL released, as a decode loop waits for its GPU
# each step waits 4 ms with the GIL released, as a decode loop waits for its GPU
LOOP = textwrap.dedent('''
    import sys, time, nvtx
    log = open(sys.argv[1], "w")
    while True:
        nvtx.push_range("decode_step")
        time.sleep(0.004)
        nvtx.pop_range()
        print(time.time(), file=log, flush=True)
''')


def test_token_range_on_a_real_process_gives_its_own_ms_per_token(tmp_path):
    """`decodemon run` a loop that marks nothing but pushes an NVTX range per step; `attach --token-range` counts
    its steps and reads the loop's own ms/token."""
    script, log = tmp_path / "loop.py", tmp_path / "times.txt"
    script.write_text(LOOP)
    proc = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", sys.executable, str(script),
                             str(log)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        pid = None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and pid is None:
            kids = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
            if kids and log.exists() and log.stat().st_size:
                pid = int(kids[0])
            time.sleep(0.1)
        assert pid is not None
        t_attach = time.time()
        r = cli("attach", pid, "--json", "--seconds", 3, "--token-range", "decode_step", "--no-pm")
        t_end = time.time()
        j = json.loads(r.stdout)
        times = [float(x) for x in log.read_text().split()]
        own = [t for t in times if t_attach + 1 <= t <= t_end - 0.5]
        own_ms = 1e3 * (own[-1] - own[0]) / (len(own) - 1)
        assert j["tokens"] > 100 and j["token_clock"] == "nvtx_range:decode_step", (r.stderr, j["probe"])
        assert abs(j["ms_per_token"] - own_ms) / own_ms < 0.15
        r = cli("attach", pid, "--json", "--seconds", 2, "--no-pm")  # without it: no token clock at all
        assert json.loads(r.stdout)["tokens"] is None
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_bad_token_range_is_one_line():
    r = cli("attach", "1", "--token-range", "")
    assert r.returncode == 2 and "--token-range" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_an_h200_window_carries_the_loops_nvtx_ranges_to_the_summary_and_the_exported_timeline(tmp_path):
    """The graphed demo engine with `--nvtx` on an H200, recorded with `--token-range decode_step`
    (benchmarks/nvtx_clock.py): one decode_step range per analysed token in each window, and on the trace's NVTX
    lane every range lies inside its window's token span."""
    from pathlib import Path

    rec = Path(__file__).parent / "data" / "h200_graph_nvtx_range.dmon"
    j = json.loads(cli("replay", rec, "--json").stdout)
    assert j["windows"] == 2 and j["verdict"] == "occupancy"
    (row,) = j["nvtx_ranges"]
    assert (row["name"], row["per_token"], row["level"]) == ("decode_step", 1.0, 0) and 4000 < row["us"] < 20000
    out = tmp_path / "trace.json"
    assert cli("export", rec, "-o", out).returncode == 0
    ev = json.loads(out.read_text())
    ev = ev.get("traceEvents", ev) if isinstance(ev, dict) else ev
    ranges = [e for e in ev if e.get("cat") == "nvtx"]
    assert len(ranges) == 4 and {e["name"] for e in ranges} == {"decode_step"} and len({e["tid"] for e in ranges}) == 1
    for w in (0, 1):
        mine = [e for e in ranges if e["args"]["window"] == w]
        bounds = [e["ts"] for e in ev if e.get("cat") == "token" and e["args"]["window"] == w]
        assert len(mine) == 2 and len(bounds) == 3  # the analysed token's range and the guard token's
        assert all(min(bounds) <= e["ts"] and e["ts"] + e["dur"] <= max(bounds) for e in mine)


def test_the_timeline_draws_the_tokens_nvtx_range_under_its_kernels():
    from pathlib import Path

    from decodemon.monitor.sources.collect import collect
    from decodemon.monitor.widgets.timeline import nvtx_row

    s = collect(str(Path(__file__).parent / "data" / "h200_graph_nvtx_range.dmon")).snapshot()
    tl = s.window.timeline
    ((name, a, b),) = tl.nvtx
    assert name == "decode_step" and 0 <= a < b <= tl.token_ns and b - a > 0.9 * tl.token_ns
    row = nvtx_row(tl, 60)
    assert row.startswith("[decode_step=") and row.rstrip().endswith("]") and len(row) == 60
    assert nvtx_row(tl, 60, zoom=8).startswith("[decode_step")  # zoomed into the token's start


def test_torch_cuda_nvtx_is_wrapped_and_a_push_that_fails_opens_nothing(attached):
    """On a CPU build of torch, torch.cuda.nvtx.range_push raises: the engine sees its own error, unchanged, and
    no range is left open on the thread's stack."""
    torch = pytest.importorskip("torch")
    import torch.cuda.nvtx as tn

    original = tn.range_push
    attached()
    assert tn.range_push is not original and tn.range_push.__wrapped__ is original
    try:
        original("probe")
        works = True
    except RuntimeError:
        works = False
    if not works:
        with pytest.raises(RuntimeError):
            tn.range_push("token")
        assert nvtx_ranges._stack() == []
    nvtx_ranges.uninstall()
    assert tn.range_push is original
