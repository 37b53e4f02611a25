"""The write-it-down rule: predictions sealed before a change, graded after it, in a JSON-lines ledger.

Before changing code, `decodemon predict` seals which ceiling binds, the change, and the expected ms/token change,
together with what was measured at that moment. After the change, `decodemon grade` (or the next attach or report
of the same loop, through `grade_open`) measures again and grades it:

    right number, right reason   the change in ms/token is within tolerance of the prediction, and the predicted
                                 ceiling was relieved (it stopped binding, or its own figure fell), or the ceiling
                                 named with `then` binds now
    right number, other reason   the number held, but the ceiling moved in a way nobody predicted: a coincidence
                                 that is about to be generalised from
    right number, reason unmeasured
                                 the number held, but no ceiling was measured to bind before (UNKNOWN, and no
                                 `then` named) or after (UNKNOWN, its own figure not lower): nothing says why
    wrong                        the number did not hold; the grade says by how many points, and whether the
                                 change went the predicted way (`how_wrong`)

The file lives beside the user's project (`decodemon.ledger.jsonl`) and is only ever appended to: one `os.write`
of one whole line under O_APPEND, then fsync, so two writers never interleave inside a line and a crash leaves at
most one torn last line. A line that is not JSON, not a ledger entry, or whose content hash does not match is
reported on stderr by the caller, one line each, and kept as it is: the ledger is never rewritten.
"""

from __future__ import annotations

import math
import re
import secrets
import time
from pathlib import Path

# the file: read, appended to, checked (ledger_file); its names are the ledger's own
from decodemon.monitor.ledger_file import (FORMAT, LedgerError, NotGraded, append,  # noqa: F401
                                          check_writable, content_hash, read)

DEFAULT_PATH = "decodemon.ledger.jsonl"
CEILINGS = ("bandwidth", "comm", "launch", "occupancy")  # the candidates of the headline rule (diagnosis.ORDER)
RIGHT, OTHER, WRONG = "right number, right reason", "right number, other reason", "wrong"
UNMEASURED = "right number, reason unmeasured"
SIGNIFICANT_MS_CHANGE = 0.10  # ms/token moving more than this (or the verdict moving) makes older diagnoses stale
RELIEVED_FRACTION = 0.10  # a ceiling's own figure falling by this much counts as relieving it
DEFAULT_TOLERANCE_PCT = 10.0
MAX_TOLERANCE_PCT = 100.0  # wider, and a prediction of -50% could not miss a run that doubled its ms/token
NO_CHANGE_PCT = 1.0  # ms/token moving less than this: no direction to grade a miss by


# --- what is sealed ------------------------------------------------------------------------------------------

def state_of(summary: dict) -> dict:
    """The measured state a ledger entry seals, from a `summary_json` dict."""
    cands = summary.get("candidates") or {}
    return {"verdict": summary.get("verdict") or summary.get("ceiling") or "unknown",
            "ceiling": summary.get("ceiling") or "unknown",
            "ms_per_token": summary.get("ms_per_token"),
            "kernels_per_token": summary.get("kernels_per_token"),
            "bytes_per_token": summary.get("bytes_per_token"),
            "serial_fraction": summary.get("serial_fraction"),
            "candidates": {k: (c or {}).get("value") for k, c in cands.items()},
            # what each value is (ceilings.QUANTITIES): two states' values are held against each other only where
            # one quantity
            "candidate_quantities": {k: (c or {}).get("quantity") for k, c in cands.items()},
            "tokens": summary.get("tokens"),
            "device": summary.get("device"),  # a grade holds two states of one kind of device only
            "recording": summary.get("recording_sha256"),  # and never two spans of one recording
            # when the span it seals ended (unix s): a state sealed later from an older recording is not a change
            # that came after the ones measured since
            "measured_unix_s": summary.get("span_end_unix_s"),
            # what ms_per_token times (a batched engine's marks are steps), the tokens a step made, the KV cache's
            # type: a grade across two of them says so
            "clock_unit": summary.get("clock_unit"), "tokens_per_step": summary.get("tokens_per_step"),
            "kv_dtype": summary.get("bytes_per_token_model_kv_dtype")}


def unit_words(before: dict, after: dict | None = None) -> tuple[str, str]:
    """What each state's ms_per_token is a time of ("ms/token", "ms/step"), as said beside its figure; a state
    sealed before the unit was (an older entry) is taken to be in the other's."""
    after = after or before
    a, b = before.get("clock_unit"), after.get("clock_unit")
    return f"ms/{a or b or 'token'}", f"ms/{b or a or 'token'}"


def _per_step(st: dict) -> float | None:
    """The tokens a step of `st` made: a loop of one sequence's mark is one token."""
    return st.get("tokens_per_step") or (1.0 if st.get("clock_unit") == "token" else None)


def _cautions(before: dict, after: dict) -> list[str]:
    """What moved between the sealed state and this one besides the change, where a grade still holds them: the
    tokens a step made, the KV cache's type."""
    out = []
    a, b = _per_step(before), _per_step(after)
    if a and b and abs(a - b) > 0.1 * max(a, b):
        out.append(f"sealed at {a:g} token{'s' if a != 1 else ''} a step, measured at {b:g}: a step's time is "
                   "shared by its tokens, so it moved with the batch as well as the change")
    a, b = before.get("kv_dtype"), after.get("kv_dtype")
    if a and b and a != b:
        out.append(f"the KV cache was {a}, now {b}: a position's bytes moved with it")
    return out


def with_recording(summary: dict, source) -> dict:
    """`summary` with the sha256 of the recording it was read from (`source`, where it is a file): what tells one
    recording from another whatever span of it was summarised (a pid has none)."""
    import hashlib

    path = Path(str(source))
    if not path.is_file():
        return summary
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return {**summary, "recording_sha256": h.hexdigest()}


def loop_label(argv, fallback: str) -> str:
    """What names a decode loop across its runs: its script or `-m` module (an eager and a graphed run of one
    engine share it), else `fallback` (a recording's path, a pid)."""
    args = list(argv or ())
    if args and "python" in Path(args[0]).name:
        args = args[1:]
    if len(args) >= 2 and args[0] == "-m":
        return args[1]
    for a in args:
        if not a.startswith("-"):
            return "/".join(Path(a).parts[-2:])  # `engine_adapter/demo.py`: the same from any directory
    return fallback


_EXPECT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?(?:%|ms)?")


def parse_expect(text: str) -> tuple[str, float]:
    """`-60%` or `-60` → ("pct", -60.0); `3.9ms` → ("ms", 3.9) (the ms/token expected after the change)."""
    s = str(text).strip().replace("−", "-").replace(" ", "")
    if not _EXPECT.fullmatch(s):  # float() also reads '1_0' and other scripts' digits
        s = ""
    try:
        if s.endswith("ms"):
            v = float(s[:-2])
            if v > 0 and math.isfinite(v):
                return "ms", v
            if v <= 0:
                raise LedgerError(f"--expect {text}: a token cannot take {v:g} ms; --expect takes the ms/token "
                                  "expected after the change, above 0 (3.9ms), or a change in percent (-60%)")
        elif s and not s.endswith("%") and s[0] not in "+-":  # 3.9: ms after, or +3.9%? said, not guessed
            raise LedgerError(f"--expect {text}: say {s}ms for the ms/token expected after the change, or +{s}% "
                              "(or -N%) for the change in percent")
        elif s:
            v = float(s[:-1] if s.endswith("%") else s)
            if -100 < v and math.isfinite(v):  # ms/token cannot fall by all of itself
                return "pct", v
            if v <= -100:
                raise LedgerError(f"--expect {text}: a time cannot fall by 100% or more (-100% would be no time at "
                                  "all); --expect takes a fall above -100%, e.g. -60%, or the ms/token expected "
                                  "after the change (3.9ms)")
    except ValueError:
        pass
    raise LedgerError(f"--expect takes a change in percent (-60%) or the ms/token expected after it (3.9ms), "
                      f"not {text!r}")


def seal(entry: dict) -> dict:
    """The entry with its format, its content hash and, for a prediction, its id (the hash's head)."""
    e = {"format": FORMAT, **entry}
    e["hash"] = content_hash(e)
    return e


def now_iso(now: float | None = None) -> str:
    """UTC time as the ledger writes it (sortable text)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))


# --- predict and grade ---------------------------------------------------------------------------------------

def prediction(summary: dict, source: str, change: str, expect: str, ceiling: str | None = None,
               then: str | None = None, tolerance_pct: float = DEFAULT_TOLERANCE_PCT,
               now: float | None = None) -> dict:
    """A sealed prediction: the change, the expected ms/token change and the ceiling it acts on, with the state
    measured now. `ceiling` defaults to the measured verdict; `then` is the ceiling expected to bind after."""
    st = state_of(summary)
    if not st["ms_per_token"]:
        raise LedgerError(f"{source}: no ms/token measured, so there is nothing to predict a change from")
    kind, val = parse_expect(expect)
    pct = val if kind == "pct" else 100.0 * (val - st["ms_per_token"]) / st["ms_per_token"]
    for name, c in (("--ceiling", ceiling), ("--then", then)):
        if c is not None and c.lower() not in CEILINGS:
            raise LedgerError(f"{name} is one of {', '.join(CEILINGS)}, not {c!r}")
    # a nonce: two predictions sealed in one second from the same figures are two entries, with two ids
    return seal({"kind": "prediction", "at": now_iso(now), "nonce": secrets.token_hex(8), "source": source,
                 "change": change,
                 "expect": str(expect), "expect_pct": round(pct, 3), "tolerance_pct": tolerance_pct,
                 "ceiling": (ceiling or st["verdict"]).lower(), "then": then.lower() if then else None,
                 "state": st})


def pred_id(entry: dict) -> str:
    """A prediction's short id: its hash's first 12 hex digits."""
    return entry["hash"][:12]


def _fell(ceiling: str, before: dict, after: dict) -> bool:
    """The ceiling's own figure (× floor, µs/launch, % ...) fell by RELIEVED_FRACTION."""
    a = (before.get("candidates") or {}).get(ceiling)
    b = (after.get("candidates") or {}).get(ceiling)
    qa, qb = ((s.get("candidate_quantities") or {}).get(ceiling) for s in (before, after))
    if qa != qb:  # one figure priced two ways (or sealed before values named their quantity): not comparable
        return False
    return a is not None and b is not None and a > 0 and b <= a * (1 - RELIEVED_FRACTION)


def _right_reason(pred: dict, before: dict, after: dict) -> bool | None:
    """Whether the change acted as predicted: the `then` ceiling binds now, or the sealed ceiling was relieved
    (it stopped binding, or its own figure fell). None when nothing measured can say: the sealed ceiling was
    UNKNOWN with no `then`, or nothing binds now and no figure fell."""
    now = after.get("verdict")
    if pred.get("then"):
        return True if now == pred["then"] else None if now == "unknown" else False
    ceiling = pred["ceiling"]
    if ceiling == "unknown":
        return None
    if now == "unknown":
        return True if _fell(ceiling, before, after) else None
    return now != ceiling or _fell(ceiling, before, after)


def how_wrong(measured_pct: float, expect_pct: float) -> str:
    """A missed number in words: the direction it went against the predicted one, and by how many points."""
    miss = abs(measured_pct - expect_pct)
    if expect_pct and abs(measured_pct) < NO_CHANGE_PCT:  # a run's own wobble has no direction to go
        return f"no change to speak of ({measured_pct:+.1f}%), where {expect_pct:+.1f}% was predicted"
    if expect_pct and measured_pct and (measured_pct > 0) == (expect_pct > 0):
        further = "further" if abs(measured_pct) > abs(expect_pct) else "less far"
        return f"the predicted direction, {miss:.1f} points {further} than predicted"
    if not expect_pct:
        return f"predicted no change; it moved {measured_pct:+.1f}%"
    return f"the other direction from the prediction, {miss:.1f} points off"


def grade(pred: dict, summary: dict, now: float | None = None) -> dict:
    """The sealed grade of `pred` against the state measured now."""
    before, after = pred["state"], state_of(summary)
    ms0, ms1 = before["ms_per_token"], after["ms_per_token"]
    if not ms1:
        raise NotGraded(f"{pred['source']}: no ms/token measured now, so the prediction cannot be graded")
    if before.get("recording") and before["recording"] == after.get("recording"):
        raise NotGraded(f"{pred['source']}: this is the recording the prediction was sealed from (a span of it, or "
                        "all of it), so nothing was changed; grade a run made after the change (the prediction "
                        "stays open)")
    da, db = before.get("device"), after.get("device")
    if da and db and da != db:  # the ratio would measure the device as well as the change
        raise NotGraded(f"{pred['source']}: the prediction was sealed on {da} and this was measured on {db}, so "
                        f"a grade would measure the device as well as the change; measure the loop on {da} (the "
                        "prediction stays open)")
    if {k: after.get(k) for k in before} == before:  # the very figures it sealed (what an older seal holds of them):
        # such a grade would say nothing of a change
        raise NotGraded(f"{pred['source']}: these are the figures the prediction sealed, so nothing was changed and "
                        "run again; make the change, measure the loop again, then grade (the prediction stays open)")
    measured = 100.0 * (ms1 - ms0) / ms0
    tol = float(pred.get("tolerance_pct", DEFAULT_TOLERANCE_PCT))
    number = abs(measured - pred["expect_pct"]) <= tol
    reason = _right_reason(pred, before, after)
    g = WRONG if not number else UNMEASURED if reason is None else RIGHT if reason else OTHER
    missed = how_wrong(measured, pred["expect_pct"]) if g == WRONG else None
    u0, u1 = unit_words(before, after)
    moved = f"{u0} {ms0:.4g} → {ms1:.4g}" if u0 == u1 else f"{u0} {ms0:.4g} → {u1} {ms1:.4g}"
    text = (f"{g}{f' ({missed})' if missed else ''}: {moved} ({measured:+.1f}%, predicted "
            f"{pred['expect_pct']:+.1f}% ± {tol:g}); "
            f"ceiling {before['verdict'].upper()} → {after['verdict'].upper()}")
    if pred.get("then") and after["verdict"] != pred["then"]:
        text += f" (predicted {pred['then'].upper()})"
    cautions = _cautions(before, after)
    if cautions:
        text += "; " + "; ".join(cautions)
    extra = {"how_wrong": missed} if missed else {}
    if cautions:
        extra["cautions"] = cautions
    return seal({"kind": "grade", "at": now_iso(now), "source": pred["source"], "prediction": pred_id(pred),
                 "grade": g, **extra, "measured_pct": round(measured, 3), "new_ceiling": after["verdict"],
                 "text": text, "state": after})


def none_open(path, entries: list[dict], source: str | None = None) -> str:
    """Why there is no open prediction to grade, in one line: the label looked for (when one was), and the labels
    that do have open predictions, or that none does."""
    labels = sorted({e["source"] for e in open_predictions(entries)})
    if source is None:
        return f"no open prediction in {path} (`decodemon predict` writes one)"
    if not labels:
        return f"no open prediction for {source} in {path}, nor for any other loop (`decodemon predict` writes one)"
    return f"no open prediction for {source} in {path}; open ones are for {', '.join(labels)} (--label NAME picks one)"


def open_predictions(entries: list[dict], source: str | None = None) -> list[dict]:
    """Predictions not yet graded, oldest first (of `source` only, when given)."""
    graded = {e.get("prediction") for e in entries if e["kind"] == "grade"}
    return [e for e in entries if e["kind"] == "prediction" and pred_id(e) not in graded
            and (source is None or e["source"] == source)]


def grade_open(path, summary: dict, source: str, now: float | None = None) -> tuple[dict | None, list[str]]:
    """Grade the latest open prediction of `source` against `summary` and append the grade; (None, ...) when there
    is none. What the next attach or report of the same loop calls. The second value: the file's problem lines."""
    entries, problems = read(path)
    todo = open_predictions(entries, source)
    if not todo or not summary.get("ms_per_token"):
        return None, problems
    g = grade(todo[-1], summary, now)
    append(path, g)
    return g, problems


# --- shelf life ----------------------------------------------------------------------------------------------

def significant_change(old: dict, new: dict) -> str | None:
    """Why `new` makes a diagnosis measured as `old` stale (the verdict moved, or ms/token by > 10%), else None."""
    if old.get("verdict") != new.get("verdict") and new.get("verdict") not in (None, "unknown"):
        return f"the verdict moved {str(old.get('verdict')).upper()} → {str(new.get('verdict')).upper()}"
    a, b = old.get("ms_per_token"), new.get("ms_per_token")
    if a and b and abs(b - a) / a > SIGNIFICANT_MS_CHANGE:
        return f"ms/token moved {100.0 * (b - a) / a:+.0f}% ({a:.4g} → {b:.4g})"
    return None


def stale_reasons(entries: list[dict], current: dict | None = None) -> dict[int, str]:
    """For each entry index whose sealed state predates a significant change of its source (a later entry, or
    `current`, a state_of() measured now): why. A later entry whose state was measured no later than this one's (a
    prediction sealed afterwards from an older recording) is no change after it. A graded prediction is never
    stale: its grade holds it against what came after. A sealed serial fraction is named: it must be re-derived."""
    graded = {e.get("prediction") for e in entries if e["kind"] == "grade"}
    out = {}
    for i, e in enumerate(entries):
        if e["kind"] == "prediction" and pred_id(e) in graded:
            continue
        later = [x["state"] for x in entries[i + 1:] if x["source"] == e["source"]]
        if current is not None and current.get("source", e["source"]) == e["source"]:
            later.append(current)
        t0 = e["state"].get("measured_unix_s")
        for st in later:
            t = st.get("measured_unix_s")
            if t0 is not None and t is not None and t <= t0:
                continue  # measured before it, whenever it was sealed
            why = significant_change(e["state"], st)
            if why:
                sf = e["state"].get("serial_fraction")
                out[i] = why + (f"; its serial fraction {sf:.2f} must be re-derived" if sf is not None else "")
                break
    return out


# --- rendering -----------------------------------------------------------------------------------------------

def _ms(x) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else "—"


def grade_words(g: dict) -> str:
    """A grade as said to a person: a missed number says how it missed."""
    return f"{g['grade']} ({g['how_wrong']})" if g.get("how_wrong") else str(g["grade"])


def ledger_markdown(entries: list[dict], source: str | None = None, current: dict | None = None) -> str:
    """The ledger as a Markdown section for DIAGNOSIS.md: each prediction, its grade, and what is stale."""
    from decodemon.monitor.safe_text import markdown as md

    stale = stale_reasons(entries, current)
    rows = [(i, e) for i, e in enumerate(entries) if source is None or e["source"] == source]
    grades = {e["prediction"]: (i, e) for i, e in rows if e["kind"] == "grade"}
    lines = ["## Predictions and grades", "",
             "Sealed before each change (which ceiling binds, the change, the expected ms/token), graded after it.",
             ""]
    preds = [(i, e) for i, e in rows if e["kind"] == "prediction"]
    others = sorted({e["source"] for e in entries if e["kind"] == "prediction"} - {source}) if source else []
    if not preds and others:  # sealed under another label: named, with the flag that picks one
        return "\n".join(lines + [f"No prediction for {md(source)} is written down; the ledger holds predictions for "
                                  f"{', '.join(md(o) for o in others)} (`--label NAME` picks one).", ""])
    if not preds:
        return "\n".join(lines + ["No prediction is written down yet: `decodemon predict SOURCE --change ... "
                                  "--expect -N%` before the next change.", ""])
    lines += ["| sealed | loop (its label) | ceiling at sealing | change | expected | measured | grade | ceiling after "
              "| id |",
              "|---|---|---|---|---|---|---|---|---|"]
    for i, p in preds:
        gi, g = grades.get(pred_id(p), (None, None))
        measured = f"{g['measured_pct']:+.1f}% ({_ms(p['state']['ms_per_token'])} → {_ms(g['state']['ms_per_token'])} ms)" \
            if g else "open"
        # every text of an entry is the file's (a loop's argv, what a user typed): escaped for the table
        named, seen = str(p["ceiling"]).upper(), str(p["state"].get("verdict", "unknown")).upper()
        ceiling = named if named == seen else f"{named} named by you (measured: {seen})"
        lines.append(f"| {md(p['at'])} | {md(p['source'])} | {md(ceiling)} "
                     f"({_ms(p['state']['ms_per_token'])} ms) | {md(p['change'])} "
                     f"| {p['expect_pct']:+.0f}% ± {p['tolerance_pct']:g} | {measured} "
                     f"| {md(grade_words(g)) if g else '—'} | {md(str(g['new_ceiling']).upper()) if g else '—'} "
                     f"| {md(pred_id(p))} |")
    notes = [f"- {md(entries[i]['kind'])} {md(entries[i]['at'])} ({md(entries[i]['source'])}) is stale: {md(why)}"
             for i, why in sorted(stale.items()) if source is None or entries[i]["source"] == source]
    if notes:
        lines += ["", "Stale (measured before the last significant change; re-measure before relying on it):", *notes]
    return "\n".join(lines + [""])
