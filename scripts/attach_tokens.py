"""Find the attaches in an engine's token log, and each attach's slowest tokens, from the log alone.

    python scripts/attach_tokens.py TIMES.json [--labels AB] [--top 4]

TIMES.json is a demo engine's `--times-file` written with `--cpu-clocks` (the benchmark and
scripts/h200_variant_ab.py keep them under OUT/times; the committed ones are in docs/h200/). Per token it holds the
decode thread's CPU ms and the whole process's, so their difference is what the engine's other threads did. While
no monitor is attached those threads are idle (~0.1 ms per token); the agent thread of an attach works every 0.5 s
at least (PM pumps) and in bursts at its start (set-up, PM arm) and end. An attach is a stretch of at least
`--min-s` seconds in which such work is never more than `--gap-s` apart. This recovers the attaches of a run that
did not save its phases' spans (scripts/h200_variant_ab.py before the eleventh session's last commits).

Per attach: its median ms/token and canary µs (the core's speed, see benchmarks/overhead.py core_speed), its tokens
over 1.1x the unobserved p99 (tokens outside every attach, after the first), its `--top` slowest tokens as
(seconds after the attach's first agent work, ms over the attach's median), and `window_ms`: its largest token
`--window-s` (default 0.7-1.0) seconds in, where a default attach's first traced window lands (it is asked for
0.5 s after the attach). Then, per label, `traced_token`: those of the attaches after the first that ran on a fast
core (canary under 1.2x the fastest attach's), sorted, and their median: the figures docs/benchmarks.md quotes
for the twelfth session's A/B runs. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def attach_spans(ends, thread_cpu, process_cpu, busy_ms: float = 1.5, gap_s: float = 0.6,
                 min_s: float = 2.0) -> list[tuple[int, int, int]]:
    """(first token, first token with agent work, last token) of each attach, in token indices."""
    e = np.asarray(ends, dtype=float)
    other = np.asarray(process_cpu, dtype=float) - np.asarray(thread_cpu, dtype=float)
    active = np.zeros(len(e), dtype=bool)
    for h in np.flatnonzero(other > busy_ms):
        active[np.searchsorted(e, e[h] - gap_s):np.searchsorted(e, e[h] + gap_s)] = True
    spans, i = [], 0
    while i < len(e):
        if not active[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(e) and active[j + 1]:
            j += 1
        if e[j] - e[i] >= min_s:
            first = i + int(np.argmax(other[i:j + 1] > busy_ms))
            spans.append((i, first, j))
        i = j + 1
    return spans


def report(times: dict, labels: str = "", top: int = 4, window_s: tuple[float, float] = (0.7, 1.0)) -> dict:
    e, ms = np.asarray(times["end_unix_s"], dtype=float), np.asarray(times["ms"], dtype=float)
    can = np.asarray(times.get("canary_us") or [np.nan] * len(ms), dtype=float)
    spans = attach_spans(e, times["thread_cpu_ms"], times["process_cpu_ms"])
    inside = np.zeros(len(e), dtype=bool)
    for a, _, b in spans:
        inside[a:b + 1] = True
    after_first = np.arange(len(e)) > (spans[0][2] if spans else -1)
    u = ms[~inside & after_first]
    u_p99 = float(np.percentile(u, 99)) if len(u) else float("nan")
    out = {"unobserved": {"tokens": int(len(u)), "median_ms": round(float(np.median(u)), 2) if len(u) else None,
                          "p99_ms": round(u_p99, 2), "line_ms": round(1.1 * u_p99, 2)},
           "attaches": []}
    for k, (a, first, b) in enumerate(spans):
        idx = np.arange(first + 1, b + 1)  # the token that carries the set-up's first work is left out
        med = float(np.median(ms[idx]))
        order = idx[np.argsort(ms[idx])[::-1][:top]]
        t_in = e[idx] - e[first]
        win = idx[(t_in >= window_s[0]) & (t_in <= window_s[1])]
        out["attaches"].append({
            "label": labels[k % len(labels)] if labels else str(k + 1),
            "seconds": round(float(e[b] - e[first]), 2), "median_ms": round(med, 2),
            "canary_us": round(float(np.nanmedian(can[idx])), 1),
            "over_line": int((ms[a:b + 1] > 1.1 * u_p99).sum()),
            "slowest": [[round(float(e[i] - e[first]), 2), round(float(ms[i] - med), 1)] for i in order],
            "window_ms": round(float(ms[win].max() - med), 1) if len(win) else None})
    fastest = min((a["canary_us"] for a in out["attaches"] if np.isfinite(a["canary_us"])), default=np.nan)
    out["traced_token"] = {}
    for a in out["attaches"][1:]:  # the process's first attach (its first PM arm) is left out
        t = out["traced_token"].setdefault(a["label"], {"fast_core_ms": [], "median_ms": None})
        if a["window_ms"] is not None and a["canary_us"] < 1.2 * fastest:
            t["fast_core_ms"].append(a["window_ms"])
    for t in out["traced_token"].values():
        t["fast_core_ms"].sort()
        t["median_ms"] = round(float(np.median(t["fast_core_ms"])), 1) if t["fast_core_ms"] else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("times")
    ap.add_argument("--labels", default="", help="the attaches' labels in turn, e.g. AB")
    ap.add_argument("--top", type=int, default=4)
    ap.add_argument("--window-s", default="0.7-1.0", help="where the first traced window lands, s into an attach")
    a = ap.parse_args()
    try:
        lo, hi = (float(x) for x in a.window_s.split("-"))
    except ValueError:
        print(f"attach_tokens.py: --window-s wants two seconds like 0.7-1.0, got {a.window_s!r}", file=sys.stderr)
        sys.exit(2)
    try:
        times = json.loads(Path(a.times).read_text())
        times["thread_cpu_ms"], times["process_cpu_ms"]  # noqa: B018 - the clocks this needs
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"attach_tokens.py: cannot read {a.times} as a --cpu-clocks times file: {exc}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(report(times, a.labels, a.top, (lo, hi)), indent=1))


if __name__ == "__main__":
    main()
