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


def generate(llm, n: int, prompt: int = 5) -> list[int]:
    out = []
    for tok in llm.generate([1] + list(range(300, 300 + prompt - 1)), temp=0.0, reset=True):
        out.append(tok)
        if len(out) >= n:
            break
    return out


def test_the_gguf_writer_makes_a_llama_model_llama_cpp_loads_with_its_shape(gguf_path, llm):
    s = SHAPES["tiny"]
    assert not gguf_path.with_name(gguf_path.name + ".part").exists()
    assert llm.metadata["general.architecture"] == "llama"
    assert llama_cpp.llama_model_n_layer(llm.model) == s["layers"]
    assert llama_cpp.llama_model_n_embd(llm.model) == s["embd"]
    assert llama_cpp.llama_model_n_head_kv(llm.model) == s["heads_kv"]
    assert llm.n_vocab() == 259 + s["extra_vocab"]
    assert len(generate(llm, 6)) == 6  # it decodes (greedy on random weights)


def test_every_step_of_generate_is_marked_with_its_depth_and_the_facts_come_from_llama_cpp(llm, marks):
    seen, facts = marks
    assert "llama_cpp Llama.eval()" in hooks.attach()
    toks = generate(llm, 10, prompt=5)
    hooks.detach()
    # generate() evaluates the prompt, yields a token, evaluates it, ...: the 10th token is yielded before its
    # own eval, so ten tokens cost ten evals, the prefill's included
    assert len(toks) == 10 and len(seen) == 10
    assert seen == list(range(5, 15))  # the context after each step: prompt 5, then one more a step
    f = facts[0]
    assert f.weight_bytes == llama_cpp.llama_model_size(llm.model)
    assert (f.layers, f.hidden, f.dtype) == (2, 64, "float16")
    assert f.kv_bytes_per_position == 2 * 2 * 16 * (2 + 2)  # layers x KV heads x head_dim x (K + V in f16)


def test_detach_puts_eval_back_as_it_was(llm, marks):
    seen, _ = marks
    original = llama_cpp.Llama.__dict__["eval"]
    assert lg.install() == "llama_cpp Llama.eval()"
    assert lg.install() is None  # once
    hooks.detach()
    assert llama_cpp.Llama.__dict__["eval"] is original and not lg.installed()
    generate(llm, 4)
    assert seen == []


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
            print(j["tokens"], len(own), j.get("ms_per_token"), j.get("bytes_per_token_model"))
            assert j["token_clock"] == "mark_token" and j["tokens"] > 100
            assert 0.5 * len(own) <= j["tokens"] <= len(own) + 2 * j["tokens"] // 100 + 1
            assert j["bytes_per_token_model"] >= 279_000  # the GGUF's weights, read through llama.cpp
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
