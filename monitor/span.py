"""What a summary covers: the whole span asked for (a recording, an attach's seconds) or its last seconds.

The live screen shows the rolling figures of the last 5 s (snapshot_builder.SPAN_NS): a loop's state now. A summary
(`attach --json --seconds N`, `replay --json`, `report`, `compare --json`, `record --json`, the API) answers for
what was asked: the whole recording, or the N seconds attached; `--last S` gives the last S seconds instead. Beside
a whole span the rolling 5-s figures ride along (Snapshot.rolling_5s) where the two spans differ, and every summary
says first what it covers: seconds, from-to, the clock's steps and the tokens counted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from decodemon.monitor.sources.errors import CUT_SHORT

if TYPE_CHECKING:
    from decodemon.monitor.session import Session
    from decodemon.monitor.snapshot import Snapshot

# snapshot_builder.SPAN_NS in seconds (not imported: render/json.py imports this module, and the builder's imports
# are heavy; tests/test_span.py holds the two equal)
ROLLING_S = 5.0
# the rolling object's figures: the ones a reader compares with the whole span's (the clock's and the verdict's)
ROLLING_KEYS = ("ms_per_token", "ms_per_token_p90", "ms_per_token_p99", "tokens_per_s", "clock_steps",
                "clock_span_s", "throughput_tokens_per_s", "kernels_per_token", "host_launch_calls_per_token",
                "gpu_busy_pct", "bytes_per_token", "ceiling", "verdict")


def summary_snapshot(sess: Session, last_s: float | None = None) -> Snapshot:
    """The snapshot a summary prints: over the whole feed, with the rolling 5 s beside it where the feed is
    longer; with `last_s`, over its last `last_s` seconds alone."""
    if last_s is not None:
        whole = sess.snapshot(span_ns=None)
        if whole.span_s is not None and last_s >= whole.span_s:  # they hold the whole span: read and said as it,
            # with the rolling 5 s beside it as a whole summary has them
            return dataclasses.replace(summary_snapshot(sess), last_asked_s=last_s)
        last = sess.snapshot(span_ns=int(last_s * 1e9))
        if whole.span_tokens and not last.span_tokens:
            from decodemon.monitor.sources.errors import NothingMeasured

            raise NothingMeasured(f"no token in the last {last_s:g} s of the {whole.span_s:.3g} s: --last takes "
                                  "the seconds the figures cover, and these held none")
        return last
    rolling = sess.snapshot()  # first: the session's own state (its clock, its bytes) ends at the whole span's
    whole = sess.snapshot(span_ns=None)
    if whole.span_s is not None and whole.span_s <= ROLLING_S:
        return whole  # the two are one span
    return dataclasses.replace(whole, rolling_5s=rolling)


def covers_words(s: Snapshot) -> str:
    """What the span is, in a few words: "the whole span", "the last 5 s"."""
    if s.span_whole:
        return "the whole span"
    return f"the last {s.span_s:g} s" if s.span_s is not None else "an unknown span"


SPAN_COUNTS = ("span.tokens and span.clock_steps count this span alone (clock_steps: the steps the rate rests on, "
               "save where clock_reaches_back says they lie before it); "
               "the top level's tokens, steps and windows count the whole source, kernels_from.windows_in_span the "
               "span's windows")


def _reaches_back(s: Snapshot) -> str | None:
    """Where the clock's steps cover more seconds than the span (a clock of its own steps takes its newest 200 where
    the span holds fewer): said, with both seconds; None where they fit in it."""
    from decodemon.monitor.token_clock import GPU_STEP_CLOCKS

    tk = s.tokens
    if (tk is not None and s.token_clock in GPU_STEP_CLOCKS and not s.windows_in_span
            and s.window_rx_ns is not None and s.span_s and not s.span_whole):  # the GPU's steps: a window's
        before = (s.rx_ns - s.window_rx_ns) / 1e9 - s.span_s
        return (f"the rate's {tk.tokens} clock steps are the GPU's steps in the latest traced window, which came "
                f"{before:.3g} s before the span: no window fell in it")
    if tk is None or not tk.span_s or not s.span_s or tk.span_s <= 1.05 * s.span_s:
        return None
    return (f"the rate's {tk.tokens} clock steps cover {tk.span_s:.3g} s, past the span's {s.span_s:.3g} s: the clock "
            "reaches back for enough steps to time the loop")


def span_json(s: Snapshot) -> dict:
    """The span the figures cover: its seconds, from and to (seconds into the source and unix time), the steps
    the clock's rate rests on and the tokens counted in it."""
    tk = s.tokens
    end_s = s.rx_ns / 1e9
    start_s = end_s - (s.span_s or 0.0)
    cut = s.ended if (s.ended or "").startswith(CUT_SHORT) else None
    return {"covers": ("up to the cut" if cut else "whole") if s.span_whole else "last", "cut_short": cut,
            "seconds": _r(s.span_s),
            "from_s": round(start_s, 3), "to_s": round(end_s, 3),
            "from_unix_s": _r(s.span_end_unix_s - s.span_s) if s.span_end_unix_s is not None and s.span_s is not None
            else None,
            "to_unix_s": _r(s.span_end_unix_s), "clock_steps": tk.tokens if tk else None,
            # a clock of counted steps (graph replays) has no marks to count in a span: the whole span's are the source's
            "tokens": s.span_tokens if s.span_tokens is not None else
            (s.tokens_total if s.span_whole and (s.tokens_total or s.token_clock) else None),
            # which count is which: the top level's are the source's whole, these the span's
            "counts": SPAN_COUNTS, "clock_reaches_back": _reaches_back(s),
            "last_asked": (f"--last {s.last_asked_s:g} s holds the whole source: the figures are its whole "
                           f"{_r(s.span_s):g} s" if s.last_asked_s is not None and s.span_s is not None else None)}


def rolling_json(s: Snapshot, summary) -> dict | None:
    """The rolling 5-s figures beside a longer span (None where the span is itself 5 s or less, or the last S)."""
    if s.rolling_5s is None:
        return None
    full = summary(s.rolling_5s)
    out = {"seconds": _r(s.rolling_5s.span_s)}
    out.update({k: full.get(k) for k in ROLLING_KEYS})
    return out


def span_words(s: Snapshot) -> str:
    """One line for a report's head: the span covered, its steps and tokens, and the rolling 5 s where they
    differ."""
    j = span_json(s)
    source = "attach" if str(s.label).isdigit() else "recording"  # a pid's label is its number
    if s.span_whole:
        whole = f"the {source} up to its cut" if j["cut_short"] else f"the whole {source}"
        line = f"Covers {whole}: {j['seconds']:g} s, {j['from_s']:g}–{j['to_s']:g} s into it"
        line += f" ({j['last_asked']})" if j["last_asked"] else ""
    else:  # the seconds up to where the summary was made: the source's end, or where the app was paused
        line = f"Covers the {j['seconds']:g} s up to {j['to_s']:g} s into the {source} ({j['from_s']:g}–{j['to_s']:g} s)"
    if j["cut_short"]:  # a recording whose writer was killed: what was read is what came before the cut
        line += f" ({j['cut_short']})"
    counted = [f"{j['tokens']} tokens counted"] if j["tokens"] is not None else []
    if j["clock_steps"] is not None:
        counted.append(f"the rate over {j['clock_steps']} clock steps")
    line += f", {', '.join(counted)}" if counted else ""
    if j["clock_reaches_back"]:
        line += f" ({j['clock_reaches_back']})"
    r = s.rolling_5s
    if r is not None and r.tokens is not None:
        line += (f"; the last {ROLLING_S:g} s alone read {r.tokens.ms_per_token:.4g} ms/token, "
                 f"{r.diagnosis.ceiling.upper()}")
    return line


def _r(x: float | None) -> float | None:
    return round(x, 3) if x is not None else None
