"""Whether two runs are of one model and one device: by the model's facts, not its label.

One model reaches decodemon under several names (the demo engine's "qwen3-0.6b", transformers' class name
"Qwen3ForCausalLM"), and two models can share a name; the facts an adapter reports (layers, hidden size, dtype,
the weights' bytes) say which. The weights a rank holds shrink with the tensor-parallel degree (and not by
exactly 1/N: embeddings may be replicated), so bytes are held against each other only at one degree.
"""

from __future__ import annotations

import os

WEIGHT_BYTES_SAME = 0.02  # two runs of one model at one degree read the same weights; a 2% slack for rounding


def model_difference(a, b) -> str | None:
    """Why ModelFacts `a` and `b` are two models, in words, or None when they are one (or either is unknown)."""
    if a is None or b is None:
        return None
    for what, x, y in (("layers", a.layers, b.layers), ("hidden size", a.hidden, b.hidden),
                       ("dtype", _dtype(a.dtype), _dtype(b.dtype))):
        if x and y and x != y:
            return f"{what} {x} against {y}"
    if a.weight_bytes and b.weight_bytes and not _weights_fit(a, b):
        return (f"weights {a.weight_bytes:,} bytes a rank at tp {a.tp_degree} against {b.weight_bytes:,} at tp "
                f"{b.tp_degree}")
    if not (a.layers and b.layers) and a.name != b.name:  # no shape to go by: the names are all there is
        return f"named {a.name} and {b.name}, with no layer count to match them by"
    return None


# one dtype, as two adapters spell it (torch's names, GGUF's)
DTYPE_NAMES = {"f16": "float16", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "f32": "float32",
               "fp32": "float32", "float": "float32"}


def _dtype(name: str | None) -> str | None:
    """A dtype by one name, whichever adapter spelled it."""
    if not name:
        return name
    n = str(name).lower().removeprefix("torch.")
    return DTYPE_NAMES.get(n, n)


def _weights_fit(a, b) -> bool:
    """One model's weights at two degrees: a rank of the higher degree holds between 1/N and all of the lower
    degree's (the same, within WEIGHT_BYTES_SAME, at one degree)."""
    lo, hi = sorted((a, b), key=lambda m: max(m.tp_degree, 1))
    least = lo.weight_bytes * max(lo.tp_degree, 1) / max(hi.tp_degree, 1)
    return least * (1 - WEIGHT_BYTES_SAME) <= hi.weight_bytes <= lo.weight_bytes * (1 + WEIGHT_BYTES_SAME)


def model_words(m) -> str:
    """A model as the messages name it: its label and the facts it is matched by."""
    if m is None:
        return "no model facts"
    shape = ", ".join(x for x in (f"{m.layers} layers" if m.layers else "", f"hidden {m.hidden}" if m.hidden else "",
                                  m.dtype) if x)
    return f"{m.name} ({shape})" if shape else m.name


def device_difference(sa, sb) -> str | None:
    """Why snapshots `sa` and `sb` ran on two kinds of device (name, SM count), or None when on one kind."""
    if sa.device != sb.device or sa.sm_count != sb.sm_count:
        return f"{sa.device} ({sa.sm_count} SMs) against {sb.device} ({sb.sm_count} SMs)"
    return None


def tp_difference(a, b) -> str | None:
    """Why ModelFacts `a` and `b` ran at two tensor-parallel degrees, or None (one degree, or either unknown):
    a rank's bytes, weights and KV cache are its shard's, so their ratio holds the degree."""
    if a is None or b is None or max(a.tp_degree, 1) == max(b.tp_degree, 1):
        return None
    return (f"A ran at TP {max(a.tp_degree, 1)}, B at TP {max(b.tp_degree, 1)}: each side's figures are one rank's, "
            "and bytes/token are per rank (a rank reads its shard of the weights)")


def differences(snap_a, snap_b, same_source: bool = False) -> dict | None:
    """Where A and B are not two runs of one model on one kind of device at one degree, keyed by what differs
    ("source", "model", "tp", "device", "clock"), in words; None where nothing does: their ratios then measure a
    change of code. `same_source`: both name one recording (or one pid), so every ratio is 1 by construction."""
    from decodemon.monitor.render.text import unit
    from decodemon.monitor.token_clock import STEP_STARTS, clock_kind

    out = {}
    if same_source:
        one = (f"one pid ({snap_a.label}): the ratios hold the loop against itself" if str(snap_a.label).isdigit()
               else f"one recording ({snap_a.label}): every ratio is 1 by construction")
        out["source"] = f"A and B are {one}; give the run before a change and the run after it"
    why = model_difference(snap_a.model, snap_b.model)
    if why is not None:
        out["model"] = f"A is {model_words(snap_a.model)}, B is {model_words(snap_b.model)} ({why})"
    elif (snap_a.model is None) != (snap_b.model is None):
        out["model"] = (f"A is {model_words(snap_a.model)}, B is {model_words(snap_b.model)}: one run has no "
                        "model facts to match by")
    why = tp_difference(snap_a.model, snap_b.model)
    if why is not None:
        out["tp"] = why
    why = device_difference(snap_a, snap_b)
    if why is not None:
        out["device"] = f"A ran on {why.replace(' against ', ', B on ', 1)}"
    kv_a, kv_b = (s.model.kv_dtype if s.model is not None else None for s in (snap_a, snap_b))
    if kv_a and kv_b and kv_a != kv_b:  # llama.cpp's cache type: a token reads other KV bytes a position
        out["kv"] = f"A's KV cache is {kv_a}, B's is {kv_b}: a position's KV bytes differ"
    per_a, per_b = (s.tokens_per_step for s in (snap_a, snap_b))
    if per_a is not None and per_b is not None and abs(per_a - per_b) > 0.1 * max(per_a, per_b):
        out["batch"] = (f"A ran {per_a:g} token{'s' if per_a != 1 else ''} a step, B {per_b:g}: a step's bytes "
                        "and time are shared by its tokens")
    one_token_steps = all(abs((s.tokens_per_step or 1.0) - 1.0) <= 0.1 for s in (snap_a, snap_b))
    if unit(snap_a) != unit(snap_b) and not one_token_steps:  # a batched engine's marks are steps of several tokens
        out["clock"] = (f"A's marks are {unit(snap_a)}s, B's are {unit(snap_b)}s: every per-token ratio (ms/token, "
                        "tokens/s, kernels, launch calls and kernel time per token) divides a token by a step; "
                        "compare the throughput (tokens/s of every request) instead")
    kinds = [clock_kind(s.token_clock) for s in (snap_a, snap_b)]
    if "clock" not in out and kinds[0] != kinds[1] and snap_a.tokens is not None and snap_b.tokens is not None:
        out["clock"] = (f"A's ms/{unit(snap_a)} is a {kinds[0]} ({snap_a.token_clock}), B's a {kinds[1]} "
                        f"({snap_b.token_clock}): a mean counts slow steps a median passes over; tokens_per_s, a "
                        "mean on both sides, compares them")
    starts = [s.token_clock == STEP_STARTS for s in (snap_a, snap_b)]
    if "clock" not in out and starts[0] != starts[1] and snap_a.tokens is not None and snap_b.tokens is not None:
        every, other = ("A", "B") if starts[0] else ("B", "A")
        out["clock"] = (f"{every}'s clock counts every step, those the observer's own steps slowed too "
                        f"(step_starts), and {other}'s leaves those out (observer_cost.slowed_tokens): the ratios "
                        "hold the observer's share as well as the change")
    return out or None


def same_source(a: str, b: str) -> bool:
    """Both specs name one source: one pid, or one recording (the same resolved path, a hard link to it, or a copy
    of its bytes)."""
    from pathlib import Path

    a, b = str(a), str(b)
    if a.isdigit() or b.isdigit():
        return a.isdigit() and b.isdigit() and int(a) == int(b)
    if Path(a).resolve() == Path(b).resolve():
        return True
    try:
        return os.path.samefile(a, b) or _same_bytes(a, b)
    except OSError:
        return False


def _same_bytes(a: str, b: str) -> bool:
    """Two files of the same size and the same bytes: a copy of one recording is still one recording."""
    import filecmp

    return os.path.getsize(a) == os.path.getsize(b) and filecmp.cmp(a, b, shallow=False)
