"""llama-cpp-python's `Llama`, watched with no line of decodemon in the engine.

At attach the adapter wraps `llama_cpp.Llama.eval`, which `Llama.generate()` (and so `__call__`,
`create_completion` and the chat API, which all decode through it) calls once per step: the prompt's prefill,
then one call per new token. `eval` returns once llama.cpp's `llama_decode` has the step's logits, so the mark
after it is where the step ends. The wrapper marks the token (depth: `n_tokens`, the context so far) and, for
each `Llama` it first sees, reports the model facts from llama.cpp itself: the weights' bytes
(`llama_model_size`), layers, width, and KV bytes per position from the KV heads and the cache's element type.
At detach the original is put back; nothing else is touched. A process with no Python (llama-server) needs
watching from outside instead.
"""

from __future__ import annotations

import sys

from decodemon.probes import agent
from decodemon.probes.wire import ModelFacts

_state: dict = {}
# bytes per element of ggml types a KV cache is kept in (ggml_type ids: f32, f16, q4_0, q8_0, bf16)
_KV_BYTES = {0: 4.0, 1: 2.0, 2: 18 / 32, 8: 34 / 32, 30: 2.0}
# general.file_type ids to the weights' type, as GGUF names them
_FILE_TYPES = {"0": "float32", "1": "float16", "2": "q4_0", "7": "q8_0", "15": "q4_k_m", "32": "bfloat16"}


def model_facts(llm) -> ModelFacts:
    """What the diagnosis needs, read from a loaded `llama_cpp.Llama`."""
    import llama_cpp  # noqa: PLC0415 - loaded already: the adapter only installs where it is

    m = llm.model
    layers, heads = int(llama_cpp.llama_model_n_layer(m)), int(llama_cpp.llama_model_n_head(m))
    kv_heads, embd = int(llama_cpp.llama_model_n_head_kv(m)), int(llama_cpp.llama_model_n_embd(m))
    meta = getattr(llm, "metadata", {}) or {}
    params = getattr(llm, "context_params", None)
    kb, vb = (_KV_BYTES.get(int(getattr(params, t, 1)), 2.0) for t in ("type_k", "type_v"))
    head_dim = embd // max(heads, 1)
    return ModelFacts(name=meta.get("general.name", "") or "llama.cpp model",
                      weight_bytes=int(llama_cpp.llama_model_size(m)),
                      kv_bytes_per_position=int(round(layers * kv_heads * head_dim * (kb + vb))),
                      layers=layers, dtype=_FILE_TYPES.get(meta.get("general.file_type", ""), "gguf"), hidden=embd)


def _wrap(original):
    def eval(self, tokens):  # noqa: A001 - the name it replaces
        out = original(self, tokens)
        if id(self) not in _state.setdefault("reported", set()):
            _state["reported"].add(id(self))
            try:
                agent.set_model_facts(model_facts(self))
            except Exception:  # facts are a bonus; the token clock is the point
                pass
        agent.mark_token(int(getattr(self, "n_tokens", 0)))
        return out

    eval.__wrapped__ = original
    return eval


def install() -> str | None:
    """Hook every `Llama` in this process if llama_cpp is loaded; what was hooked, or None."""
    mod = sys.modules.get("llama_cpp")
    cls = getattr(mod, "Llama", None)
    if cls is None or "cls" in _state:
        return None
    original = cls.__dict__["eval"]
    cls.eval = _wrap(original)
    _state.update(cls=cls, original=original, reported=set())
    return "llama_cpp Llama.eval()"


def uninstall() -> None:
    """Put the original back."""
    cls = _state.pop("cls", None)
    if cls is not None:
        cls.eval = _state.pop("original")
    _state.pop("reported", None)


def installed() -> bool:
    """Whether the hook is in."""
    return "cls" in _state
