"""A llama.cpp model's own figure, read by the monitor from the GGUF file the target maps: every weight once, the
embedding table's one row, and the KV cache per position in the cache's own type. Held against llama.cpp's own
counts on a tiny random-weight model written with the `gguf` package."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from decodemon.monitor import gguf  # noqa: E402

LOOP = Path(__file__).parents[1] / "benchmarks" / "loops" / "llama_cpp_decode.py"
sys.path.insert(0, str(LOOP.parent))
from llama_cpp_decode import SHAPES, write_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "tiny")


def test_a_token_reads_every_weight_once_and_one_row_of_the_embedding_table(tiny):
    meta, tensors = gguf.read_header(tiny)
    s = SHAPES["tiny"]
    by_name = {t.name: t for t in tensors}
    embd = by_name["token_embd.weight"]
    assert embd.dims == (s["embd"], 259 + s["extra_vocab"])  # ggml's order: a row is its first dimension
    tb = gguf.token_bytes(meta, tensors)
    assert tb.weights_total - tb.weights_read == embd.nbytes() - embd.nbytes(s["embd"])
    assert tb.layers == s["layers"] and tb.hidden == s["embd"] and tb.kv_type == "f16"
    head = s["embd"] // s["heads"]
    assert tb.kv_per_position == s["layers"] * s["heads_kv"] * head * 2 * 2  # K and V, f16


def test_an_output_layer_that_is_the_embedding_table_is_read_whole(tiny):
    meta, tensors = gguf.read_header(tiny)
    tied = [t for t in tensors if t.name != "output.weight"]
    tb = gguf.token_bytes(meta, tied)
    assert tb.weights_read == tb.weights_total  # the logits read every row of it


def test_the_kv_cache_is_priced_in_its_own_type(tiny):
    meta, tensors = gguf.read_header(tiny)
    f16 = gguf.token_bytes(meta, tensors).kv_per_position
    q8 = gguf.token_bytes(meta, tensors, gguf.CACHE_TYPES["q8_0"], gguf.CACHE_TYPES["q8_0"])
    q4 = gguf.token_bytes(meta, tensors, gguf.CACHE_TYPES["q4_0"], gguf.CACHE_TYPES["q4_0"])
    assert q8.kv_type == "q8_0" and q8.kv_per_position == pytest.approx(f16 * 34 / 64, rel=0.05)
    assert q4.kv_per_position == pytest.approx(f16 * 18 / 64, rel=0.05)
    assert gguf.server_cache_types(["llama-server", "-m", "x.gguf", "-ctk", "q8_0", "--cache-type-v", "q4_0"], {}) \
        == (8, 2)
    assert gguf.server_cache_types(["llama-server"], {"LLAMA_ARG_CACHE_TYPE_K": "q8_0"}) == (8, 1)


def test_a_file_that_is_not_gguf_is_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 40)
    with pytest.raises(gguf.GgufError, match="not a GGUF file"):
        gguf.read_header(bad)
    short = tmp_path / "short.gguf"
    short.write_bytes(tiny_prefix := b"GGUF\x03\0\0\0" + b"\x05" + b"\0" * 3)
    assert tiny_prefix
    with pytest.raises(gguf.GgufError, match="ends inside its header"):
        gguf.read_header(short)


def test_the_model_a_running_llama_cpp_maps_gives_its_facts_and_matches_llama_cpps_own_size(tiny):
    """A real llama-cpp-python process maps the file; the monitor finds it from /proc and reads it, and the total
    is llama.cpp's own `llama_model_size`."""
    llama_cpp = pytest.importorskip("llama_cpp")
    code = ("import sys, time, llama_cpp; m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, verbose=False); "
            "print(llama_cpp.llama_model_size(m.model), flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tiny)], stdout=subprocess.PIPE, text=True)
    try:
        size = int(p.stdout.readline())
        t0 = time.monotonic()
        while gguf.mapped_model(p.pid) is None and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert gguf.mapped_model(p.pid) == str(tiny)
        facts = gguf.model_facts(p.pid, None, ["llama-server", "-ctk", "q8_0", "-ctv", "q8_0"], {})
        assert facts.weight_bytes_total == size and facts.weight_bytes < size and facts.kv_dtype == "q8_0"
    finally:
        p.kill()
        p.wait()
    assert llama_cpp
