"""An eager loop that marks nothing is timed by its steps' starts (its embedding lookups), over the whole attach."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from decodemon.engine_adapter import step_starts
from decodemon.monitor.render.json import summary_json
from decodemon.monitor.session import Session
from decodemon.probes import session as sess
from decodemon.probes import wire
from tests.conftest import cli

ROOT = Path(__file__).resolve().parents[1]


def test_the_adapter_counts_only_while_attached_and_puts_the_original_back(monkeypatch):
    calls = []

    def embedding(ids, weight):
        calls.append(ids)
        return "looked up"

    f = SimpleNamespace(embedding=embedding)
    assert step_starts.install(f) == "embedding lookups" and step_starts.install(f) is None
    table = object()
    assert f.embedding(1, table) == "looked up" and calls == [1]  # dormant: nothing noted, nothing raised
    s = sess.Session(wire.Attach(), None)
    monkeypatch.setattr(sess.ACTIVE, "session", s)
    f.embedding(3, table), f.embedding(5, weight=table)
    assert len(s.start_log) == 2 and s.start_log[0] <= s.start_log[1]
    s.start_log = None  # the loop marked a token: the count lets go, and the lookup still runs
    assert f.embedding(7, table) == "looked up"
    step_starts.uninstall()
    assert f.embedding is embedding and not step_starts.installed()
    step_starts.install(f)
    theirs = lambda *a: "theirs"  # noqa: E731 - someone wrapped it after us
    f.embedding = theirs
    step_starts.uninstall()
    assert f.embedding is theirs


def test_a_model_with_two_tables_is_counted_once_a_step(monkeypatch):
    """GPT-2 looks up its token table and its position table each step: the first table looked up is the one
    counted."""
    f = SimpleNamespace(embedding=lambda ids, weight: weight)
    assert step_starts.install(f) == "embedding lookups"
    s = sess.Session(wire.Attach(), None)
    monkeypatch.setattr(sess.ACTIVE, "session", s)
    tokens, positions = object(), object()
    for _ in range(5):
        f.embedding(1, tokens)
        f.embedding(1, weight=positions)
    step_starts.uninstall()
    assert len(s.start_log) == 5


def test_a_loop_torch_compile_compiled_is_left_as_it_is():
    """Replacing a function a compiled model's guards hold recompiles it: not done after a compile, and a wrapper
    a compile saw is left in at detach (inert) rather than taken out under the compiled code."""
    torch = pytest.importorskip("torch")
    code = """
import torch, torch.nn.functional as F
from decodemon.engine_adapter import step_starts
from torch._dynamo.utils import counters
original = F.embedding
from decodemon.probes import session as sess, wire
assert step_starts.install() == "embedding lookups" and F.embedding is not original
sess.ACTIVE.session = s = sess.Session(wire.Attach(), None)  # attached while the model is compiled
m = torch.compile(torch.nn.Embedding(10, 4), backend="eager", fullgraph=True)  # no graph break for us
m(torch.tensor([1]))
graphs = counters["stats"]["unique_graphs"]
m(torch.tensor([3]))
assert counters["stats"]["unique_graphs"] == graphs  # its guards hold nothing of ours that changes
sess.ACTIVE.session = None
step_starts.uninstall()
assert F.embedding is not original  # a compile saw the wrapper: it stays
m(torch.tensor([2]))
assert counters["stats"]["unique_graphs"] == graphs  # and nothing recompiled
assert step_starts.install() == "embedding lookups"  # the next attach counts with the one left in
step_starts.uninstall()
F.embedding = original
assert step_starts.install() is None  # something compiled: a fresh wrapper is not put in
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.stdout.strip() == "ok", r.stderr[-2000:]


def _session_with_starts(times_ns) -> Session:
    """The starts as the agent ships them: a frame every 0.5 s of the loop's clock, received as it is sent."""
    s = Session()
    col = wire.Column.of
    t = np.asarray(times_ns, dtype=np.int64)
    tick = (t - t[0]) // 500_000_000
    done = 0
    for k in np.unique(tick):
        rows = t[tick == k]
        n = len(rows)
        steps = col([float(done + i) for i in range(n)], "<f8")
        s.add(int(rows[-1]), wire.StepCounts(url="", server=wire.STEP_STARTS, t_ns=col(rows.tolist()), steps=steps,
                                             tokens=steps, busy=col([1.0] * n, "<f8"), ended=col([0.0] * n, "<f8")))
        done += n
    return s


def test_the_starts_are_the_clock_with_their_count_span_and_tail():
    rng = np.random.default_rng(0)
    ms = rng.normal(15.0, 1.0, 400).clip(10)  # an eager loop's steps, 400 of them over ~6 s
    t = np.concatenate([[1_000_000_000], 1_000_000_000 + np.cumsum(ms * 1e6)]).astype(np.int64)
    snap = _session_with_starts(t).snapshot()
    j = summary_json(snap)
    assert j["token_clock"] == "step_starts"
    # the newest 5 s hold ~333 steps: the rate rests on them, not on all 400
    assert 300 <= j["clock_steps"] <= 340 and j["clock_span_s"] == pytest.approx(5.0, abs=0.1)
    assert j["ms_per_token"] == pytest.approx(float(np.median(ms[-j["clock_steps"]:])), rel=1e-3)
    assert j["ms_per_token_p99"] >= j["ms_per_token_p90"] > j["ms_per_token"]
    assert j["clock_provisional"] is False


def test_a_slow_loop_reaches_back_for_its_steps_and_few_steps_are_provisional():
    t = (np.arange(251) * 40e6).astype(np.int64) + 10**9  # 40 ms a step: 125 in the last 5 s, 250 in all
    j = summary_json(_session_with_starts(t).snapshot())
    assert j["clock_steps"] == 200 and j["clock_span_s"] == pytest.approx(8.0, abs=0.05)
    assert j["ms_per_token"] == pytest.approx(40.0)
    j = summary_json(_session_with_starts(t[:60]).snapshot())
    assert j["clock_steps"] == 59 and j["clock_provisional"] is True


def _own_median(times: list[float], t0: float, t1: float) -> tuple[float, int]:
    d = [1e3 * (b - a) for a, b in zip(times, times[1:]) if t0 <= b <= t1]
    return statistics.median(d), len(d)


@pytest.mark.timing
@pytest.mark.parametrize("engine", ["demo", "gptfast"])
def test_an_unmarked_eager_loop_attached_by_pid_is_timed_by_its_steps(tmp_path, engine):
    """Started with plain python and no decodemon line, attached by pid: ms/token from its steps over the span,
    within 5% of the loop's own per-token median over the same seconds."""
    pytest.importorskip("torch")
    log = tmp_path / "times"
    if engine == "demo":
        argv = [sys.executable, "-m", "decodemon.engine_adapter.demo", "--tiny", "--device", "cpu", "--tokens", "0",
                "--no-marks", "--times-file", str(log)]
    else:
        pytest.importorskip("transformers")
        argv = [sys.executable, str(ROOT / "benchmarks/loops/compiled_decode.py"), "--eager", "--shape", "tiny",
                "--device", "cpu", "--batch", "20", "--max-len", "64", "--log", str(log)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(8 if engine == "demo" else 15)  # its imports, then decoding
        assert proc.poll() is None
        r = cli("attach", proc.pid, "--json", "--seconds", "6", timeout=120)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
    finally:
        proc.terminate()
        proc.wait(30)
    if engine == "demo":
        times = json.loads(log.read_text())["end_unix_s"]
    else:
        times = [t for line in log.read_text().splitlines() for t in json.loads(line)["t"]]
    end, span = got["clock_end_unix_s"], got["clock_span_s"]  # where the clock's own steps end
    own, n = _own_median(sorted(times), end - span, end)
    assert got["token_clock"] == "step_starts" and got["clock_steps"] >= 200 and n >= 200
    assert got["ms_per_token"] == pytest.approx(own, rel=0.05), (got["ms_per_token"], own)
    assert got["probe"]["step_count_ns"]  # the hook's own cost a call, billed
