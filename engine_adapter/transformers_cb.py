"""transformers' continuous batching (`init_continuous_batching`, `generate_batch`, `transformers serve`), watched
with no line of decodemon in the engine.

At attach the adapter wraps `prepare_batch_update` of the batch's input/output holders (the synchronous and the
asynchronous one), which `ContinuousBatchProcessor.update_batch` calls once per decode step, in the engine's
background thread, after the step's forward. The wrapper counts the requests that got a token in that step and
marks the step with them (`agent.mark_step`): the step is the unit, a step's tokens are the batch it ran, and its
depth the KV positions all of them read; a request with no token yet gets its first in that step, and its time to
it from its arrival goes with the step (`agent.note_first_tokens`). Once, it
reports the model's facts from the processor's model. At detach the originals are put back.
"""

from __future__ import annotations

import sys
import time

from decodemon.probes import agent

_NAME = "prepare_batch_update"
_CLASSES = ("ContinuousBatchingIOs", "ContinuousBatchingAsyncIOs")
_state: dict = {}


def _wrap(original):
    def prepare_batch_update(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        try:
            stepped = [fs for fs in out[0] if fs.has_new_token]
        except Exception:  # a shape this adapter does not know: the engine runs on unwatched
            return out
        if stepped:
            # the step read every sequence's KV at its depth: their positions summed are the step's depth (the
            # bandwidth floor a step is the weights once plus all of them)
            try:
                kv = sum(int(fs.state.position_offset) for fs in stepped)
            except Exception:
                kv = 0
            agent.mark_step(len(stepped), kv)
            # a request with no token yet gets its first in this step (update_batch adds it after this call): its
            # time to first token, from its arrival (created_time, perf_counter's clock, as the engine stamps it)
            try:
                now = time.perf_counter()
                # a request the engine re-queued (evicted, or a child it could not fork) starts again with no
                # token and its own created_time, but made its first token long before: not counted again
                first = [now - fs.state.created_time for fs in stepped
                         if not fs.state.generated_tokens and not getattr(fs.state, "_true_initial_tokens", 0)]
            except Exception:
                first = []
            if first:
                agent.note_first_tokens(first)
        return out

    prepare_batch_update.__wrapped__ = original
    return prepare_batch_update


def _wrap_step(original):
    def _generation_step(self, *args, **kwargs):
        if not _state.get("reported"):  # the model's facts, once per attach, from the manager that runs it
            _state["reported"] = True
            try:
                from decodemon.engine_adapter.transformers_generate import model_facts

                agent.set_model_facts(model_facts(self.model))
            except Exception:  # facts are a bonus; the step clock is the point
                pass
        return original(self, *args, **kwargs)

    _generation_step.__wrapped__ = original
    return _generation_step


def install() -> str | None:
    """Hook every continuous-batching step in this process if transformers' CB is loaded; what was hooked."""
    mod = sys.modules.get("transformers.generation.continuous_batching.input_outputs")
    if mod is None or "originals" in _state:
        return None
    originals = {}
    for name in _CLASSES:
        cls = getattr(mod, name, None)
        if cls is not None and _NAME in cls.__dict__:
            originals[cls] = cls.__dict__[_NAME]
            setattr(cls, _NAME, _wrap(originals[cls]))
    if not originals:
        return None
    api = sys.modules.get("transformers.generation.continuous_batching.continuous_api")
    manager = getattr(api, "ContinuousBatchingManager", None)
    step = {}
    if manager is not None and "_generation_step" in manager.__dict__:
        step[manager] = manager.__dict__["_generation_step"]
        setattr(manager, "_generation_step", _wrap_step(step[manager]))
    _state.update(originals=originals, step=step, reported=False)
    return "transformers continuous batching"


def uninstall() -> None:
    """Put the originals back."""
    for cls, original in _state.pop("originals", {}).items():
        setattr(cls, _NAME, original)
    for cls, original in _state.pop("step", {}).items():
        setattr(cls, "_generation_step", original)
    _state.pop("reported", None)
