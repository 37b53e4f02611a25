"""transformers' continuous batching, the real package on CPU (a tiny random Qwen3, 4 requests kept in flight, a
paged cache, the engine's background thread), attached by pid with no line of decodemon in the engine: the step is
the unit, its tokens are the requests in flight, and the total tokens/s is the engine's own count's."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
DM = [sys.executable, "-m", "decodemon.monitor.cli"]
IN_FLIGHT = 4


def _engine_tokens(log: Path, t0: float, t1: float) -> int:
    return sum(1 for line in log.read_text().splitlines() for t in json.loads(line)["t"] if t0 <= t <= t1)


@pytest.mark.timing
def test_continuous_batching_is_read_per_step_with_its_batch_and_total_rate(tmp_path):
    log = tmp_path / "cb.jsonl"
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "loops" / "hf_cb.py"), "--shape", "tiny",
                             "--device", "cpu", "--in-flight", str(IN_FLIGHT), "--new-tokens", "48",
                             "--num-blocks", "16", "--log", str(log)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT)
    try:
        t_end = time.monotonic() + 240
        while not (log.exists() and len(log.read_text().splitlines()) >= IN_FLIGHT):
            assert proc.poll() is None and time.monotonic() < t_end, "the engine did not decode"
            time.sleep(0.5)
        t0 = time.time()
        r = subprocess.run([*DM, "attach", str(proc.pid), "--json", "--seconds", "6"], capture_output=True, text=True,
                           timeout=180)
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        t1 = j["span_end_unix_s"]  # the summary's span ends here, not where its command did
        assert j["token_clock"] == "mark_token" and j["tokens_per_step"] == IN_FLIGHT, j
        assert j["steps"] and j["tokens"] >= j["steps"]
        time.sleep(8)  # requests running at the detach finish and log their tokens
        span = j["span_s"]
        own = _engine_tokens(log, t1 - span, t1) / span  # the engine's tokens a second, over the summary's span
        assert own > 0 and abs(j["throughput_tokens_per_s"] / own - 1) < 0.15, (j["throughput_tokens_per_s"], own)
        # each request's time to first token, against the engine's own stamps for the requests whose first token
        # came in that span
        ttft = [ln["ttft_s"] * 1e3 for ln in map(json.loads, log.read_text().splitlines())
                if "ttft_s" in ln and t1 - span <= ln["t"][0] <= t1]
        ft = j["time_to_first_token"]
        print(f"decodemon {ft}, the engine's own median {statistics.median(ttft) if ttft else None} ms over {len(ttft)}")
        assert ttft and ft["requests"] >= 0.5 * len(ttft), (ft, len(ttft))
        assert ft["median_ms"] == pytest.approx(statistics.median(ttft), rel=0.25), (ft, sorted(ttft))
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_step_is_marked_with_its_requests_and_their_kv_positions_summed(monkeypatch):
    """The wrapper around prepare_batch_update: the requests that got a token, and the KV positions all of them
    read (the floor a step is the weights once plus every sequence's KV); requests without a token are left out."""
    from types import SimpleNamespace as NS

    from decodemon.engine_adapter import transformers_cb
    from decodemon.probes import agent

    seen = []
    monkeypatch.setattr(agent, "mark_step", lambda tokens, depth=0: seen.append((tokens, depth)))
    reqs = [NS(has_new_token=True, state=NS(position_offset=100)), NS(has_new_token=False, state=NS(position_offset=7)),
            NS(has_new_token=True, state=NS(position_offset=40))]
    wrapped = transformers_cb._wrap(lambda self: (reqs, [1, 2, 3], None))
    assert wrapped(None) == (reqs, [1, 2, 3], None)  # the engine's own return, untouched
    assert seen == [(2, 140)]
    wrapped = transformers_cb._wrap(lambda self: ("not a list of requests", [], None))
    wrapped(None)  # a shape the adapter does not know: no mark, no exception
    assert seen == [(2, 140)]


def test_a_requests_first_token_is_timed_from_its_arrival_and_a_requeued_one_not_again(monkeypatch):
    """A request with no token yet gets its first in the step marked: its wait from created_time goes out beside the
    step. One the engine re-queued (evicted, or a child it could not fork: `_true_initial_tokens` set) starts with
    no token again and a new created_time; it made its first token long before and is not counted twice."""
    import time as _time
    from types import SimpleNamespace as NS

    from decodemon.engine_adapter import transformers_cb
    from decodemon.probes import agent

    firsts = []
    monkeypatch.setattr(agent, "mark_step", lambda tokens, depth=0: None)
    monkeypatch.setattr(agent, "note_first_tokens", firsts.extend)
    now = _time.perf_counter()
    reqs = [NS(has_new_token=True, state=NS(position_offset=5, generated_tokens=[], created_time=now - 0.25)),
            NS(has_new_token=True, state=NS(position_offset=9, generated_tokens=[7], created_time=now - 9.0)),
            NS(has_new_token=True, state=NS(position_offset=30, generated_tokens=[], created_time=now - 0.01,
                                            _true_initial_tokens=12))]
    transformers_cb._wrap(lambda self: (reqs, [1, 2, 3], None))(None)
    assert len(firsts) == 1 and 0.25 <= firsts[0] < 1.0
