"""A llama.cpp model's own figure, read from its GGUF file in the monitor's process: the bytes one token reads.

llama.cpp maps the model file it decodes (its default), so the monitor finds it among the target's mappings, or
on llama-server's command line (`-m`), and reads the header only: the metadata and every tensor's shape and type.
A token reads every weight once except the embedding table, of which it reads its own row; a model whose output
layer is the embedding table itself (no `output.weight`) reads all of it for the logits. The KV cache is priced per
position in the cache's own type (f16 unless the server was told `-ctk`/`-ctv`, or llama-cpp-python's
`type_k`/`type_v`).
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

# ggml type id: (elements a block, bytes a block), from ggml's type traits
GGML_BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 36),
               10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 15: (256, 292),
               16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18), 21: (256, 110),
               22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8),
               29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17)}
# the names llama.cpp's cache-type options take, with their ggml ids
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
CACHE_NAMES = {v: k for k, v in CACHE_TYPES.items()}
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
MAX_HEADER_BYTES = 256 << 20  # a vocabulary of a few hundred thousand strings is a few MB; past this, not a model


class GgufError(ValueError):
    """Not a GGUF file this reader understands; one line."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]
    ggml_type: int

    def nbytes(self, elements: int | None = None) -> int:
        """Bytes of the whole tensor, or of its first `elements` elements (a row)."""
        block, size = GGML_BLOCKS.get(self.ggml_type, (0, 0))
        if not block:
            raise GgufError(f"tensor {self.name} has a ggml type ({self.ggml_type}) this reader does not size")
        n = elements if elements is not None else _prod(self.dims)
        return -(-n // block) * size


def _prod(dims) -> int:
    p = 1
    for d in dims:
        p *= d
    return p


class _Reader:
    def __init__(self, f) -> None:
        self.f, self.read_bytes = f, 0

    def take(self, n: int) -> bytes:
        self.read_bytes += n
        if self.read_bytes > MAX_HEADER_BYTES:
            raise GgufError(f"a header past {MAX_HEADER_BYTES >> 20} MB")
        b = self.f.read(n)
        if len(b) != n:
            raise GgufError("the file ends inside its header")
        return b

    def num(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def text(self) -> str:
        return self.take(self.num("<Q")).decode("utf-8", "replace")

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.num(_SCALARS[kind])
        if kind == 8:
            return self.text()
        if kind == 9:
            item, n = self.num("<I"), self.num("<Q")
            if item == 8:  # strings (a vocabulary): skipped, never decoded
                for _ in range(n):
                    self.take(self.num("<Q"))
                return n
            if item not in _SCALARS:
                raise GgufError(f"an array of type {item}")
            fmt = _SCALARS[item]
            raw = self.take(n * struct.calcsize(fmt))
            return list(struct.unpack(f"<{n}{fmt[1]}", raw)) if n <= 4096 else n
        raise GgufError(f"a metadata value of type {kind}")


def read_header(path) -> tuple[dict, list[Tensor]]:
    """(metadata, tensors) of a GGUF file: arrays of strings are given as their length."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if r.take(4) != b"GGUF":
            raise GgufError(f"{os.path.basename(str(path))} is not a GGUF file")
        version = r.num("<I")
        if version not in (2, 3):
            raise GgufError(f"GGUF version {version}")
        n_tensors, n_kv = r.num("<Q"), r.num("<Q")
        meta = {}
        for _ in range(n_kv):
            key = r.text()
            meta[key] = r.value(r.num("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.text()
            dims = tuple(r.num("<Q") for _ in range(r.num("<I")))
            ggml_type = r.num("<I")
            r.num("<Q")  # offset
            tensors.append(Tensor(name, dims, ggml_type))
    return meta, tensors


@dataclass(frozen=True)
class TokenBytes:
    """What one token reads from a llama.cpp model: its weights (one embedding row), and its KV per position."""

    name: str
    weights_read: int  # every tensor but the embedding table, plus one row of it (all of it when it is the output)
    weights_total: int
    kv_per_position: int
    kv_type: str
    layers: int
    hidden: int
    weight_type: str


def _per_layer(v, layers: int) -> list[int]:
    return [int(x) for x in v] if isinstance(v, list) else [int(v)] * layers


def token_bytes(meta: dict, tensors: list[Tensor], type_k: int = 1, type_v: int = 1) -> TokenBytes:
    """The bytes a token reads, from a GGUF header and the cache's element types (ggml ids; f16 by default)."""
    arch = str(meta.get("general.architecture", "llama"))
    total = sum(t.nbytes() for t in tensors)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    tied = not any(t.name == "output.weight" for t in tensors)
    read = total
    if embd is not None and not tied:
        read = total - embd.nbytes() + embd.nbytes(embd.dims[0])
    layers = int(meta.get(f"{arch}.block_count", 0))
    hidden = int(meta.get(f"{arch}.embedding_length", 0))
    heads = _per_layer(meta.get(f"{arch}.attention.head_count", 1), layers)
    kv_heads = _per_layer(meta.get(f"{arch}.attention.head_count_kv", heads), layers)
    head_dim = hidden // max(heads[0] if heads else 1, 1)
    k_len = int(meta.get(f"{arch}.attention.key_length", head_dim))
    v_len = int(meta.get(f"{arch}.attention.value_length", head_dim))
    kv = sum(Tensor("k", (k_len * h,), type_k).nbytes() + Tensor("v", (v_len * h,), type_v).nbytes()
             for h in kv_heads)
    ftype = {0: "f32", 1: "f16", 2: "q4_0", 7: "q8_0", 15: "q4_k_m", 32: "bf16"}.get(meta.get("general.file_type"),
                                                                                     "gguf")
    kv_type = CACHE_NAMES.get(type_k, str(type_k)) if type_k == type_v else \
        f"{CACHE_NAMES.get(type_k, type_k)}/{CACHE_NAMES.get(type_v, type_v)}"
    return TokenBytes(str(meta.get("general.name", "") or "llama.cpp model"), read, total, kv, kv_type, layers,
                      hidden, ftype)


def mapped_model(pid: int) -> str | None:
    """The GGUF file process `pid` has mapped (llama.cpp maps the model it decodes), or None."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.endswith(".gguf") and os.path.isfile(path):
                    return path
    except OSError:
        pass
    return None


def server_cache_types(argv: list[str], env: dict[str, str]) -> tuple[int, int]:
    """llama-server's KV cache types (ggml ids) from its command line or its LLAMA_ARG_* environment; f16 unset."""
    got = {"k": env.get("LLAMA_ARG_CACHE_TYPE_K"), "v": env.get("LLAMA_ARG_CACHE_TYPE_V")}
    for i, a in enumerate(argv[:-1]):
        m = re.fullmatch(r"-ct([kv])|--cache-type-([kv])", a)
        if m:
            got[m.group(1) or m.group(2)] = argv[i + 1]
    return tuple(CACHE_TYPES.get((got[k] or "f16").lower(), 1) for k in ("k", "v"))


def model_facts(pid: int, facts, argv: list[str] | None = None, env: dict[str, str] | None = None):
    """A llama.cpp target's ModelFacts (probes/wire.py) with the bytes a token reads from the GGUF file it maps:
    `facts` as its adapter reported them (KV and its type kept), or None for a server watched from outside, whose
    KV types come from `argv` and `env`. None where the target maps no GGUF this reader understands."""
    import msgspec

    from decodemon.probes import wire

    path = mapped_model(pid)
    if path is None:
        return None
    types = server_cache_types(argv or [], env or {}) if facts is None else (1, 1)
    try:
        tb = token_bytes(*read_header(path), *types)
    except (OSError, GgufError, struct.error):
        return None
    if facts is None:
        return wire.ModelFacts(name=tb.name, weight_bytes=tb.weights_read, kv_bytes_per_position=tb.kv_per_position,
                               layers=tb.layers, dtype=tb.weight_type, hidden=tb.hidden, kv_dtype=tb.kv_type,
                               weight_bytes_total=tb.weights_total)
    return msgspec.structs.replace(facts, weight_bytes=tb.weights_read, weight_bytes_total=tb.weights_total)
