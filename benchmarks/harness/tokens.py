"""What the engine's token log says beyond ms/token: where in an attach the tokens were slow, the decode thread's
waits (voluntary context switches) and the garbage collector's time.

The demo engine's `--times-file --cpu-clocks` log has, per token: `end_unix_s`, `ms`, `nvcsw` (the decode thread's
voluntary switches), `gc_ms`/`gc_n` (collections on the decode thread) and `gc_other_ms` (on other threads), and
the canaries. Phases are {"phase", "t0_unix_s", "t1_unix_s"}.
"""

from __future__ import annotations

import statistics

from .judge import at_one_core_speed, pair_stats, phase_of, phase_rows

GC_KEYS = ("gc_ms", "gc_n", "gc_other_ms")


def token_groups(phases: list[dict], ends: list[float], labels) -> dict[str, list[list[int]]]:
    """{label: one list of token indices per phase} for the phases of `labels` after the process's first attach
    that hold any of the tokens ending at `ends`."""
    first = next((i for i, p in enumerate(phases) if p["phase"] != "U"), len(phases))
    per: dict[str, list] = {}
    for i, p in enumerate(phases):
        if p["phase"] not in labels or i <= first:
            continue
        idx = [k for k, e in enumerate(ends) if phase_of(e, p["t0_unix_s"], p["t1_unix_s"])]
        if idx:
            per.setdefault(p["phase"], []).append(idx)
    return per


def _neighbour_ref(phases: list[dict], i: int, ends: list[float], vals: list[float]) -> float | None:
    """The mean of the median tokens of the U phases on both sides of phase i."""
    nb = [q for q in (phases[i - 1], phases[i + 1] if i + 1 < len(phases) else None) if q and q["phase"] == "U"]
    refs = [[vals[k] for k, e in enumerate(ends) if phase_of(e, q["t0_unix_s"], q["t1_unix_s"])] for q in nb]
    refs = [statistics.median(r) for r in refs if r]
    return statistics.mean(refs) if refs else None


def time_profile(runs: list[tuple[list[dict], dict]], label: str = "D", bin_s: float = 0.5,
                 max_phase_s: float = 8.0) -> dict:
    """Where in an attach the tokens are slow: every token of each `label` attach after its process's first (of
    at most `max_phase_s`, so not the long one) over the mean of the median tokens of the U phases on both sides,
    binned by its end's time since the attach started, pooled over `runs`. Per bin: tokens and the median ratio,
    raw and at one core speed, as percent."""
    bins: dict[str, dict[int, list[float]]] = {"raw": {}, "core": {}}
    for phases, times in runs:
        ends = times["end_unix_s"]
        views = {"raw": times["ms"], "core": at_one_core_speed(phases, times)}
        first = next(i for i, p in enumerate(phases) if p["phase"] != "U")
        for i, p in enumerate(phases):
            if p["phase"] != label or i <= first or p["t1_unix_s"] - p["t0_unix_s"] > max_phase_s:
                continue
            idx = [k for k, e in enumerate(ends) if phase_of(e, p["t0_unix_s"], p["t1_unix_s"])]
            for view, vals in views.items():
                ref = _neighbour_ref(phases, i, ends, vals)
                if ref is None:
                    continue
                for k in idx:
                    bins[view].setdefault(int((ends[k] - p["t0_unix_s"]) / bin_s), []).append(vals[k] / ref)
    return {"bin_s": bin_s, "label": label,
            "bins": [{"from_s": round(b * bin_s, 3), "tokens": len(bins["raw"][b]),
                      **{f"{v}_pct": round(100 * (statistics.median(bins[v][b]) - 1), 2) for v in ("raw", "core")}}
                     for b in sorted(bins["raw"])]}


def switch_profile(phases: list[dict], times: dict, labels: tuple[str, ...] = ("U", "D", "Dlong")) -> dict:
    """The decode thread's voluntary context switches per label, every phase after the process's first attach:
    switches per second of its tokens (median over the phases), the share of its tokens that had any, and the
    median token without and with them (ms).

    An eager decode thread never blocks on its own (CUDA's sync spins): unobserved it makes none. Attached, each
    switch is a wait, mostly for the GIL the agent thread took back. {} where the log has no `nvcsw`."""
    nv, ends, ms = times.get("nvcsw"), times["end_unix_s"], times["ms"]
    if not nv or len(nv) != len(ms):
        return {}
    out = {}
    for label, groups in token_groups(phases, ends, labels).items():
        idx = [k for g in groups for k in g]
        quiet = [ms[k] for k in idx if nv[k] == 0]
        woken = [ms[k] for k in idx if nv[k] > 0]
        out[label] = {"phases": len(groups),
                      "per_s": round(statistics.median(1e3 * sum(nv[k] for k in g) / sum(ms[k] for k in g)
                                                       for g in groups), 1),
                      "tokens": len(idx), "share_with": round(len(woken) / len(idx), 3),
                      "median_ms_without": round(statistics.median(quiet), 3) if quiet else None,
                      "median_ms_with": round(statistics.median(woken), 3) if woken else None}
    return out


def quiet_overhead(phases: list[dict], times: dict, label: str = "D") -> dict:
    """The median overhead of `label`'s attaches (pair_stats), raw and at one core speed, over all their tokens and
    over only the tokens in which the decode thread made no voluntary switch (the agent thread did not take the
    GIL from it): what is left in the second is what watching costs a token the agent never touched. {} without
    `nvcsw`."""
    nv, ends = times.get("nvcsw"), times["end_unix_s"]
    if not nv or len(nv) != len(ends):
        return {}
    spans = [(p["phase"], p["t0_unix_s"], p["t1_unix_s"]) for p in phases]
    quiet = [k for k, x in enumerate(nv) if x == 0]
    out = {}
    for view, vals in (("raw", times["ms"]), ("core", at_one_core_speed(phases, times))):
        for name, idx in (("all", range(len(ends))), ("quiet", quiet)):
            rows = phase_rows(spans, [ends[k] for k in idx], [float(vals[k]) for k in idx])
            st = pair_stats(rows, label)["overhead_pct_median"]
            out[f"{view}_{name}_pct"] = round(st, 2) if st is not None else None
    return out


def gc_profile(phases: list[dict], times: dict, labels: tuple[str, ...] = ("U", "D", "Dlong")) -> dict:
    """The cyclic garbage collector per label, every phase after the process's first attach: collections and ms
    a second on the decode thread, ms a second on the others, and the share of tokens with a collection on the
    decode thread (medians over the phases). An attached process allocates more objects that live on, so the
    collector may run more often, on whichever thread crosses its threshold. {} without the log's columns."""
    ends, ms = times["end_unix_s"], times["ms"]
    cols = [times.get(k) for k in GC_KEYS]
    if any(not c or len(c) != len(ms) for c in cols):
        return {}
    gms, gn, gother = cols
    per = token_groups(phases, ends, labels)
    out: dict[str, dict] = {}
    for label in (lab for lab in labels if lab in per):
        groups = per[label]
        secs = [sum(ms[k] for k in g) / 1e3 for g in groups]

        def med(col):
            return round(statistics.median(sum(col[k] for k in g) / s for g, s in zip(groups, secs)), 3)

        idx = [k for g in groups for k in g]
        out[label] = {"phases": len(groups), "collections_per_s": med(gn), "ms_per_s": med(gms),
                      "other_threads_ms_per_s": med(gother),
                      "share_with": round(sum(1 for k in idx if gn[k]) / len(idx), 4)}
    return out
