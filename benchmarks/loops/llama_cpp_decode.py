"""llama.cpp's own generate loop through llama-cpp-python, on a random-weight Llama GGUF: no decodemon in it.

    python benchmarks/loops/llama_cpp_decode.py --shape tiny --gguf /tmp/tiny.gguf --generations 2
    python benchmarks/loops/llama_cpp_decode.py --shape llama-1b --gguf m.gguf --n-gpu-layers -1 --log t.jsonl

The GGUF is written with the `gguf` package when the file does not exist (f16 weights, a byte-level SentencePiece
vocabulary), Llama-shaped, in the sizes of SHAPES. Each generation is `Llama.generate()` for `--new-tokens`
tokens after a short prompt; every token's host time goes to `--log` (the engine's own count). On CUDA builds,
ggml's CUDA graphs are on unless `GGML_CUDA_DISABLE_GRAPHS=1` is set in the environment.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TokenLog, stop_on_term  # noqa: E402

# GGUF llama.* fields of the shapes: embedding, layers, feed-forward, heads, KV heads, vocabulary pieces past
# the 259 byte and special tokens
SHAPES = {
    "tiny": dict(embd=64, layers=2, ff=128, heads=4, heads_kv=2, extra_vocab=253),
    # heads of 32: a quantized KV cache (q8_0, q4_0: blocks of 32) fits them, where tiny's 16 do not
    "tiny-kv32": dict(embd=64, layers=2, ff=128, heads=2, heads_kv=1, extra_vocab=253),
    "llama-1b": dict(embd=2048, layers=16, ff=8192, heads=32, heads_kv=8, extra_vocab=32_000),
    "llama-8b": dict(embd=4096, layers=32, ff=14336, heads=32, heads_kv=8, extra_vocab=32_000),
}
CTX = 131072  # the training context the GGUF states (Llama 3.1's): llama-server caps a slot at it (server1b_kvq8 goes ~60k deep)


def vocab(extra: int) -> tuple[list[bytes], list[float], list[int]]:
    """A SentencePiece ("llama") vocabulary: <unk>, <s>, </s>, the 256 byte tokens, then `extra` pieces."""
    import gguf

    tt = gguf.TokenType
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [tt.UNKNOWN, tt.CONTROL, tt.CONTROL] + [tt.BYTE] * 256
    tokens += [f"\u2581t{i}".encode() for i in range(extra)]
    types += [tt.NORMAL] * extra
    scores = [0.0] * 259 + [-float(i) for i in range(extra)]
    return tokens, scores, [int(t) for t in types]


def write_gguf(path: str | Path, shape: str, seed: int = 0) -> Path:
    """A Llama-architecture GGUF with random f16 weights (norms at one), written to `path`. Tensors are made and
    written one at a time (an 8B model is never all in memory), into a temporary file that is renamed only once
    complete and removed if anything fails, so no half-written model is ever left under either name."""
    import os
    import tempfile

    import gguf
    import numpy as np

    s, path = SHAPES[shape], Path(path)
    tokens, scores, types = vocab(s["extra_vocab"])
    n_vocab, d, hd, kv = len(tokens), s["embd"], s["embd"] // s["heads"], s["heads_kv"] * (s["embd"] // s["heads"])
    specs = [("token_embd.weight", (n_vocab, d))]  # numpy (rows, cols) = ggml ne (cols, rows)
    for i in range(s["layers"]):
        b = f"blk.{i}."
        specs += [(b + "attn_norm.weight", (d,)), (b + "attn_q.weight", (d, d)), (b + "attn_k.weight", (kv, d)),
                  (b + "attn_v.weight", (kv, d)), (b + "attn_output.weight", (d, d)), (b + "ffn_norm.weight", (d,)),
                  (b + "ffn_gate.weight", (s["ff"], d)), (b + "ffn_up.weight", (s["ff"], d)),
                  (b + "ffn_down.weight", (d, s["ff"]))]
    specs += [("output_norm.weight", (d,)), ("output.weight", (n_vocab, d))]
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    w = gguf.GGUFWriter(tmp, "llama")
    try:
        w.add_name(f"decodemon random {shape}")
        w.add_context_length(CTX)
        w.add_embedding_length(d)
        w.add_block_count(s["layers"])
        w.add_feed_forward_length(s["ff"])
        w.add_head_count(s["heads"])
        w.add_head_count_kv(s["heads_kv"])
        w.add_rope_dimension_count(hd)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        for name, shp in specs:  # norms f32, matrices f16
            dt = np.dtype(np.float32 if len(shp) == 1 else np.float16)
            w.add_tensor_info(name, shp, dt, int(np.prod(shp)) * dt.itemsize)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        rng = np.random.default_rng(seed)
        for _, shp in specs:
            if len(shp) == 1:
                w.write_tensor_data(np.ones(shp, dtype=np.float32))
            else:
                w.write_tensor_data((rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float16))
        w.close()
        os.replace(tmp, path)
    except BaseException:
        w.close()
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--gguf", required=True, help="the model file (written first if it does not exist)")
    ap.add_argument("--n-gpu-layers", type=int, default=0, help="-1: every layer on the GPU (CUDA builds)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--generations", type=int, default=0, help="0: until SIGTERM")
    ap.add_argument("--log")
    a = ap.parse_args()
    if not Path(a.gguf).exists():
        write_gguf(a.gguf, a.shape)
    import llama_cpp

    llm = llama_cpp.Llama(model_path=a.gguf, n_ctx=min(CTX, a.prompt + a.new_tokens + 8), n_gpu_layers=a.n_gpu_layers,
                          n_threads=a.threads, n_batch=max(8, a.prompt), verbose=False)
    prompt = [1] + [300 + (i * 7) % 200 for i in range(a.prompt - 1)]
    log, flag = TokenLog(a.log), stop_on_term()

    def generate(n: int, logged: bool) -> None:
        llm.reset()
        for k, _tok in enumerate(llm.generate(prompt, temp=0.0, reset=True)):
            if logged:
                log.put()
            if k + 1 >= n:
                break

    generate(4, False)  # warm
    print("decoding", flush=True)
    done = 0
    while not flag["stop"] and (a.generations == 0 or done < a.generations):
        generate(a.new_tokens, True)
        log.flush()
        done += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
