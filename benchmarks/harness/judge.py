"""Judging observed phases against unobserved ones: pairs, noise floors, one core speed.

A run is a list of phases in the order they ran, each {"phase", "median_ms", "p99_ms"} (and "mean_ms"), built
from the engine's own token log by phase_rows(). An observed phase is judged against the unobserved (U) phases
on both sides of it, so a drift of the loop's own speed across the pair cancels:

    U ──── D ──── U ──── D ──── U
    └── ref ──┘ ratio = D / mean(U before, U after)

The noise floor is the same arithmetic done on a U phase between two others; an overhead inside it is not
resolved by the run.
"""

from __future__ import annotations

import statistics

import numpy as np

PHASE_SKIP_S = 0.05  # a phase's tokens: those that ended inside it, less its first 50 ms (the switch itself)
# An attach's start-up (a process starting, imports, PM's arm) slows an eager token most in its first ~1.5 s;
# an attach left on all day pays it once, so the pairs are also judged with each attach's first START_S left out.
START_S = 1.5
CANARY_WINDOW = 15  # tokens: a slow core lasts a second and more (40+ eager tokens)
CANARY_SLOW = 1.25  # a smoothed canary over 1.25x its unobserved 25th percentile: a token on a slow core


def pct(xs, q):
    """The q-th percentile of xs by rank (NaN for none)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def phase_of(e: float, t0: float, t1: float) -> bool:
    """Whether a token that ended at `e` counts in the phase (t0, t1)."""
    return t0 + PHASE_SKIP_S <= e <= t1


def phase_rows(phases: list[tuple], ends: list[float], values: list[float]) -> list[dict]:
    """Per phase (label, t0, t1): its tokens' values with their median and p99, as pair_stats reads them."""
    rows = []
    for label, t0, t1 in phases:
        xs = [v for e, v in zip(ends, values) if phase_of(e, t0, t1)]
        rows.append({"phase": label, "median_ms": statistics.median(xs) if xs else None,
                     "p99_ms": pct(xs, 99) if xs else None, "ms": xs})
    return rows


def _ratio(p: dict, refs: list[dict], key: str) -> float | None:
    if not p.get(key) or not all(q.get(key) for q in refs):
        return None
    return p[key] / statistics.mean(q[key] for q in refs)


def _bracketed(per: list[dict], label: str, key: str) -> list[float]:
    """Each U phase between two U's (one `label` phase apart on each side) against their mean: the noise floor
    of the estimator itself, without the drift across a pair that the bracketing cancels."""
    out = []
    for i in range(2, len(per) - 2):
        if per[i]["phase"] == "U" and per[i - 1]["phase"] == per[i + 1]["phase"] == label \
                and per[i - 2]["phase"] == per[i + 2]["phase"] == "U":
            r = _ratio(per[i], [per[i - 2], per[i + 2]], key)
            if r is not None:
                out.append(r)
    return out


def _pct(x: float) -> float:
    return 100 * (x - 1)


def _floor(xs: list[float]) -> float | None:
    return 100 * statistics.median(abs(x - 1) for x in xs) if xs else None


def pair_stats(per: list[dict], label: str) -> dict:
    """Overhead of the `label` phases against the U phases on both sides of each (the one before alone at the end
    of a plan), and the noise floors. `per`: phases in order, each {"phase", "median_ms", "p99_ms"[, "mean_ms"]}.

    The process's first attach carries one-off costs (imports, CUPTI's and PM's first start), so the pairs after
    it are also given apart. `noise_floor_pct` is the U phase after each pair against the one before;
    `noise_floor_bracketed_pct` is what an observed phase's arithmetic gives on an unobserved one."""
    ratios, p99r, means, null = [], [], [], []
    for i, p in enumerate(per):
        if p["phase"] != label or i == 0 or per[i - 1]["phase"] != "U" or not p["median_ms"]:
            continue
        after = per[i + 1] if i + 1 < len(per) and per[i + 1]["phase"] == "U" and per[i + 1]["median_ms"] else None
        refs = [per[i - 1]] + ([after] if after else [])
        if _ratio(p, refs, "median_ms") is None:
            continue
        ratios.append(_ratio(p, refs, "median_ms"))
        for out, key in ((p99r, "p99_ms"), (means, "mean_ms")):
            if _ratio(p, refs, key) is not None:
                out.append(_ratio(p, refs, key))
        if after:
            null.append(after["median_ms"] / per[i - 1]["median_ms"])
    bracketed, bracketed_p99 = _bracketed(per, label, "median_ms"), _bracketed(per, label, "p99_ms")
    later = ratios[1:]
    obs = [p["median_ms"] for p in per if p["phase"] == label and p["median_ms"]]
    return {"pairs": len(ratios),
            "overhead_pct_median": _pct(statistics.median(ratios)) if ratios else None,
            "overhead_pct_min": _pct(min(ratios)) if ratios else None,
            "overhead_pct_max": _pct(max(ratios)) if ratios else None,
            "overhead_pct_median_after_first": _pct(statistics.median(later)) if later else None,
            "overhead_pcts": [round(_pct(x), 3) for x in ratios],
            "p99_ratio_median": statistics.median(p99r) if p99r else None,
            "p99_ratio_median_after_first": statistics.median(p99r[1:]) if len(p99r) > 1 else None,
            "p99_ratios": [round(x, 3) for x in p99r],
            # the mean token carries the windows' slow tokens the median leaves out: compare it with the
            # monitor's own live bill (observer_cost)
            "overhead_mean_pct_median": _pct(statistics.median(means)) if means else None,
            "noise_floor_pct": _floor(null),
            "noise_floor_bracketed_pct": _floor(bracketed),
            "bracketed_null_pct": [round(_pct(x), 2) for x in bracketed],
            "p99_noise_floor_bracketed_pct": _floor(bracketed_p99),
            "median_ms": statistics.median(obs) if obs else None}


def after_start_phases(phases: list[tuple]) -> list[tuple]:
    """(label, t0, t1) phases with each default attach (D) starting START_S later, its start-up left out
    (PHASE_SKIP_S is already inside START_S)."""
    return [(lab, t0 + START_S - PHASE_SKIP_S if lab == "D" else t0, t1) for lab, t0, t1 in phases]


def phase_labels(spans: list[tuple], ends: list[float]) -> list[str | None]:
    """Per token, the label of the (label, t0, t1) span it ended in, or None."""
    return [next((lab for lab, t0, t1 in spans if phase_of(e, t0, t1)), None) for e in ends]


def core_speed(ms: list[float], canary_us: list[float] | None, is_u: list[bool]) -> dict | None:
    """Token times at one core speed, or None without a canary or an unobserved token.

    An eager loop is bound by its host thread, and a VM's core can run ~1.6x slower for seconds at a time,
    attached or not. The engine times a fixed canary on the decode thread every token; each token's ms is scaled
    by ref / (the canary's rolling median over CANARY_WINDOW tokens), ref being that median over the unobserved
    tokens. Work decodemon adds on the decode thread is not in the canary, so it stays in the scaled time; a
    slower core under decodemon would be scaled away, which is why the canaries are reported beside it.
    Returns {"ms": scaled, "ref_us", "slow": per token, on a slow core}."""
    if not canary_us or len(canary_us) != len(ms) or not any(is_u):
        return None
    c = np.asarray(canary_us, dtype=float)
    h = CANARY_WINDOW // 2
    pad = np.pad(c, (h, h), mode="edge")
    smooth = np.median(np.lib.stride_tricks.sliding_window_view(pad, CANARY_WINDOW), axis=1)
    u = np.asarray(is_u, dtype=bool)
    ref = float(np.median(smooth[u]))
    fast = float(np.percentile(smooth[u], 25))  # the core's usual speed, even where unobserved phases ran slow
    return {"ms": list(np.asarray(ms, dtype=float) * ref / smooth), "ref_us": ref,
            "slow": list(smooth > CANARY_SLOW * fast)}


def at_one_core_speed(phases: list[dict], times: dict, canary: str = "canary_us") -> list[float]:
    """A token log's times scaled to one core speed by its `canary` column (the unobserved tokens as the
    reference), or the raw ones where the log has no such canary."""
    ends, ms = times["end_unix_s"], times["ms"]
    u = [(p["t0_unix_s"], p["t1_unix_s"]) for p in phases if p["phase"] == "U"]
    cs = core_speed(ms, times.get(canary), [any(phase_of(e, t0, t1) for t0, t1 in u) for e in ends])
    return cs["ms"] if cs is not None else ms


def c_canary_view(phases: list[dict], times: dict, label: str = "D") -> dict:
    """The `label` attaches at one core speed by the C canary (`canary_c_us`: zlib.crc32 of 4 KB, 16 times, no
    bytecode). The Python canary runs through the interpreter, which an attached process can run faster or
    slower for reasons of its own; the C one times the core alone. {} without the C canary."""
    cc, ends, ms = times.get("canary_c_us"), times["end_unix_s"], times["ms"]
    spans = [(p["phase"], p["t0_unix_s"], p["t1_unix_s"]) for p in phases]
    if not cc or len(cc) != len(ms) or "U" not in phase_labels(spans, ends):
        return {}
    scaled = at_one_core_speed(phases, times, "canary_c_us")
    per = phase_rows(spans, ends, scaled)
    st = pair_stats(per, label)
    u = [m for p in per[1:] if p["phase"] == "U" for m in p["ms"]]
    first = next((i for i, p in enumerate(per) if p["phase"] != "U"), len(per))
    later = [m for i, p in enumerate(per) if p["phase"] == label and i > first for m in p["ms"]]
    lng = [m for p in per if p["phase"] == "Dlong" for m in p["ms"]]
    after = pair_stats(phase_rows(after_start_phases(spans), ends, scaled), "D") if label == "D" else {}
    return {label: {k: st.get(k) for k in ("pairs", "overhead_pct_median", "overhead_pct_median_after_first",
                                         "noise_floor_bracketed_pct", "p99_ratio_median",
                                         "p99_ratio_median_after_first", "overhead_mean_pct_median")},
            "D_after_start_pct": after.get("overhead_pct_median"),
            "pooled_p99_ratio": pct(later, 99) / pct(u, 99) if later and u else None,
            "long_p99_ratio": pct(lng, 99) / pct(u, 99) if lng and u else None}


def speed_regimes(per: list[dict], factor: float = 1.25) -> dict:
    """Did the loop run at more than one speed? Phases (unobserved and decodemon's) whose median is over `factor`
    times the fastest unobserved phase's; a pair across two speeds resolves nothing.

    `one_speed_pairs_pct`: the pairs whose three phases (U, D, U) all ran at the fast speed. That conditions on
    the D phase being fast, so it cannot see decodemon causing a slow stretch: read it beside the counts."""
    u = [p["median_ms"] for p in per if p["phase"] == "U" and p.get("median_ms")]
    d = [p["median_ms"] for p in per if p["phase"] in ("D", "Ddense", "Dlong") and p.get("median_ms")]
    if not u:
        return {}
    thr = factor * min(u)
    one = []
    for i in range(1, len(per) - 1):
        tri = (per[i - 1], per[i], per[i + 1])
        if per[i]["phase"] == "D" and tri[0]["phase"] == tri[2]["phase"] == "U" \
                and all(q.get("median_ms") and q["median_ms"] <= thr for q in tri):
            one.append(100.0 * (per[i]["median_ms"] / ((tri[0]["median_ms"] + tri[2]["median_ms"]) / 2) - 1))
    return {"threshold_ms": round(thr, 3), "u_slow": [sum(m > thr for m in u), len(u)],
            "observed_slow": [sum(m > thr for m in d), len(d)],
            "one_speed_pairs_pct": [round(x, 2) for x in one],
            "one_speed_overhead_pct_median": round(statistics.median(one), 2) if one else None}


def pool_pm_checks(checks: list) -> dict | None:
    """Attaches' `pm_vs_window` figures (PM's GPU busy against the traced kernels' union over the same samples)
    pooled, each weighted by its samples; the largest attach-level gap beside."""
    cs = [c for c in checks if c and c.get("samples")]
    n = sum(c["samples"] for c in cs)
    if not n:
        return None
    pm = sum(c["pm_gpu_busy_pct"] * c["samples"] for c in cs) / n
    tr = sum(window_busy(c) * c["samples"] for c in cs) / n
    return {"samples": n, "attaches": len(cs), "pm_gpu_busy_pct": round(pm, 2), "window_gpu_busy_pct": round(tr, 2),
            "max_attach_gap_points": round(max(abs(c["pm_gpu_busy_pct"] - window_busy(c)) for c in cs), 1)}


def window_busy(check: dict) -> float | None:
    """A pm_vs_window's traced kernels' busy over its samples (`traced_gpu_busy_pct` in older results)."""
    return check.get("window_gpu_busy_pct", check.get("traced_gpu_busy_pct"))
