"""transformers' `generate()`, watched with no line of decodemon in the engine.

At attach the adapter wraps `GenerationMixin._update_model_kwargs_for_generation`, which every decoding loop
of `generate()` (greedy, sampling, static cache, compiled forward) calls once per step and looks up on the
model at each call, so a `generate()` already running is picked up at its next step. The wrapper marks the
token (depth from the attention mask's length: a host-side shape, no device sync) and, at the first step it
sees, reports the model facts: parameter bytes, KV bytes per position (the cache's own layers, else the config),
layers and dtype. At detach the original is put back; nothing else is touched.
"""

from __future__ import annotations

import sys

from decodemon.probes import agent
from decodemon.probes.frames import ModelFacts

_NAME = "_update_model_kwargs_for_generation"
_state: dict = {}


def _depth(model_kwargs: dict) -> int:
    mask = model_kwargs.get("attention_mask")
    if mask is not None and getattr(mask, "ndim", 0) >= 1:
        return int(mask.shape[-1])
    pos = model_kwargs.get("cache_position")
    return int(pos.shape[-1]) if pos is not None and getattr(pos, "ndim", 0) else 0


def kv_bytes_per_position(model, cache=None) -> int:
    """KV cache bytes one more position adds: from the cache's own tensors when it has them, else the config."""
    layers = getattr(cache, "layers", None)
    if layers:
        total = 0
        for layer in layers:
            k = getattr(layer, "keys", None)
            if k is None or getattr(k, "ndim", 0) != 4:
                total = 0
                break
            total += 2 * k.shape[1] * k.shape[3] * k.element_size()  # keys and values: heads x head_dim
        if total:
            return int(total)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", 0)
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // max(cfg.num_attention_heads, 1))
    elt = next(model.parameters()).element_size()
    return int(2 * cfg.num_hidden_layers * heads * head_dim * elt)


def model_facts(model, cache=None) -> ModelFacts:
    """What the diagnosis needs, read from a transformers model (and its cache, if given)."""
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    return ModelFacts(name=getattr(cfg, "_name_or_path", "") or type(model).__name__, weight_bytes=int(weight_bytes),
                      kv_bytes_per_position=kv_bytes_per_position(model, cache),
                      layers=int(getattr(cfg, "num_hidden_layers", 0)), dtype=dtype,
                      hidden=int(getattr(cfg, "hidden_size", 0)))


def _wrap(original):
    def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
        out = original(self, outputs, model_kwargs, *args, **kwargs)
        if id(self) not in _state.setdefault("reported", set()):
            _state["reported"].add(id(self))
            try:
                agent.set_model_facts(model_facts(self, out.get("past_key_values")))
            except Exception:  # facts are a bonus; the token clock is the point
                pass
        agent.mark_token(_depth(out))
        return out

    _update_model_kwargs_for_generation.__wrapped__ = original
    return _update_model_kwargs_for_generation


def install() -> str | None:
    """Hook every `generate()` in this process if transformers is loaded; what was hooked, or None."""
    mod = sys.modules.get("transformers.generation.utils")
    if mod is None or "mixin" in _state:
        return None
    mixin = mod.GenerationMixin
    original = mixin.__dict__[_NAME]
    setattr(mixin, _NAME, _wrap(original))
    _state.update(mixin=mixin, original=original, reported=set())
    return "transformers generate()"


def uninstall() -> None:
    """Put the original back."""
    mixin = _state.pop("mixin", None)
    if mixin is not None:
        setattr(mixin, _NAME, _state.pop("original"))
    _state.pop("reported", None)


def installed() -> bool:
    """Whether the hook is in."""
    return "mixin" in _state
