"""The rolling verdict: the diagnosis of each window folded in with hysteresis, and its history of changes.

A new ceiling must win `hold` windows in a row to replace the old one, so one odd window does not flap the
verdict; each change keeps the figures that moved with it. Pure: frozen values in, frozen values out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Change:
    """One change of verdict, with the figures that moved."""

    at: str
    before: str
    after: str
    figures: tuple[tuple[str, float, float], ...]  # (name, before, after)

    def text(self) -> str:
        """'LAUNCH → OCCUPANCY at 12:03:10: ms/token 13.1 → 3.2, GPU busy 24% → 95%'."""
        figs = ", ".join(f"{n} {a:.3g} → {b:.3g}" for n, a, b in self.figures)
        return f"{self.before.upper()} → {self.after.upper()} at {self.at}" + (f": {figs}" if figs else "")


@dataclass(frozen=True)
class Rolling:
    """Verdict with hysteresis: a new ceiling must win `hold` windows in a row to replace the old one."""

    ceiling: str = "unknown"
    pending: str = ""
    streak: int = 0
    hold: int = 2
    figures: tuple[tuple[str, float], ...] = ()
    pending_figures: tuple[tuple[str, float], ...] = ()
    history: tuple[Change, ...] = ()
    changed_at: str = ""


def advance(r: Rolling, ceiling: str, at: str, figures: dict) -> Rolling:
    """Fold one window's verdict into the rolling verdict."""
    figs = tuple((k, float(v)) for k, v in figures.items() if v is not None)
    if r.ceiling == "unknown" and not r.history and ceiling != "unknown":
        return replace(r, ceiling=ceiling, pending="", streak=0, figures=figs, changed_at=at,
                       history=(Change(at, "unknown", ceiling, ()),))
    if ceiling == r.ceiling or ceiling == "unknown":
        return replace(r, pending="", streak=0, figures=figs if ceiling == r.ceiling else r.figures)
    streak = r.streak + 1 if ceiling == r.pending else 1
    pending_figs = r.pending_figures if ceiling == r.pending else r.figures
    if streak >= r.hold:
        before = dict(pending_figs)
        moved = tuple((k, before[k], v) for k, v in figs if k in before and abs(v - before[k]) > 1e-9 * max(1, abs(v)))
        ch = Change(at, r.ceiling, ceiling, moved)
        return replace(r, ceiling=ceiling, pending="", streak=0, figures=figs, history=r.history + (ch,),
                       changed_at=at, pending_figures=())
    return replace(r, pending=ceiling, streak=streak, pending_figures=pending_figs)


def headline(diagnosis, r: Rolling) -> tuple[str, str]:
    """The verdict to show, and the pending change in words ('' when none): the ceiling whose candidate binds now
    (diagnosis.verdict: never one over a candidate that does not bind), and, where the history still holds another,
    that it binds now and how many windows in a row it has held toward being recorded."""
    from decodemon.monitor.diagnosis import verdict  # noqa: PLC0415 - the rule lives with the candidates

    ceiling = verdict(diagnosis.candidates)
    if r.ceiling == ceiling or ceiling == "unknown":
        return ceiling, ""
    if r.ceiling == "unknown":  # the history records a window's verdict, and none has named a ceiling yet
        return ceiling, "binds on the span's figures; no window has named a ceiling yet, so the history is empty"
    won = r.streak if r.pending == ceiling else 0
    held = diagnosis.candidates.get(r.ceiling)
    now = (f"; the figures of the span now rule {r.ceiling.upper()} out" if held is not None and
           held.state == "ruled_out" else "")
    if not won:  # the latest window did not read it: "binds now ... (0 so far)" would read as a contradiction
        return ceiling, (f"binds on the span's figures; the history keeps {r.ceiling.upper()}: its latest window "
                         f"did not read {ceiling.upper()}, and it changes once {r.hold} windows in a row do{now}")
    return ceiling, (f"binds on the span's figures; the history keeps {r.ceiling.upper()}, its windows' verdict, until "
                     f"{ceiling.upper()} wins {r.hold} windows in a row ({won} so far){now}")
