"""One mode's result from its engine sessions: the pairs judged raw and at one core speed, every token of each
kind pooled, the token log's diagnostics, and decodemon's accuracy against torch.profiler."""

from __future__ import annotations

import statistics

import numpy as np

from .judge import (after_start_phases, c_canary_view, core_speed, pair_stats, pct, phase_labels, phase_rows,
                    pool_pm_checks, speed_regimes)
from .machine import host_summary, vm_summary
from .tokens import gc_profile, quiet_overhead, switch_profile, time_profile

OBSERVED = ("D", "Ddense", "S")  # labels judged as pairs in the decodemon engine


def session_rows(sess: dict) -> list[dict]:
    """Per phase of an engine session: its tokens' median, p99, mean and count, the machine's counters, and its
    span (unix s), so the token log can be re-read by phase."""
    per = phase_rows(sess["phases"], sess["ends"], sess["ms"])
    for row, (_, t0, t1), host in zip(per, sess["phases"], sess["hosts"]):
        xs = row["ms"]
        row.update(tokens=len(xs), mean_ms=statistics.fmean(xs) if xs else None, **host,
                   t0_unix_s=round(t0, 3), t1_unix_s=round(t1, 3))
    return per


def _times(sess: dict) -> tuple[list[dict], dict]:
    phases = [{"phase": lab, "t0_unix_s": t0, "t1_unix_s": t1} for lab, t0, t1 in sess["phases"]]
    return phases, sess["times"]


def iteration_clock(sess: dict) -> dict | None:
    """The same pairs on the engine's other clock, stamped after the token clock's hook (which then counts in the
    token just emitted, not the one the user waits for next)."""
    ms_iter = sess["times"].get("ms_iter")
    if not ms_iter:
        return None
    per = phase_rows(sess["phases"], sess["ends"], ms_iter)
    u = [m for p in per[1:] if p["phase"] == "U" for m in p["ms"]]
    dl = [m for p in per if p["phase"] == "Dlong" for m in p["ms"]]
    st = pair_stats(per, "D")
    return {"p99_ratio_median": st["p99_ratio_median"],
            "p99_ratio_median_after_first": st["p99_ratio_median_after_first"],
            "overhead_pct_median": st["overhead_pct_median"],
            "long_p99_ratio": pct(dl, 99) / pct(u, 99) if dl and u else None}


def _canaries(sess: dict, cs: dict, where: list) -> dict:
    """The canaries' medians and the share of tokens on a slow core, unobserved (U) against default attaches (D)."""
    t, out = sess["times"], {}
    for kind in ("U", "D"):
        sel = [i for i, w in enumerate(where) if w == kind]
        cc = t.get("canary_c_us")
        out[kind] = {"median_us": round(float(np.median([t["canary_us"][i] for i in sel])), 2) if sel else None,
                     "c_median_us": round(float(np.median([cc[i] for i in sel])), 3)
                     if sel and cc and len(cc) == len(sess["ms"]) else None,
                     "slow_core_share": round(sum(cs["slow"][i] for i in sel) / len(sel), 3) if sel else None}
    out["ref_us"] = round(cs["ref_us"], 2)
    return out


def core_views(a: dict, b: dict | None) -> dict | None:
    """The pairs at one core speed by the Python canary (core_speed), eager only: a graphed loop waits on the GPU,
    so its core's speed is not its own."""
    rows = {}
    for name, sess in (("a", a), ("b", b)):
        if sess is None:
            continue
        where = phase_labels(sess["phases"], sess["ends"])
        cs = core_speed(sess["ms"], sess["times"].get("canary_us"), [w == "U" for w in where])
        if cs is not None:
            rows[name] = (phase_rows(sess["phases"], sess["ends"], cs["ms"]), cs, where)
    if "a" not in rows:
        return None
    per, cs, where = rows["a"]
    out = {label: pair_stats(per, label) for label in OBSERVED}
    if "b" in rows:
        out["P"] = pair_stats(rows["b"][0], "P")
    cu = [m for p in per[1:] if p["phase"] == "U" for m in p["ms"]]
    cl = [m for p in per if p["phase"] == "Dlong" for m in p["ms"]]
    out["long_p99_ratio"] = pct(cl, 99) / pct(cu, 99) if cl and cu else None
    out["D_after_start"] = pair_stats(phase_rows(after_start_phases(a["phases"]), a["ends"], cs["ms"]), "D")
    out["canary"] = _canaries(a, cs, where)
    return out


def pooled(per: list[dict], long_s: float) -> dict:
    """Every token of each kind in the decodemon engine. The first U phase (before any attach) is shown apart:
    a process's first attach can change the loop's speed for good (a graphed loop ran faster after its first PM
    session). The later short attaches are pooled apart from the first, which carries one-off costs."""
    uall = [m for p in per[1:] if p["phase"] == "U" for m in p["ms"]]
    dall = [m for p in per if p["phase"] == "D" for m in p["ms"]]
    dlong = [m for p in per if p["phase"] == "Dlong" for m in p["ms"]]
    dlater = [m for p in [p for p in per if p["phase"] == "D"][1:] for m in p["ms"]]

    def kind(xs):
        return {"median_ms": statistics.median(xs) if xs else None, "p99_ms": pct(xs, 99), "tokens": len(xs)}

    return {"Dlong": {**kind(dlong), "seconds": long_s,
                      "slow_tokens_over_1.1x_u_p99": sum(m > 1.1 * pct(uall, 99) for m in dlong)},
            "U_first": {k: per[0][k] for k in ("median_ms", "p99_ms", "tokens")},
            "U_all": kind(uall), "D_all": kind(dall), "D_later": kind(dlater)}


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def accuracy(a: dict, b: dict | None, phase_s: float) -> dict:
    """decodemon's launches and kernel time per token (default attaches) against torch.profiler's kernels, and
    PM's GPU busy against the traced kernels' union over the same samples."""
    profs = b["profs"] if b else []
    ok = [x for lab, x in a["attach"] if lab == "D" and "error" not in x and x.get("kernels_per_token")]
    last = ok[-1].get("probe") or {} if ok else {}
    return {
        "profiler_kernels_per_token": _median([p["kernels_per_token"] for p in profs]),
        "profiler_kernel_ms_per_token": _median([p["kernel_ms_per_token"] for p in profs]),
        "decodemon_kernels_per_token": _median([x["kernels_per_token"] for x in ok]),
        "decodemon_kernel_ms_per_token": _median([x.get("kernel_sum_ms_per_token") for x in ok]),
        "pm_gpu_busy_pct": _median([x.get("pm_gpu_busy_pct") for x in ok]),
        "traced_gpu_busy_pct": _median([x.get("traced_gpu_busy_pct") for x in ok]),
        # the traced kernels' busy time per token over the untraced tokens' ms/token: what PM sees, from the window
        "kernel_share_of_step_pct": _median([x.get("kernel_share_of_step_pct") for x in ok]),
        "pm_vs_window": pool_pm_checks([x.get("pm_vs_window") for lab, x in a["attach"]
                                        if lab in ("D", "Dlong") and "error" not in x]),
        "pm_state": last.get("pm"),
        "pm_cpu": last.get("pm_cpu"),
        "windows_per_attach": [x.get("windows") for x in ok],
        "seconds_per_attach": phase_s,
    }


def summarize(mode: str, a: dict, b: dict | None, phase_s: float, long_s: float) -> dict:
    """One mode's result: `a` the decodemon engine's session, `b` torch.profiler's (None when not run)."""
    per_a = session_rows(a)
    per_b = session_rows(b) if b else []
    out = {"mode": mode, "attach": [{**x, "label": lab} for lab, x in a["attach"]],
           "phases": [{k: v for k, v in p.items() if k != "ms"} for p in per_a + per_b],
           "iteration_clock": iteration_clock(a)}
    for label in OBSERVED:
        out[label] = pair_stats(per_a, label)
    out["P"] = pair_stats(per_b, "P")
    out["D_after_start"] = pair_stats(phase_rows(after_start_phases(a["phases"]), a["ends"], a["ms"]), "D")
    phases, times = _times(a)
    out["start_profile"] = time_profile([(phases, times)], max_phase_s=max(8.0, 1.5 * phase_s))
    out["switches"] = switch_profile(phases, times)
    out["quiet"] = quiet_overhead(phases, times, "D")
    out["gc"] = gc_profile(phases, times)
    if mode == "eager":
        out["core_c"] = c_canary_view(phases, times)
        core = core_views(a, b)
        if core:
            out["core"] = core
    out.update(pooled(per_a, long_s))
    out["host"] = host_summary(per_a)
    out["vm"] = vm_summary(per_a)
    out["speeds"] = speed_regimes(per_a)
    out["accuracy"] = accuracy(a, b, phase_s)
    out["attach_errors"] = [f"{lab}: {x['error']}" for lab, x in a["attach"] if "error" in x]
    return out
