"""The limits on what watching may cost the loop, judged against one run, mode by mode.

    median overhead ≤ 1%            (raw; eager also at one core speed by the C canary)
    p99 ratio per pair ≤ 1.1×
    a traced window at least every 5 s
    PM sampling armed and nothing lost in every default and long attach
    kernels/token equal to torch.profiler's kernels/token
    kernel ms/token within 3% of torch.profiler's
    PM GPU busy within 5 points of the traced kernels' union over the same samples
"""

from __future__ import annotations

from .judge import window_busy

LIMITS = {"median_pct": 1.0, "p99_ratio": 1.1, "window_s": 5.0, "kernel_ms_pct": 3.0, "pm_points": 5.0}


def fmt(x, spec=".3f", unit="", sign=""):
    """A figure for a table with its unit (and a ± before it), 'n/a' for None or NaN."""
    return "n/a" if x is None or x != x else f"{sign}{format(x, spec)}{unit}"


def _ok(x, limit, le=True):
    return "—" if x is None else ("met" if (x <= limit if le else abs(x) <= limit) else "not met")


def labelled_attaches(r: dict, labels=("D", "Ddense", "Dlong")) -> list[tuple[str, dict]]:
    """A mode's attach reports of `labels`, each with its plan label."""
    return [(a["label"], a) for a in r.get("attach", []) if a.get("label") in labels]


def window_gaps(r: dict, label: str = "D") -> list[float]:
    """The `label` attaches' windows: each one's `window_every_s` (the monitor's median gap between windows)."""
    return [a["observer_cost"]["window_every_s"] for lab, a in labelled_attaches(r)
            if lab == label and (a.get("observer_cost") or {}).get("window_every_s")]


def pm_kept(probe: dict) -> bool:
    """PM sampling stayed armed through the attach and lost nothing: never re-armed, no pump that dropped
    samples (a full counter-data image or an overflowed hardware buffer)."""
    pm = str(probe.get("pm", ""))
    return (pm.startswith("armed") and "re-armed" not in pm and not probe.get("pm_restarts")
            and not probe.get("pm_lost") and not probe.get("pm_full_pumps") and not probe.get("pm_overflow_pumps"))


def pm_continuous(r: dict) -> tuple[int, int]:
    """(default and long attaches whose PM sampling was kept whole, all of them)."""
    probes = [a.get("probe") or {} for lab, a in labelled_attaches(r, ("D", "Dlong"))]
    return sum(pm_kept(p) for p in probes), len(probes)


def _accuracy_parts(acc: dict) -> list[str]:
    parts = []
    la, lp = acc.get("decodemon_kernels_per_token"), acc.get("profiler_kernels_per_token")
    if la is not None and lp is not None:
        parts.append(f"launches {la:.1f} vs {lp:.1f} ({'met' if round(la, 1) == round(lp, 1) else 'not met'})")
    km, kp = acc.get("decodemon_kernel_ms_per_token"), acc.get("profiler_kernel_ms_per_token")
    if km and kp:
        dk = 100 * (km / kp - 1)
        parts.append(f"kernel ms {dk:+.1f}% ({_ok(dk, LIMITS['kernel_ms_pct'], le=False)})")
    pv = acc.get("pm_vs_window") or {}
    if pv.get("pm_gpu_busy_pct") is not None and window_busy(pv) is not None:
        dp = pv["pm_gpu_busy_pct"] - window_busy(pv)
        parts.append(f"PM {dp:+.1f} points ({_ok(dp, LIMITS['pm_points'], le=False)})")
    return parts


def limit_lines(results: list[dict]) -> list[str]:
    """Each limit against this run, mode by mode, as met or not met ('—' where the run could not tell)."""
    out = ["", "The limits in this run (median ≤ 1%, p99 ≤ 1.1× per pair, a window at least every 5 s, PM sampling "
           "continuous, launches equal, kernel time within 3%, PM GPU busy within 5 points):"]
    for r in results:
        d = r["D"]
        med, p99 = d.get("overhead_pct_median"), d.get("p99_ratio_median")
        c = (r.get("core_c") or {}).get("D") or {}
        parts = [f"median {fmt(med, '+.2f', '%')} raw ({_ok(med, LIMITS['median_pct'])})"]
        if c:
            parts.append(f"{fmt(c.get('overhead_pct_median'), '+.2f', '%')} by the C canary "
                         f"({_ok(c.get('overhead_pct_median'), LIMITS['median_pct'])})")
        parts.append(f"p99 {fmt(p99)}× raw ({_ok(p99, LIMITS['p99_ratio'])})")
        if c:
            parts.append(f"{fmt(c.get('p99_ratio_median'))}× by the C canary "
                         f"({_ok(c.get('p99_ratio_median'), LIMITS['p99_ratio'])})")
        gaps = window_gaps(r) + window_gaps(r, "Dlong")
        worst = max(gaps) if gaps else None
        parts.append(f"windows every {fmt(worst, '.2f')} s at most ({_ok(worst, LIMITS['window_s'])})")
        pm_ok, pm_all = pm_continuous(r)
        if pm_all:
            parts.append(f"PM sampling armed and nothing lost in {pm_ok} of {pm_all} attaches "
                         f"({'met' if pm_ok == pm_all else 'not met'})")
        parts += _accuracy_parts(r.get("accuracy") or {})
        out.append(f"- {r['mode']}: " + "; ".join(parts) + ".")
    return out
