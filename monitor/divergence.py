"""What a depth sweep's curve says, in one sentence: how the candidate's median ms/token moves with depth (against
the reference's), and which resource depth consumes (`divergence`).

Pure: the sweep's points (plain dicts) in, a sentence out.
"""

from __future__ import annotations

import math

from decodemon.monitor.ceilings import BANDWIDTH_RULED_OUT_RATIO, bandwidth_floor_ms
from decodemon.monitor.numbers import bandwidth_short

FLAT_GROWTH = 1.15  # median ms/token growing less than this from the shallowest to the deepest depth: the ends agree
NOT_MONOTONIC = 1.05  # a depth between the ends this far past both: the curve does not follow its ends
NOISY_SPREAD = 1.3  # ...unless the depths between spread this much: then the curve is noise, not flat
# ...else the rise is set against what the extra bytes per token cost at the device's bandwidth: under
# MARGINAL_FLAT of that cost (or with the bytes level) the curve reads as flat, up to MARGINAL_ABOUT times it as
# bandwidth spent at the margin, and past that as bandwidth and time besides
MARGINAL_FLAT = 0.5
MARGINAL_ABOUT = 1.5
WEIGHTS_KV = "weights + KV"  # a point's bytes_source: the model's weights plus its KV cache at the depth
DRAM_READ_WRITE = "DRAM read + write"  # ...or the DRAM counters' bytes over the tokens counted


def by_depth(p: dict) -> dict:
    """A point as depth reads it: its bytes the model's weights + KV at the swept depth where the engine gave its
    facts (bytes_per_token_model), with the floor they set (bandwidth_x_model_floor), as what depth adds is KV; a
    point without them, or a sweep.json written before them, keeps the bytes its verdict priced."""
    if not p.get("bytes_per_token_model"):
        return p
    return {**p, "bytes_per_token": p["bytes_per_token_model"], "bytes_source": WEIGHTS_KV,
            "bandwidth_x_floor": p.get("bandwidth_x_model_floor")}


def divergence(points: list[dict]) -> str:
    """One sentence: how the candidate's median ms/token moves with depth (against the reference's, if any), and
    which resource depth consumes: bytes per token toward the bandwidth floor → BANDWIDTH; small grids (one block
    per head) taking the time → OCCUPANCY. Where the ends are within FLAT_GROWTH, the rise is set against what the
    extra bytes per token cost at the device's bandwidth: a rise near that cost is bandwidth spent at the margin,
    one well under it (or with the bytes level) is a flat curve."""
    ok = [by_depth(p) for p in points if p.get("ms_per_token")]
    cand = sorted((p for p in ok if p["command"] == "candidate"), key=lambda p: p["depth"])
    ref = {p["depth"]: p for p in ok if p["command"] == "reference"}
    if len(cand) < 2:
        return "Too few depths were measured to read a divergence (at least two are needed)."
    a, b = cand[0], cand[-1]
    growth = b["ms_per_token"] / a["ms_per_token"]
    both = [d for d in (a["depth"], b["depth"]) if d in ref]
    if len(both) == 2:
        g0 = a["ms_per_token"] / ref[a["depth"]]["ms_per_token"]
        g1 = b["ms_per_token"] / ref[b["depth"]]["ms_per_token"]
        head = (f"The candidate goes from {g0:.2g}× the reference's median ms/token at depth {a['depth']:,} to "
                f"{g1:.2g}× at {b['depth']:,}")
        level = g1 / g0 < FLAT_GROWTH and growth < FLAT_GROWTH
    else:
        head = (f"Median ms/token goes from {a['ms_per_token']:.4g} at depth {a['depth']:,} to "
                f"{b['ms_per_token']:.4g} at {b['depth']:,}")
        level = growth < FLAT_GROWTH
    ms = [p["ms_per_token"] for p in cand]
    if level and max(ms) / min(ms) >= NOISY_SPREAD:  # the ends agree, the depths between do not: no curve to read
        lo, hi = min(ms), max(ms)
        return (f"{head}, but between them it ranges {lo:.4g} to {hi:.4g} ({hi / lo:.2g}×) with no trend in depth: "
                "the curve is inside its own noise, not flat; attach longer at each depth before reading it.")
    if level:
        return f"{head}: {_margin(a, b)}."
    # against a reference the head reads ratios; the caution reads the candidate's own ms, so it is for a lone curve
    return f"{head}{'' if len(both) == 2 else _not_monotonic(cand)}: {_resource(a, b)}."


def _not_monotonic(cand: list[dict]) -> str:
    """Where a depth between the ends reads past them (by more than NOT_MONOTONIC), in words: the reading rests on
    the two ends, and the curve between them does not follow it ("" where it does)."""
    a, b = cand[0], cand[-1]
    lo, hi = sorted((a["ms_per_token"], b["ms_per_token"]))
    out = [p for p in cand[1:-1] if not lo / NOT_MONOTONIC <= p["ms_per_token"] <= hi * NOT_MONOTONIC]
    if not out:
        return ""
    p = max(out, key=lambda p: abs(math.log(p["ms_per_token"] / (hi if p["ms_per_token"] > hi else lo))))
    where = "above" if p["ms_per_token"] > hi else "below"
    return (f", but not monotonically: {p['ms_per_token']:.4g} at depth {p['depth']:,} is {where} both ends, so what "
            "follows reads the two ends alone and the depths between do not bear it out (attach longer at each depth)")


def _at_deepest(verdict: str) -> str:
    """The deepest point's verdict as a clause: an unknown one binds nothing."""
    if verdict == "unknown":
        return "no ceiling is measured to bind at the deepest depth (UNKNOWN)"
    return f"{verdict.upper()} binds at the deepest depth"


def _bytes_words(a: dict, b: dict) -> str:
    """The two points' bytes per token named by what they are (the weights with the KV cache, or the DRAM
    counters' bytes), each depth's where the two differ."""
    sa, sb = a.get("bytes_source"), b.get("bytes_source")
    if sa == sb:
        return f"bytes per token ({sa})" if sa else "bytes per token"
    return (f"bytes per token ({sa or 'source not recorded'} at depth {a['depth']:,}, "
            f"{sb or 'source not recorded'} at {b['depth']:,})")


def _flat(deep: str) -> str:
    """The clause for a curve that depth does not move."""
    return (f"flat, so depth consumes nothing that binds here; {_at_deepest(deep)} "
            "(a flat curve is a claim: it holds up to the deepest depth swept)")


def _extra_bytes_words(a: dict, b: dict, extra: float) -> str:
    """'the extra 0.93 GB of KV per token': the bytes the deeper point adds, named by what they are."""
    sa, sb = a.get("bytes_source"), b.get("bytes_source")
    what = {WEIGHTS_KV: " of KV", DRAM_READ_WRITE: " of DRAM read + write"}.get(sa, "") if sa == sb else ""
    return f"the extra {extra / 1e9:.2g} GB{what} per token"


def _missing_at(a: dict, b: dict, va, vb) -> str:
    """' at either depth', or ' at depth N' for the one of the two points whose figure is missing."""
    return " at either depth" if not (va or vb) else f" at depth {(b if va else a)['depth']:,}"


def _margin(a: dict, b: dict) -> str:
    """For ends within FLAT_GROWTH: the rise in median ms/token against what the extra bytes per token cost at the
    device's bandwidth (the rise in the bandwidth floor), and whether that makes the curve flat."""
    deep = b["verdict"]
    rise = b["ms_per_token"] - a["ms_per_token"]
    moved = f"the {'rise' if rise >= 0 else 'fall'} of {abs(rise):.2g} ms"
    bpa, bpb = a.get("bytes_per_token"), b.get("bytes_per_token")
    if not (bpa and bpb):
        return (f"{moved} cannot be set against what depth adds to the bytes per token: they are not known"
                f"{_missing_at(a, b, bpa, bpb)}, so whether depth consumes bandwidth here is not measured; "
                f"{_at_deepest(deep)}")
    if bpb <= bpa * 1.01:
        return (f"{_bytes_words(a, b)} do not grow ({bpa / 1e6:.4g} → {bpb / 1e6:.4g} MB), so {moved} is not "
                "bandwidth: " + _flat(deep))
    extra = _extra_bytes_words(a, b, bpb - bpa)
    bwa, bwb = a.get("bandwidth_gbs"), b.get("bandwidth_gbs")
    if not (bwa and bwb):
        return (f"{moved} cannot be set against what {extra} costs: the device's bandwidth is not known"
                f"{_missing_at(a, b, bwa, bwb)}, so whether depth consumes bandwidth here is not measured; "
                f"{_at_deepest(deep)}")
    cost = bandwidth_floor_ms(bpb, bwb) - bandwidth_floor_ms(bpa, bwa)
    whose = f"; bandwidth: {bandwidth_short(b['bandwidth_source'])}" if b.get("bandwidth_source") else ""
    bw = (f"{bwb:.4g} GB/s" if abs(bwb - bwa) <= 0.005 * bwa else
          f"{bwa:.4g} GB/s at depth {a['depth']:,} and {bwb:.4g} GB/s at {b['depth']:,}")
    if cost <= 0 or rise < MARGINAL_FLAT * cost:
        return (f"{moved} is under {MARGINAL_FLAT:.0%} of what {extra} costs at {bw} "
                f"({max(cost, 0.0):.2g} ms{whose}), so the bytes hide behind what binds: " + _flat(deep))
    if rise <= MARGINAL_ABOUT * cost:
        priced = (f"{moved} is about what {extra} costs at {bw} ({cost:.2g} ms{whose}), so each extra position "
                  "costs bandwidth")
    else:
        priced = (f"{moved} is {rise / cost:.2g}× what {extra} costs at {bw} ({cost:.2g} ms{whose}), so each extra "
                  "position costs bandwidth and time besides")
    if deep == "unknown":
        return f"{priced}, though no ceiling is measured to bind the step at the deepest depth (UNKNOWN)"
    if deep == "bandwidth":
        return f"{priced}, and BANDWIDTH binds the step at {b['depth']:,}"
    return f"{priced}, though {deep.upper()} binds the step at {b['depth']:,}"


def _us_per_kernel(p: dict) -> float | None:
    """The GPU's idle a kernel at one depth (µs): the point's own, or its LAUNCH value where a sweep written before
    LAUNCH's number became the idle's share held it in µs."""
    if p.get("us_per_kernel") is not None:
        return p["us_per_kernel"]
    return p.get("ceiling_value") if "µs" in (p.get("ceiling_unit") or "") else None


def _resource(a: dict, b: dict) -> str:
    """What depth consumes, from the deepest point's verdict and how bytes, the floor and grids moved."""
    deep = b["verdict"]
    bpa, bpb = a.get("bytes_per_token"), b.get("bytes_per_token")
    kv = (f"{_bytes_words(a, b)} grow {bpb / bpa:.3g}× ({bpa / 1e6:.4g} → {bpb / 1e6:.4g} MB)"
          if bpa and bpb and bpb > bpa * 1.01 else "")
    xa, xb = a.get("bandwidth_x_floor"), b.get("bandwidth_x_floor")
    toward_floor = xa is not None and xb is not None and xb < xa
    near_floor = xb is not None and xb < BANDWIDTH_RULED_OUT_RATIO
    if deep == "bandwidth" or (kv and toward_floor and near_floor and deep != "occupancy"):
        return (f"depth consumes memory bandwidth: {kv or 'the bytes read per token grow'}, and the token nears the "
                f"bandwidth floor those bytes set ({xb:.3g}× it at the deepest depth)" if xb is not None else
                f"depth consumes memory bandwidth: {kv or 'the bytes read per token grow'} (BANDWIDTH)")
    if deep == "unknown":
        growth = b["ms_per_token"] / a["ms_per_token"]
        tracks = bpa and bpb and kv and abs(math.log(growth / (bpb / bpa))) < math.log(1.25)
        return (f"ms/token grows {growth:.3g}× while {kv or 'the bytes per token stay level'}, but "
                f"{_at_deepest(deep)}, so what depth consumes is not measured"
                + ("; the time tracking the bytes points at memory bandwidth, which a traced window or the PM "
                   "counters would confirm or rule out" if tracks else
                   "; a traced window or the PM counters would say which ceiling it is"))
    if deep == "occupancy":
        share = b.get("small_grid_share_pct")
        return ("depth consumes occupancy: the added time runs in grids that leave most SMs idle"
                + (f" ({share:.0f}% of kernel time in grids under a quarter of the SMs)" if share is not None else "")
                + ", the shape of a kernel with one block per head; split it over the context (OCCUPANCY)")
    ua, ub = _us_per_kernel(a), _us_per_kernel(b)
    if deep == "launch" and a.get("verdict") == "launch" and ua and ub and ub > ua:
        return (f"depth consumes host time: LAUNCH binds at both ends and the GPU waits longer for each launch "
                f"({ua:.3g} → {ub:.3g} µs), while {kv or 'the bytes per token stay level'}"
                + (f" at {xb:.3g}× the bandwidth floor those bytes set" if xb is not None else ""))
    return (f"{_at_deepest(deep)} while {kv or 'the bytes per token stay level'}; what depth adds has not yet "
            "overtaken it")
