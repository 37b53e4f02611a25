"""The verdict: the four ceilings' candidates (ceilings.py) read in the method's order, and its advice (advice.py).

The verdict is the first candidate that binds in ORDER (`verdict`, the one headline rule), else "unknown" with the
one missing measurement named. When none binds but the kernels fill the step, "the kernels are the cost" is
resolved by the counters where they can: with small grids or SM active far below GPU busy, OCCUPANCY binds.
BANDWIDTH binds within the seeds' 2x of its floor and nowhere else: a step 2-3x its floor whose kernels fill it
stays open, with what was measured and what would decide. Every verdict carries its remedy family and the one
measurement that would prove it wrong.

    Inputs --price_*--> Candidates --verdict--> ceiling --advice--> remedy, falsifier, predicted win

Pure: frozen values in, frozen values out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from decodemon.monitor.advice import advice
from decodemon.monitor.ceilings import (BANDWIDTH_NEAR_RATIO, BANDWIDTH_RULED_OUT_RATIO, BINDING, ORDER,
                                        OCCUPANCY_LEANING_SHARE_PCT, RULED_OUT, UNKNOWN, Candidate, Inputs,
                                        host_between_replays, kernels_fill_step, own_kernel_ms, price_bandwidth,
                                        price_comm, price_launch, price_occupancy)
from decodemon.monitor.numbers import said

# the diagnosis's own names, and those of the candidates it is read with
__all__ = ["BINDING", "ORDER", "RULED_OUT", "UNKNOWN", "Candidate", "Diagnosis", "Inputs", "Scaling", "diagnose",
           "scaling", "serial_fraction", "verdict"]


# how us_per_kernel was reached, by the LAUNCH candidate's quantity: measured, or estimated with what was missing
US_PER_KERNEL_NOTES = {
    "idle_pct_of_step": "{how}: the idle the traced kernels leave in the untraced step (ms/token − the traced "
                        "kernels' ms a token) ÷ kernels/token",
    "floor_gap_pct_of_step": "estimated: (ms/token − the bandwidth floor) ÷ kernels/token, no kernel time traced "
                             "(the kernels taken to run at the floor)",
    "launching_pct_of_step": "ms/token ÷ kernels/token: the time available a kernel, no kernel time and no floor",
}


@dataclass(frozen=True)
class Diagnosis:
    """The verdict and its receipts."""

    ceiling: str
    candidates: dict
    us_per_kernel: float | None
    bandwidth_floor_ms: float | None
    remedy: str
    falsify: str
    predicted_win: str
    serial_fraction: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    given: bool = False  # the figures were typed in (`decodemon diagnose`), not measured by decodemon
    edge: str = ""  # where a token EDGE_PCT faster or slower would read another verdict: which, and why ("": none)

    @property
    def per_kernel_word(self) -> str:
        """What us_per_kernel is a kernel's: its "idle", or the step's time "available" where no kernel time and no
        floor priced LAUNCH."""
        return "available" if self.candidates["launch"].quantity == "launching_pct_of_step" else "idle"

    def as_json(self) -> dict:
        """The JSON contract shared by `diagnose`, `report`, `attach --json`."""
        # every key always there; a figure not measured (or a prediction not made) is null, never "n/a" or absent
        return {
            "ceiling": self.ceiling,
            "candidates": {k: c.as_json() for k, c in self.candidates.items()},
            "remedy": self.remedy,
            "falsify": _said(self.falsify),
            "predicted_win": _said(self.predicted_win),
            "us_per_kernel": _round(self.us_per_kernel, 3),
            "us_per_kernel_note": US_PER_KERNEL_NOTES.get(self.candidates["launch"].quantity, "").format(
                how="from the figures given" if self.given else "measured") or None
            if self.us_per_kernel is not None else None,
            "bandwidth_floor_ms": _round(self.bandwidth_floor_ms, 4),
            # a fraction only where one between 0 and 1 explains the speedup; the algebra's s beside it either way
            "serial_fraction": _round(self.serial_fraction, 4)
            if self.serial_fraction is not None and 0.0 <= self.serial_fraction <= 1.0 else None,
            "serial_fraction_solved": _round(self.serial_fraction, 4),
            "notes": list(self.notes),
            "edge": self.edge or None,
        }


def _round(x: float | None, nd: int) -> float | None:
    return None if x is None else round(x, nd)


def _said(text: str) -> str | None:
    """The screen's "n/a ..." (no falsifier, no predicted win: nothing was priced or claimed) as JSON's null; the
    reason is in `remedy`, which names what to measure."""
    return None if not text or text.startswith("n/a") else text


def serial_fraction(speedup: float, n: int) -> float:
    """Amdahl solved for s: speedup = 1 / (s + (1 - s)/n)  =>  s = (n/speedup - 1)/(n - 1)."""
    if n <= 1:
        raise ValueError("serial fraction needs n > 1")
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    return (n / speedup - 1.0) / (n - 1.0)



def verdict(candidates: dict) -> str:
    """The one headline rule: the first of ORDER whose candidate reads "binding", else "unknown". The app,
    `--json`, `report`, `diagnose`, the exporter and the recordings all take their verdict from here."""
    return next((k for k in ORDER if k in candidates and candidates[k].state == BINDING), "unknown")


def _comm_outweighed(i: Inputs, comm, comm_ms: float | None, bw):
    """COMM past its 10% is not what binds where a larger part of the step is another's: the GPU's idle between
    kernels (LAUNCH's, whatever its own state), or the bytes of a token at its bandwidth floor (BANDWIDTH binding).
    The seeds stop "when one of them is obviously binding"; weighed as LAUNCH and OCCUPANCY are above."""
    if comm.state != BINDING or comm_ms is None or not i.ms_per_token:
        return comm
    if i.kernel_ms is not None and i.ms_per_token - i.kernel_ms > comm_ms:
        idle = i.ms_per_token - i.kernel_ms
        return replace(comm, state=UNKNOWN, detail=f"{comm.detail}; not what binds: the GPU's idle between kernels "
                                                   f"({idle:.3g} ms a token, LAUNCH's) is more of the step than the "
                                                   f"collectives' {comm_ms:.3g} ms")
    if bw.state == BINDING:
        return replace(comm, state=UNKNOWN, detail=f"{comm.detail}; not what binds: the token is {bw.value:.3g}× its "
                                                   "bandwidth floor (BANDWIDTH binds): the bytes set it, and the "
                                                   "collectives are a part of it")
    return comm


def diagnose(i: Inputs, speedup: float | None = None, n: int | None = None) -> Diagnosis:
    """Number every candidate, pick the binding ceiling, say how to fix it and how to prove it wrong."""
    given = i
    i, cands, floor, comm_ms, launch, per_launch = _priced(i)  # i: a late peer's wait taken out of the kernels
    ceiling = verdict(cands)
    priced = tuple(k.upper() for k in ORDER if cands[k].value is not None)
    remedy, falsify, win = advice(ceiling, i, floor, comm_ms, launch, priced, _missing(i, cands))
    sf = serial_fraction(speedup, n) if (speedup and n and n > 1) else None
    return Diagnosis(ceiling=ceiling, candidates=cands, us_per_kernel=per_launch, bandwidth_floor_ms=floor,
                     remedy=remedy, falsify=falsify, predicted_win=win, serial_fraction=sf,
                     edge=_edge(given, ceiling, cands), given=not given.ms_kind)


EDGE_PCT = 1.0  # a token clock this much faster or slower: what a verdict on a threshold turns on


def _edge(i: Inputs, ceiling: str, cands: dict) -> str:
    """Where the same token EDGE_PCT faster or slower reads another verdict: the verdict sits on a threshold, and
    a span a little longer or shorter may read the other. Which, at what ms/token, and the candidate that moves."""
    if not i.ms_per_token or i.no_gpu:
        return ""
    for sign, word in ((-1, "faster"), (1, "slower")):
        ms = i.ms_per_token * (1 + sign * EDGE_PCT / 100)
        _, other, *_ = _priced(replace(i, ms_per_token=ms))
        alt = verdict(other)
        if alt == ceiling:
            continue
        moved = next((k for k in ORDER if other[k].state != cands[k].state and other[k].value is not None), alt)
        c = other.get(moved)
        state = {BINDING: "binds", RULED_OUT: "is ruled out"}.get(c.state, "is unknown") if c else ""
        who = "it" if moved == alt else moved.upper()
        at = f" ({who} {state} at {said(c.value, 4)}{'' if c.unit.startswith('×') else ' '}{c.unit})" if c else ""
        name = "UNKNOWN, nothing binding" if alt == "unknown" else alt.upper()
        return (f"on the edge: a token {EDGE_PCT:g}% {word} ({ms:.4g} ms) reads {name}{at}; a span a little longer "
                "or shorter may read it too")
    return ""


def _priced(i: Inputs):
    """The inputs as priced (a late peer's wait out of the kernels' time), the four candidates as the verdict reads
    them, BANDWIDTH's floor, COMM's ms and LAUNCH's µs a kernel."""
    if i.kernel_sum_ms_per_token is not None and i.collective_wait_ms_per_token:
        # a collective kernel spinning while it waits for a late peer is not this rank's work: that time is the
        # step's idle for LAUNCH and OCCUPANCY (COMM's detail says it, as a straggling rank's ceiling)
        i = replace(i, kernel_sum_ms_per_token=own_kernel_ms(i.kernel_sum_ms_per_token, i.collective_wait_ms_per_token),
                    kernel_busy_ms_per_token=own_kernel_ms(i.kernel_busy_ms_per_token, i.collective_wait_ms_per_token))
    bw, floor = price_bandwidth(i)
    comm, comm_ms = price_comm(i)
    launch, per_launch = price_launch(i, floor)
    occ = price_occupancy(i, bw.value)
    if launch.state == BINDING and occ.state == BINDING and host_between_replays(i, floor):
        # LAUNCH bound by weighing the idle between replays against the small grids' share of the step: the
        # grids lost that comparison, so they are not what binds
        occ = replace(occ, state=UNKNOWN, detail=f"{occ.detail}; not what binds: the GPU's idle between replays is "
                                                 "more of the step than the small grids' share (LAUNCH)")
    comm = _comm_outweighed(i, comm, comm_ms, bw)
    cands = {"bandwidth": bw, "comm": comm, "launch": launch, "occupancy": occ}
    if i.no_gpu:  # nothing a GPU would measure is asked for where there is none
        cands = {k: c if c.value is not None else replace(c, detail="not priced: the target has no GPU")
                 for k, c in cands.items()}
    if verdict(cands) == "unknown":
        cands = _kernels_are_the_cost(i, cands)
    return i, cands, floor, comm_ms, launch, per_launch


def _kernels_are_the_cost(i: Inputs, cands: dict) -> dict:
    """No candidate binds outright but the kernels fill the step: "the kernels are the cost" resolved by the
    counters, as a candidate that binds with the reason in its detail: with a quarter of the kernel time in small
    grids, or SM active under half of GPU busy, OCCUPANCY binds. BANDWIDTH is not stretched past the seeds' 2x: a
    step 2-3x its floor stays "unknown", its BANDWIDTH detail saying what else was measured."""
    bw, occ = cands["bandwidth"], cands["occupancy"]
    if not kernels_fill_step(i, cands["launch"]):
        return cands
    ratio = bw.value
    sm_ratio = (i.sm_active_pct / i.gpu_busy_pct) if (i.sm_active_pct is not None and i.gpu_busy_pct) else None
    # SM active alone, near the floor, does not tell grids from memory (SMs stall on memory in both)
    leaning_occ = ((i.small_grid_share_pct is not None and i.small_grid_share_pct >= OCCUPANCY_LEANING_SHARE_PCT)
                   or (sm_ratio is not None and sm_ratio < 0.5 and (ratio is None or ratio > BANDWIDTH_NEAR_RATIO)))
    fill = ("the kernels fill the step" if i.kernel_ms is not None
            else "a launch's share of the step is ruled out")
    if leaning_occ and occ.state != RULED_OUT and (ratio is None or ratio < BANDWIDTH_RULED_OUT_RATIO * 10):
        lean = (f"{i.small_grid_share_pct:.0f}% of kernel time in small grids (≥{OCCUPANCY_LEANING_SHARE_PCT:g}%)"
                if i.small_grid_share_pct is not None and i.small_grid_share_pct >= OCCUPANCY_LEANING_SHARE_PCT
                else f"SM active {100 * sm_ratio:.0f}% of GPU busy (< 50%)")
        why = f"binds: {fill}, {lean}" + (f", at {ratio:.3g}× the floor" if ratio is not None else "")
        return {**cands, "occupancy": replace(occ, state=BINDING, detail=f"{occ.detail}; {why}".lstrip("; "))}
    return cands


def _missing(i: Inputs, cands: dict) -> str:
    """With no candidate binding: the one measurement that would decide, in words ("" when one binds)."""
    if verdict(cands) != "unknown":
        return ""
    if i.untraced and i.gpu_busy_pct is None and i.dram_gbs is None:
        return "the PM counters (GPU busy, DRAM; no window can be traced here)"
    if i.untraced and cands["launch"].state == UNKNOWN:
        # watched from outside (llama-server by pid): PM says how much of the step the GPU idles, not whose it is
        return ("a traced window (start the target under `decodemon run`), which tells the host's gaps from the "
                "kernels' (from outside, PM says how long the GPU idles, not why)")
    if i.ms_per_token is None:
        return "a token clock (ms/token)"
    if cands["bandwidth"].value is None and not i.bytes_per_token:
        return "bytes per token (PM's DRAM counters, or the model's facts)"
    if cands["bandwidth"].value is None and not i.bandwidth_gbs:
        return "the device's bandwidth (a GPU: its measured copy, or NVML's peak)"
    if kernels_fill_step(i, cands["launch"]) and i.small_grid_share_pct is None:
        return "the grids (a traced window)"
    if i.kernels_per_token is None and not i.untraced:
        return "kernels per token (a traced window)"
    if i.kernel_ms is None and cands["launch"].state == UNKNOWN and not i.untraced:
        return "the kernels' time per token (a traced window)"
    return ""


@dataclass(frozen=True)
class Scaling:
    """A TP scaling figure and whether it predates the latest verdict change (§6: re-derive after a win)."""

    speedup: float
    n: int
    serial_fraction: float
    measured_at: str
    stale: bool


def scaling(speedup: float, n: int, measured_at: str, last_change_at: str) -> Scaling:
    """Serial fraction from a speedup at N; stale if measured before the last verdict change (ISO times)."""
    return Scaling(speedup, n, serial_fraction(speedup, n), measured_at,
                   stale=bool(last_change_at) and measured_at < last_change_at)
