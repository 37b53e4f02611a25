"""llama-cpp-python's `Llama`, watched with no line of decodemon in the engine.

At attach the adapter wraps `llama_cpp.Llama.sample`, which `Llama.generate()` (and so `__call__`,
`create_completion` and the chat API, which all decode through it) calls once for each token it yields, right
after the `eval` (llama.cpp's `llama_decode`) whose logits it reads: the mark after it is where the token's step
ended. One token a mark also with a draft model, where one eval checks several tokens, and an exact prompt-cache
hit, whose empty eval decodes nothing, marks nothing. The wrapper marks the token (depth: `n_tokens`, the context
so far) and, for each `Llama` it first sees, reports the model facts from llama.cpp itself: the weights' bytes
(`llama_model_size`), layers, width, and KV bytes per position from the KV heads, the key and value lengths and
the cache's element types. At detach the original is put back; nothing else is touched. A process with no Python
(llama-server) needs watching from outside instead.
"""

from __future__ import annotations

import sys
import weakref

from decodemon.probes import agent
from decodemon.probes.frames import ModelFacts

_state: dict = {}
# bytes per element of the ggml types a KV cache can be kept in, by ggml_type id (f32, f16, q4_0, q4_1, q5_0,
# q5_1, q8_0, iq4_nl, bf16); another type: KV bytes unknown (0)
_KV_BYTES = {0: 4.0, 1: 2.0, 2: 18 / 32, 3: 20 / 32, 6: 22 / 32, 7: 24 / 32, 8: 34 / 32, 20: 18 / 32, 30: 2.0}
_KV_NAMES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 20: "iq4_nl", 30: "bf16"}
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
    tk, tv = (int(getattr(params, t, 1)) for t in ("type_k", "type_v"))
    kb, vb = _KV_BYTES.get(tk, 0.0), _KV_BYTES.get(tv, 0.0)
    arch = meta.get("general.architecture", "llama")
    head_dim = embd // max(heads, 1)  # unless the GGUF gives the key and value lengths (Qwen3, Gemma: not embd/heads)
    k_len = int(meta.get(f"{arch}.attention.key_length", head_dim))
    v_len = int(meta.get(f"{arch}.attention.value_length", head_dim))
    kv = layers * kv_heads * (k_len * kb + v_len * vb) if kb and vb else 0  # layer 0's KV heads for every layer
    return ModelFacts(name=meta.get("general.name", "") or "llama.cpp model",
                      weight_bytes=int(llama_cpp.llama_model_size(m)),
                      kv_bytes_per_position=int(round(kv)),
                      layers=layers, dtype=_FILE_TYPES.get(meta.get("general.file_type", ""), "gguf"), hidden=embd,
                      kv_dtype=_KV_NAMES.get(tk, str(tk)) if tk == tv else f"{_KV_NAMES.get(tk, tk)}/{_KV_NAMES.get(tv, tv)}")


def _wrap(original):
    def sample(self, *args, **kwargs):
        token = original(self, *args, **kwargs)
        try:
            reported = _state.get("reported")
            if reported is not None and self not in reported:
                reported.add(self)
                agent.set_model_facts(model_facts(self))
        except Exception:  # facts are a bonus; the token clock is the point
            pass
        agent.mark_token(int(getattr(self, "n_tokens", 0)))
        return token

    sample.__wrapped__ = original
    return sample


def install() -> str | None:
    """Hook every `Llama` in this process if llama_cpp is loaded; what was hooked, or None."""
    mod = sys.modules.get("llama_cpp")
    cls = getattr(mod, "Llama", None)
    if cls is None or "cls" in _state:
        return None
    original = cls.__dict__["sample"]
    wrapper = _wrap(original)
    cls.sample = wrapper
    _state.update(cls=cls, original=original, wrapper=wrapper, reported=weakref.WeakSet())
    return "llama_cpp Llama.sample()"


def uninstall() -> None:
    """Put the original back (unless something else has wrapped it since: then its wrapper stays, and ours in it
    only marks while attached)."""
    cls = _state.pop("cls", None)
    original, wrapper = _state.pop("original", None), _state.pop("wrapper", None)
    if cls is not None and cls.__dict__.get("sample") is wrapper:
        cls.sample = original
    _state.pop("reported", None)


def installed() -> bool:
    """Whether the hook is in."""
    return "cls" in _state
