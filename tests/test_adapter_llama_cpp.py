"""llama-cpp-python's CPU build on a tiny random-weight Llama GGUF written with the `gguf` package: the GGUF
writer, the adapter (tokens counted, facts read from llama.cpp, cleanly removed), and a real `decodemon run` process
attached."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

import decodemon.engine_adapter.auto  # noqa: E402,F401  (registers the adapter with the attach hooks)
from decodemon.engine_adapter import llama_cpp_generate as lg  # noqa: E402
from decodemon.probes import hooks  # noqa: E402

LOOP = Path(__file__).parents[1] / "benchmarks" / "loops" / "llama_cpp_decode.py"
sys.path.insert(0, str(LOOP.parent))
from llama_cpp_decode import SHAPES, write_gguf  # noqa: E402


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny")


@pytest.fixture(scope="module")
def llm(gguf_path):
    return llama_cpp.Llama(model_path=str(gguf_path), n_ctx=128, n_threads=1, n_batch=16, verbose=False)


@pytest.fixture
def marks(agent_marks):
    yield agent_marks
    lg.uninstall()


def _reads(gguf_path, j: dict) -> bool:
    """The model's bytes a token: the weights it reads (one embedding row, from the GGUF the target maps) and its
    KV at a depth under the loop's context."""
    from decodemon.monitor import gguf

    tb = gguf.token_bytes(*gguf.read_header(gguf_path))
    return tb.weights_read <= j["bytes_per_token_model"] <= tb.weights_read + tb.kv_per_position * 4096 \
        and tb.weights_read < tb.weights_total


def generate(llm, n: int, prompt: int = 5) -> list[int]:
    out = []
    for tok in llm.generate([1] + list(range(300, 300 + prompt - 1)), temp=0.0, reset=True):
        out.append(tok)
        if len(out) >= n:
            break
    return out


def test_the_gguf_writer_makes_a_llama_model_llama_cpp_loads_with_its_shape(gguf_path, llm):
    s = SHAPES["tiny"]
    assert [p.name for p in gguf_path.parent.iterdir()] == [gguf_path.name]  # no temporary file left beside it
    assert llm.metadata["general.architecture"] == "llama"
    assert llama_cpp.llama_model_n_layer(llm.model) == s["layers"]
    assert llama_cpp.llama_model_n_embd(llm.model) == s["embd"]
    assert llama_cpp.llama_model_n_head_kv(llm.model) == s["heads_kv"]
    assert llm.n_vocab() == 259 + s["extra_vocab"]
    assert len(generate(llm, 6)) == 6  # it decodes (greedy on random weights)


def test_a_gguf_write_that_fails_leaves_no_file(tmp_path, monkeypatch):
    import gguf

    def broken(self, tensor):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", broken)
    with pytest.raises(OSError):
        write_gguf(tmp_path / "m.gguf", "tiny")
    assert list(tmp_path.iterdir()) == []


def test_every_step_of_generate_is_marked_with_its_depth_and_the_facts_come_from_llama_cpp(llm, marks):
    seen, facts = marks
    assert "llama_cpp Llama.sample()" in hooks.attach()
    toks = generate(llm, 10, prompt=5)
    hooks.detach()
    # generate() evaluates the prompt, samples and yields a token, evaluates it, ...: one mark a token
    assert len(toks) == 10 and len(seen) == 10
    assert seen == list(range(5, 15))  # the context after each step: prompt 5, then one more a step
    f = facts[0]
    assert f.weight_bytes == llama_cpp.llama_model_size(llm.model)
    assert (f.layers, f.hidden, f.dtype) == (2, 64, "float16")
    assert f.kv_bytes_per_position == 2 * 2 * 16 * (2 + 2)  # layers x KV heads x head_dim x (K + V in f16)


def test_a_draft_model_that_checks_several_tokens_in_one_eval_still_marks_each_token(gguf_path, marks):
    """Speculative decoding: one eval of a token and its drafts, then a sample per accepted token."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    seen, _ = marks
    spec = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=128, n_threads=1, n_batch=16, verbose=False,
                           logits_all=True, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4))
    evals = []
    real_eval = llama_cpp.Llama.eval
    spec.eval = lambda tokens: (evals.append(len(tokens)), real_eval(spec, tokens))[1]
    lg.install()
    toks = generate(spec, 40, prompt=12)
    assert len(toks) == 40 and len(seen) == 40
    assert len(evals) < 40  # the drafts were checked several at a time: one mark per eval would have undercounted


def test_an_exact_prompt_cache_hit_marks_only_the_token_it_makes(llm, marks):
    seen, _ = marks
    lg.install()
    for _ in range(2):  # the second call finds its whole prompt evaluated already: an empty eval, then a sample
        llm.create_completion([1, 300, 301], max_tokens=1, temperature=0.0)
    assert len(seen) == 2


def test_detach_puts_sample_back_as_it_was(llm, marks):
    seen, _ = marks
    original = llama_cpp.Llama.__dict__["sample"]
    assert lg.install() == "llama_cpp Llama.sample()"
    assert lg.install() is None  # once
    hooks.detach()
    assert llama_cpp.Llama.__dict__["sample"] is original and not lg.installed()
    generate(llm, 4)
    assert seen == []


@pytest.mark.timing
def test_llama_cpp_under_decodemon_run_is_counted_with_no_line_of_decodemon(tmp_path, gguf_path):
    """The benchmark loop (llama.cpp's own generate, CPU build) under `decodemon run`: an attach counts its tokens
    through the adapter, against the loop's own log of the same seconds, and reports llama.cpp's model facts."""
    from tests.conftest import cli

    log = tmp_path / "tokens.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "decodemon.monitor.cli", "run", "--", sys.executable, str(LOOP),
                             "--shape", "tiny", "--gguf", str(gguf_path), "--new-tokens", "100", "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not (log.exists() and log.stat().st_size) and time.time() - t0 < 60:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        for _ in range(2):  # and a re-attach reads the same
            t_a = time.time()
            r = cli("attach", pid, "--json", "--seconds", 2)
            t_b = time.time()
            assert r.returncode == 0, r.stderr
            j = json.loads(r.stdout)
            own = [t for line in log.read_text().splitlines() for t in json.loads(line)["t"] if t_a <= t <= t_b]
            end = j.get("span_end_unix_s") or t_b  # where the attach's seconds ended (its command ends later)
            last_2s = [t for t in own if end - 2.0 <= t <= end]
            assert j["token_clock"] == "mark_token" and j["tokens"] > 100
            # not more than the loop made while the command ran (its log is written a generation at a time), and
            # at least half of what it made in the 2 s the attach lasted (however long the command took to start)
            assert 0.5 * len(last_2s) <= j["tokens"] <= len(own) + 100
            assert _reads(gguf_path, j)  # the GGUF's weights a token reads, plus the KV at its depth
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_llama_cpp_started_with_plain_python_is_injected_counted_and_detached(tmp_path, gguf_path):
    """The same loop started with a bare `python` (no decodemon run, no import): `attach` loads the agent through
    ptrace, the adapter counts llama.cpp's tokens and reads its facts, a re-attach reuses the agent, and the loop
    goes on decoding after the detach."""
    from tests.conftest import cli

    log = tmp_path / "tokens.jsonl"
    proc = subprocess.Popen([sys.executable, str(LOOP), "--shape", "tiny", "--gguf", str(gguf_path),
                             "--new-tokens", "100", "--log", str(log)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        t0 = time.time()
        while not (log.exists() and log.stat().st_size) and time.time() - t0 < 60:
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        for _ in range(2):  # injected, then the same agent re-attached
            r = cli("attach", proc.pid, "--json", "--seconds", 2)
            assert r.returncode == 0, r.stderr
            j = json.loads(r.stdout)
            assert j["token_clock"] == "mark_token" and j["tokens"] > 100
            assert _reads(gguf_path, j)
        lines = len(log.read_text().splitlines())
        t1 = time.time()
        while len(log.read_text().splitlines()) < lines + 2:  # two more generations after the detach
            assert proc.poll() is None and time.time() - t1 < 30, "the loop stopped after the detach"
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
