"""The four ceilings, each with a number, and the verdict (the method's diagnostic sequence).

Cheapest first: BANDWIDTH (arithmetic), COMM (collective share), LAUNCH (the
launch bill), OCCUPANCY (grids against SMs). Every candidate gets a value, a
unit, a threshold and a state; the verdict is the first that binds in that
order (`verdict`, the one headline rule), else "unknown" with the one missing
measurement named. When none binds but the kernels fill the step, "the
kernels are the cost" is resolved by the counters where they can: with small
grids or SM active far below GPU busy, OCCUPANCY binds. BANDWIDTH binds within
the seeds' 2x of its floor and nowhere else: a step 2-3x its floor whose
kernels fill it stays open, with what was measured and what would decide. Every verdict
carries its remedy family and the one measurement that would prove it wrong.

Pure: frozen values in, frozen values out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

BINDING, RULED_OUT, UNKNOWN = "binding", "ruled_out", "unknown"
ORDER = ("bandwidth", "comm", "launch", "occupancy")

# §3 / second seed §11.2: what one launch costs the host (at 5 µs a launch, under ~10 µs available per kernel is
# launch-bound: §7 step 3).
EAGER_LAUNCH_US = (5.0, 20.0)
BANDWIDTH_BINDING_RATIO = 2.0
BANDWIDTH_RULED_OUT_RATIO = 10.0
COMM_RULED_OUT_PCT = 10.0
OCCUPANCY_SMALL_SHARE_PCT = 50.0
# how close to the floor the counters alone cannot tell a bandwidth-bound step from an occupancy-bound one (SMs
# stall on memory in both); and, when the kernels fill the step and nothing binds outright, what reads as OCCUPANCY
# (a quarter of the kernel time in small grids, or SM active under half of GPU busy)
BANDWIDTH_NEAR_RATIO = 3.0
OCCUPANCY_LEANING_SHARE_PCT = 25.0
KERNELS_FILL_STEP = 0.8
# a kernel call this short is held by its fixed latency (launch to retire on the GPU), not by its grid
SHORT_KERNEL_US = 4.0
# LAUNCH's rule wherever the idle is known (a traced window, or PM's GPU busy), and what an unpriced LAUNCH waits for
LAUNCH_IDLE_THRESHOLD = ("GPU idle > 50% of the step binds (graphed: above any other candidate's share; estimated "
                         f"off the floor: {EAGER_LAUNCH_US[0]:g}–{EAGER_LAUNCH_US[1]:g} µs a launch); "
                         "< 20% ruled out")
LAUNCH_IDLE_RULED_OUT = 0.2  # the idle share under which LAUNCH is ruled out (LAUNCH_IDLE_THRESHOLD)


@dataclass(frozen=True)
class Candidate:
    """One ceiling's number and what it says."""

    value: float | None
    unit: str
    threshold: str
    state: str
    detail: str = ""

    def as_json(self) -> dict:
        """The candidate as the JSON contract spells it."""
        v = None if self.value is None else round(float(self.value), 4)
        return {"value": v, "unit": self.unit, "threshold": self.threshold, "state": self.state,
                "detail": self.detail}


@dataclass(frozen=True)
class Inputs:
    """Whatever is known about one token; every field optional."""

    ms_per_token: float | None = None
    launches_per_token: float | None = None
    bytes_per_token: float | None = None
    bandwidth_gbs: float | None = None
    collectives_per_token: float | None = None
    us_per_collective: float | None = None  # one call's price: its kernel when not waiting for a peer + launch gap
    collective_wait_ms_per_token: float | None = None  # kernels' time beyond that: waiting for a late peer
    kernel_sum_ms_per_token: float | None = None  # from a trace: lets LAUNCH use measured idle time
    gpu_busy_pct: float | None = None
    sm_active_pct: float | None = None
    small_grid_share_pct: float | None = None
    hot_small_grids: tuple[tuple[str, int, float], ...] = ()  # (kernel, grid blocks, µs/token), longer calls first
    # of the small grids (collectives aside): how many have calls of SHORT_KERNEL_US or more (hot_small_grids lists
    # those first; None: not told), and the kernels and µs/token of those with shorter calls, held by latency
    small_grids_long: int | None = None
    small_grids_short: tuple[int, float] = (0, 0.0)
    small_grid_collectives: int = 0  # collectives with small grids: left out of the share, COMM prices them
    sm_count: int = 0
    top_kernel: tuple[str, float] | None = None  # (name, µs/token)
    graph_launches_per_token: float | None = None  # ≥ 1: the step is already replayed as CUDA graph(s)
    dram_gbs: float | None = None  # DRAM read + write the counters saw, GB/s: the floor's ratio with no token count
    ranks: int | None = None  # tensor-parallel degree when the engine said it
    untraced: bool = False  # no traced window can come (watched from outside, tracing off): GPU busy prices LAUNCH
    no_gpu: bool = False  # the target runs on the CPU: no GPU ceiling can be priced, ms/token is the figure


@dataclass(frozen=True)
class Diagnosis:
    """The verdict and its receipts."""

    ceiling: str
    candidates: dict
    us_per_launch: float | None
    bandwidth_floor_ms: float | None
    remedy: str
    falsify: str
    predicted_win: str
    serial_fraction: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self) -> dict:
        """The JSON contract shared by `diagnose`, `report`, `attach --json`."""
        out = {
            "ceiling": self.ceiling,
            "candidates": {k: c.as_json() for k, c in self.candidates.items()},
            "remedy": self.remedy,
            "falsify": self.falsify,
            "predicted_win": self.predicted_win,
        }
        if self.us_per_launch is not None:
            out["us_per_launch"] = round(self.us_per_launch, 3)
        if self.bandwidth_floor_ms is not None:
            out["bandwidth_floor_ms"] = round(self.bandwidth_floor_ms, 4)
        if self.serial_fraction is not None:
            out["serial_fraction"] = round(self.serial_fraction, 4)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def bandwidth_floor_ms(bytes_per_token: float, bandwidth_gbs: float) -> float:
    """Bytes ÷ bandwidth: the fastest a memory-bound token can be (ms)."""
    return bytes_per_token / (bandwidth_gbs * 1e9) * 1e3


def serial_fraction(speedup: float, n: int) -> float:
    """Amdahl solved for s: speedup = 1 / (s + (1 - s)/n)  =>  s = (n/speedup - 1)/(n - 1)."""
    if n <= 1:
        raise ValueError("serial fraction needs n > 1")
    if speedup <= 0:
        raise ValueError("speedup must be positive")
    return (n / speedup - 1.0) / (n - 1.0)


def _bandwidth_from_dram(i: Inputs, thr: str) -> Candidate:
    """ms/token ÷ floor = (bytes ÷ achieved) ÷ (bytes ÷ peak) = peak ÷ achieved: the counters' DRAM rate against
    the device's bandwidth prices the floor with no token clock and no model facts."""
    ratio = i.bandwidth_gbs / i.dram_gbs
    state = BINDING if ratio <= BANDWIDTH_BINDING_RATIO else RULED_OUT if ratio >= BANDWIDTH_RULED_OUT_RATIO else UNKNOWN
    return Candidate(ratio, "× floor", thr, state,
                     f"DRAM moved {i.dram_gbs:.4g} GB/s of the device's {i.bandwidth_gbs:.4g} GB/s: the token "
                     f"runs at {ratio:.3g}× its floor (no token count needed)")


def _needs(*figures: tuple[str, object]) -> str:
    """'needs A and B': the figures a candidate is missing, only those not given."""
    missing = [name for name, v in figures if v is None]
    return "needs " + " and ".join(missing) if missing else "needs a figure above zero"


def _bandwidth(i: Inputs) -> tuple[Candidate, float | None]:
    thr = f"≤{BANDWIDTH_BINDING_RATIO:g}× floor binds, ≥{BANDWIDTH_RULED_OUT_RATIO:g}× ruled out"
    if not (i.ms_per_token and i.bytes_per_token and i.bandwidth_gbs):
        if i.dram_gbs and i.bandwidth_gbs:
            return _bandwidth_from_dram(i, thr), None
        return Candidate(None, "× floor", thr, UNKNOWN, _needs(("ms/token", i.ms_per_token),
                                                              ("bytes/token", i.bytes_per_token),
                                                              ("bandwidth", i.bandwidth_gbs))), None
    floor = bandwidth_floor_ms(i.bytes_per_token, i.bandwidth_gbs)
    ratio = i.ms_per_token / floor
    state = BINDING if ratio <= BANDWIDTH_BINDING_RATIO else RULED_OUT if ratio >= BANDWIDTH_RULED_OUT_RATIO else UNKNOWN
    ceiling_tps = 1e3 / floor
    detail = (f"floor {floor:.3g} ms/token ({i.bytes_per_token / 1e9:.3g} GB ÷ {i.bandwidth_gbs:.4g} GB/s, "
              f"a {ceiling_tps:.4g} tok/s ceiling); measured {i.ms_per_token:.4g} ms is {ratio:.3g}× the floor; "
              f"achieved {i.bytes_per_token / (i.ms_per_token * 1e-3) / 1e9:.4g} GB/s")
    return Candidate(ratio, "× floor", thr, state, detail), floor


def _comm(i: Inputs) -> tuple[Candidate, float | None]:
    thr = f"<{COMM_RULED_OUT_PCT:g}% of the step ruled out"
    if i.collectives_per_token is None or i.ms_per_token is None:
        return Candidate(None, "% of step", thr, UNKNOWN, _needs(("ms/token", i.ms_per_token),
                                                                ("collectives/token", i.collectives_per_token),
                                                                ("µs/call", i.us_per_collective))), None
    if i.collectives_per_token == 0:
        why = "one rank (TP=1): nothing to reduce" if i.ranks == 1 else "no collective kernel in the traced windows"
        return Candidate(0.0, "% of step", thr, RULED_OUT, why), 0.0
    if i.us_per_collective is None:
        return Candidate(None, "% of step", thr, UNKNOWN, "needs µs per collective"), None
    comm_ms = i.collectives_per_token * i.us_per_collective / 1e3
    share = 100.0 * comm_ms / i.ms_per_token
    state = RULED_OUT if share < COMM_RULED_OUT_PCT else BINDING
    detail = (f"{i.collectives_per_token:g} calls × {i.us_per_collective:g} µs = {comm_ms:.3g} ms of "
              f"{i.ms_per_token:.4g} ms/token")
    if peer_wait_named(i.collective_wait_ms_per_token, i.ms_per_token):
        detail += (f"; not counted: {i.collective_wait_ms_per_token:.3g} ms/token the kernels waited for a late "
                   "peer (a straggling rank's ceiling, not the link's)")
        if state == BINDING and i.collective_wait_ms_per_token > comm_ms:
            # the calls waited longer than they ran: what is left as a call's own latency is still mostly waiting
            state = UNKNOWN
            detail += ("; unknown: the calls waited longer than they ran, so their own latency is not measured "
                       "here; a window in which the ranks run in step prices it")
    return Candidate(share, "% of step", thr, state, detail), comm_ms


def _priced_by_idle(i: Inputs) -> bool:
    """LAUNCH has no launch count to price and no traced window will come: PM's GPU busy prices it."""
    return bool(i.untraced and i.ms_per_token and i.gpu_busy_pct is not None and not i.launches_per_token)


def _host_idle(i: Inputs) -> Candidate:
    """No traced window, so no launch count (a process watched from outside): PM's GPU busy against the token
    clock still says how much of the token the GPU waits for the host."""
    idle = max(0.0, 100.0 - i.gpu_busy_pct)
    state = BINDING if idle >= 50 else RULED_OUT if idle < 20 else UNKNOWN
    return Candidate(idle, "% of step GPU idle", LAUNCH_IDLE_THRESHOLD, state,
                     f"the GPU is idle {idle:.0f}% of the {i.ms_per_token:.4g} ms token (PM's GPU busy "
                     f"{i.gpu_busy_pct:.0f}%): the host's work between steps; launches per token need a traced window")


GRAPH_BUSY_PCT = 90.0  # a replayed graph on a GPU this busy: the host's launches are not what the step waits for


def _launch(i: Inputs, floor: float | None) -> tuple[Candidate, float | None]:
    """LAUNCH priced by the idle the kernels leave; never binding on a replayed CUDA graph while the GPU is at least
    GRAPH_BUSY_PCT busy (the host launches one graph a step, and the GPU does not wait for it)."""
    c, per = _launch_priced(i, floor)
    if (c.state == BINDING and (i.graph_launches_per_token or 0) >= 1 and i.gpu_busy_pct is not None
            and i.gpu_busy_pct >= GRAPH_BUSY_PCT):
        c = Candidate(c.value, c.unit, c.threshold, RULED_OUT,
                      f"{c.detail}; ruled out: the step is a replayed CUDA graph and the GPU is "
                      f"{i.gpu_busy_pct:.0f}% busy")
    host = _host_between_replays(i, floor)
    if c.state == UNKNOWN and host:
        c = Candidate(c.value, c.unit, c.threshold, BINDING, f"{c.detail}; binds: {host}")
    return c, per


def _host_between_replays(i: Inputs, floor: float | None) -> str:
    """On a replayed CUDA graph, the GPU idle for a larger share of the step than any other candidate could claim
    (the bandwidth floor's share, the small grids' share of the step): the host's work between replays sets the
    token. Why, in words; "" when it does not hold."""
    if not ((i.graph_launches_per_token or 0) >= 1 and i.ms_per_token and i.kernel_sum_ms_per_token is not None):
        return ""
    idle = max(0.0, 1.0 - i.kernel_sum_ms_per_token / i.ms_per_token)
    kernels = min(1.0, i.kernel_sum_ms_per_token / i.ms_per_token)
    others = {"the bandwidth floor": (floor / i.ms_per_token) if floor else 0.0,
              "the small grids": kernels * (i.small_grid_share_pct or 0.0) / 100.0}
    if idle < LAUNCH_IDLE_RULED_OUT or idle <= max(others.values()):
        return ""
    parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in others.items())
    return (f"the GPU is idle {100 * idle:.0f}% of the graphed step, more than any other candidate's share of it "
            f"({parts}): the host's work between replays sets the token, not kernel launches")


def _launch_priced(i: Inputs, floor: float | None) -> tuple[Candidate, float | None]:
    lo, hi = EAGER_LAUNCH_US
    if _priced_by_idle(i):
        return _host_idle(i), None
    if not (i.ms_per_token and i.launches_per_token):
        return Candidate(None, "µs/launch", LAUNCH_IDLE_THRESHOLD, UNKNOWN,
                         _needs(("ms/token", i.ms_per_token), ("launches/token", i.launches_per_token))), None
    n = i.launches_per_token
    if i.kernel_sum_ms_per_token is not None:
        idle = max(i.ms_per_token - i.kernel_sum_ms_per_token, 0.0)
        idle_share = idle / i.ms_per_token
        per = idle * 1e3 / n
        thr = LAUNCH_IDLE_THRESHOLD
        state = BINDING if idle_share >= 0.5 else RULED_OUT if idle_share < 0.2 else UNKNOWN
        graphed = (i.graph_launches_per_token or 0) >= 1
        waited = i.collective_wait_ms_per_token or 0.0
        detail = (f"{idle:.3g} ms/token no kernel explains ({100 * idle_share:.0f}% of the step"
                  + (f", {waited:.3g} ms of it collectives waiting for a late peer"
                     if peer_wait_named(waited, i.ms_per_token) else "") + f") over {n:.0f} kernels = {per:.3g} µs each; "
                  + (f"the step is a replayed CUDA graph: the host launches its {n:.0f} kernels in one graph launch"
                     if graphed else f"eager host launches cost {lo:g}–{hi:g} µs"))
        return Candidate(per, "µs/launch", thr, state, detail), per
    if floor is not None:  # the idle estimated as the step the bandwidth floor leaves unexplained
        gap = max(i.ms_per_token - floor, 0.0)
        per = gap * 1e3 / n
        share = gap / i.ms_per_token
        fits = lo <= per <= hi  # launches at an eager launch's cost could fill that gap
        # an estimate, not a measured idle: more than launches can explain is the host's other work or slow
        # kernels, which only kernel time tells apart, so it leaves LAUNCH unknown, not ruled out
        state = (RULED_OUT if share < LAUNCH_IDLE_RULED_OUT else BINDING if fits and share >= 0.5 else UNKNOWN)
        detail = (f"no kernel time traced: the idle taken as the step over the floor, ({i.ms_per_token:.4g} − "
                  f"{floor:.3g}) ms = {100 * share:.0f}% of the step; ÷ {n:.0f} launches = {per:.3g} µs each, "
                  + (f"within the {lo:g}–{hi:g} µs an eager launch costs" if fits else
                     f"less than the {lo:g} µs an eager launch costs at least: a host launching them one by one "
                     "could not fit them in the step (a replayed graph launches them together), and the kernels' "
                     "time (a traced window) tells slow kernels from the host's other work" if per < lo else
                     f"more than the {hi:g} µs an eager launch costs at most: launches alone do not explain it, "
                     "and the kernels' time (a traced window) tells the host's other work from slow kernels"))
        return Candidate(per, "µs/launch", LAUNCH_IDLE_THRESHOLD, state, detail), per
    # neither kernel time nor a floor: the idle taken as the host's launching at the low end of an eager launch's cost
    per = i.ms_per_token * 1e3 / n
    share = min(1.0, lo / per)
    state = BINDING if share >= 0.5 else RULED_OUT if share < LAUNCH_IDLE_RULED_OUT else UNKNOWN
    detail = (f"no kernel time traced and no floor: {i.ms_per_token:.4g} ms ÷ {n:g} launches = {per:.4g} µs "
              f"available per kernel; at {lo:g} µs a launch (the low end of an eager launch) the host's launching "
              f"leaves the GPU idle {100 * share:.0f}% of the step")
    return Candidate(per, "µs/kernel", LAUNCH_IDLE_THRESHOLD, state, detail), per


def _occupancy_by_counters(i: Inputs, thr: str, bw_ratio: float | None = None) -> Candidate:
    """No grid dims (no traced window): OCCUPANCY priced by PM's SM active against GPU busy alone. Weaker than
    grids (gaps inside a graph count as busy), so it does not bind where the token is near its bandwidth floor."""
    if i.sm_active_pct is None or not i.gpu_busy_pct:
        return Candidate(None, "% kernel time in small grids", thr, UNKNOWN, "needs a traced window (grid dims)")
    ratio = i.sm_active_pct / i.gpu_busy_pct
    detail = (f"SM active {i.sm_active_pct:.0f}% vs GPU busy {i.gpu_busy_pct:.0f}% (PM counters; no traced window, "
              "so no grid dims)")
    if i.gpu_busy_pct < 50:
        state = UNKNOWN
        detail += "; the GPU is idle most of the step, so grids are not yet what binds"
    else:
        state = BINDING if ratio < 0.5 else RULED_OUT if ratio >= 0.8 else UNKNOWN
        if state == BINDING and bw_ratio is not None and bw_ratio <= BANDWIDTH_NEAR_RATIO:
            state = UNKNOWN
            detail += f"; the token is {bw_ratio:.2g}× its bandwidth floor, which the counters alone do not rule out"
    return Candidate(100 * ratio, "% SM active of GPU busy", thr, state, detail)


def _hot_small_grids(i: Inputs) -> str:
    """The small grids widening could speed up, named as the kernel table names them, and what the list leaves out
    and why: kernels of calls under SHORT_KERNEL_US (held by their fixed latency), collectives (COMM's)."""
    listed = i.hot_small_grids[:3] if i.small_grids_long is None else i.hot_small_grids[:min(3, i.small_grids_long)]
    hot = ", ".join(f"{n} grid={g} ({us:.0f} µs/token)" for n, g, us in listed)
    if i.small_grids_long is None:
        return hot
    left = [f"{i.small_grids_long - len(listed)} more kernels of calls ≥{SHORT_KERNEL_US:g} µs"] \
        if i.small_grids_long > len(listed) else []
    n, us = i.small_grids_short
    if n:
        left.append(f"{n} kernel{'s' if n > 1 else ''} of calls under {SHORT_KERNEL_US:g} µs ({us:.0f} µs/token), "
                    "held by their fixed latency, which more blocks do not shorten")
    if i.small_grid_collectives:
        left.append(f"{i.small_grid_collectives} collective{'s' if i.small_grid_collectives > 1 else ''} "
                    "(COMM prices them)")
    return (hot or f"none of calls ≥{SHORT_KERNEL_US:g} µs") + (f"; not listed: {', '.join(left)}" if left else "")


def _occupancy(i: Inputs, bw_ratio: float | None = None) -> Candidate:
    # GPU busy here is the traced kernels' share of the step where a window has them (the screen's OCCUPANCY
    # inputs say so where that share and PM's busy fall on two sides of 50%)
    thr = (f"kernel share ≥50% of the step (traced kernels' time ÷ ms/token; with no traced window, PM's GPU busy) "
           f"and either "
           f"≥{OCCUPANCY_SMALL_SHARE_PCT:g}% of kernel time in grids under 25% of the SMs or SM active < half of "
           "PM's GPU busy binds; < 10% in small grids (SM active ≥ 80% of busy) ruled out")
    if i.small_grid_share_pct is None:
        return _occupancy_by_counters(i, thr, bw_ratio)
    ratio = None
    if i.sm_active_pct is not None and i.gpu_busy_pct:
        ratio = i.sm_active_pct / i.gpu_busy_pct
    busy = i.gpu_busy_pct
    hot = _hot_small_grids(i)
    detail = f"{i.small_grid_share_pct:.0f}% of kernel time in grids < 25% of {i.sm_count or '?'} SMs"
    if ratio is not None:
        detail += f"; SM active {i.sm_active_pct:.0f}% vs GPU busy {busy:.0f}%"
    if hot:
        detail += f"; hot small grids: {hot}"
    # the idle LAUNCH prices (the traced kernels' share of the step) decides here too, where it is known: one
    # diagnosis never reads the GPU as idle for LAUNCH and busy for OCCUPANCY from two instruments
    step_busy = busy
    if i.kernel_sum_ms_per_token is not None and i.ms_per_token:
        step_busy = min(100.0, 100.0 * i.kernel_sum_ms_per_token / i.ms_per_token)
    if step_busy is not None and step_busy < 50:
        where = "" if step_busy == busy else f" (the kernel share is {step_busy:.0f}% of it)"
        return Candidate(i.small_grid_share_pct, "% kernel time in small grids", thr, UNKNOWN,
                         detail + f"; the GPU is idle most of the step{where}, so grids are not yet what binds")
    small = i.small_grid_share_pct >= OCCUPANCY_SMALL_SHARE_PCT
    if (busy is not None and not small and ratio is not None and ratio < 0.5 and bw_ratio is not None
            and bw_ratio <= BANDWIDTH_NEAR_RATIO):
        # SM active alone, near the bandwidth floor: a bandwidth-bound step leaves SMs stalled on memory too, so
        # the counters do not tell the two apart (as where there are no grids: _occupancy_by_counters)
        return Candidate(i.small_grid_share_pct, "% kernel time in small grids", thr, UNKNOWN,
                         detail + f"; SM active under half of GPU busy, but the token is {bw_ratio:.2g}× its "
                                  "bandwidth floor, which SM active alone does not rule out")
    if busy is not None and (small or (ratio is not None and ratio < 0.5)):
        state = BINDING
    elif i.small_grid_share_pct < 10 and (ratio is None or ratio >= 0.8):
        state = RULED_OUT
    else:
        state = UNKNOWN
    return Candidate(i.small_grid_share_pct, "% kernel time in small grids", thr, state, detail)


PEER_WAIT_NAMED_SHARE = 0.01  # a collective's wait for a late peer is named where it is this share of the step


def peer_wait_named(wait_ms: float | None, step_ms: float | None) -> bool:
    """Whether collectives' wait for a late peer is enough of the step to name beside the figure it changes."""
    return bool(wait_ms and step_ms and wait_ms >= PEER_WAIT_NAMED_SHARE * step_ms)


def own_kernel_ms(kernel_ms: float | None, wait_ms: float | None) -> float | None:
    """The traced kernels' ms a token less the collectives' wait for a late peer: the GPU's own work, as the
    diagnosis counts it (a collective spinning while it waits is the step's idle)."""
    return None if kernel_ms is None else kernel_ms - min(wait_ms or 0.0, kernel_ms)


def verdict(candidates: dict) -> str:
    """The one headline rule: the first of ORDER whose candidate reads "binding", else "unknown". The app,
    `--json`, `report`, `diagnose`, the exporter and the recordings all take their verdict from here."""
    return next((k for k in ORDER if k in candidates and candidates[k].state == BINDING), "unknown")


def diagnose(i: Inputs, speedup: float | None = None, n: int | None = None) -> Diagnosis:
    """Number every candidate, pick the binding ceiling, say how to fix it and how to prove it wrong."""
    if i.kernel_sum_ms_per_token is not None and i.collective_wait_ms_per_token:
        # a collective kernel spinning while it waits for a late peer is not this rank's work: that time is the
        # step's idle for LAUNCH and OCCUPANCY (COMM's detail says it, as a straggling rank's ceiling)
        i = replace(i, kernel_sum_ms_per_token=own_kernel_ms(i.kernel_sum_ms_per_token, i.collective_wait_ms_per_token))
    bw, floor = _bandwidth(i)
    comm, comm_ms = _comm(i)
    launch, per_launch = _launch(i, floor)
    occ = _occupancy(i, bw.value)
    if launch.state == BINDING and occ.state == BINDING and _host_between_replays(i, floor):
        # LAUNCH bound by weighing the idle between replays against the small grids' share of the step: the
        # grids lost that comparison, so they are not what binds
        occ = Candidate(occ.value, occ.unit, occ.threshold, UNKNOWN,
                        f"{occ.detail}; not what binds: the GPU's idle between replays is more of the step than the "
                        "small grids' share (LAUNCH)")
    cands = {"bandwidth": bw, "comm": comm, "launch": launch, "occupancy": occ}
    if i.no_gpu:  # nothing a GPU would measure is asked for where there is none
        cands = {k: c if c.value is not None else replace(c, detail="not priced: the target has no GPU")
                 for k, c in cands.items()}
    if verdict(cands) == "unknown":
        cands = _kernels_are_the_cost(i, cands)
    ceiling = verdict(cands)
    priced = tuple(k.upper() for k in ORDER if cands[k].value is not None)
    remedy, falsify, win = _advice(ceiling, i, floor, comm_ms, launch, priced, _missing(i, cands))
    sf = serial_fraction(speedup, n) if (speedup and n and n > 1) else None
    return Diagnosis(ceiling=ceiling, candidates=cands, us_per_launch=per_launch, bandwidth_floor_ms=floor,
                     remedy=remedy, falsify=falsify, predicted_win=win, serial_fraction=sf)


def _kernels_fill_step(i: Inputs, launch: Candidate) -> bool:
    """The kernels' sum is most of the step (or, with no trace, a launch's share of it is ruled out)."""
    fills = (i.kernel_sum_ms_per_token is not None and bool(i.ms_per_token)
             and i.kernel_sum_ms_per_token / i.ms_per_token >= KERNELS_FILL_STEP)
    return fills or (i.kernel_sum_ms_per_token is None and launch.state == RULED_OUT)


def _kernels_are_the_cost(i: Inputs, cands: dict) -> dict:
    """No candidate binds outright but the kernels fill the step: "the kernels are the cost" resolved by the
    counters, as a candidate that binds with the reason in its detail: with a quarter of the kernel time in small
    grids, or SM active under half of GPU busy, OCCUPANCY binds. BANDWIDTH is not stretched past the seeds' 2x: a
    step 2-3x its floor stays "unknown", its BANDWIDTH detail saying what else was measured."""
    bw, occ = cands["bandwidth"], cands["occupancy"]
    if not _kernels_fill_step(i, cands["launch"]):
        return cands
    ratio = bw.value
    sm_ratio = (i.sm_active_pct / i.gpu_busy_pct) if (i.sm_active_pct is not None and i.gpu_busy_pct) else None
    # SM active alone, near the floor, does not tell grids from memory (SMs stall on memory in both)
    leaning_occ = ((i.small_grid_share_pct is not None and i.small_grid_share_pct >= OCCUPANCY_LEANING_SHARE_PCT)
                   or (sm_ratio is not None and sm_ratio < 0.5 and (ratio is None or ratio > BANDWIDTH_NEAR_RATIO)))
    fill = ("the kernels fill the step" if i.kernel_sum_ms_per_token is not None
            else "a launch's share of the step is ruled out")
    if leaning_occ and occ.state != RULED_OUT and (ratio is None or ratio < BANDWIDTH_RULED_OUT_RATIO * 10):
        lean = (f"{i.small_grid_share_pct:.0f}% of kernel time in small grids (≥{OCCUPANCY_LEANING_SHARE_PCT:g}%)"
                if i.small_grid_share_pct is not None and i.small_grid_share_pct >= OCCUPANCY_LEANING_SHARE_PCT
                else f"SM active {100 * sm_ratio:.0f}% of GPU busy (< 50%)")
        why = f"binds: {fill}, {lean}" + (f", at {ratio:.3g}× the floor" if ratio is not None else "")
        return {**cands, "occupancy": Candidate(occ.value, occ.unit, occ.threshold, BINDING,
                                                f"{occ.detail}; {why}".lstrip("; "))}
    return cands


def _missing(i: Inputs, cands: dict) -> str:
    """With no candidate binding: the one measurement that would decide, in words ("" when one binds)."""
    if verdict(cands) != "unknown":
        return ""
    if i.untraced and i.gpu_busy_pct is None and i.dram_gbs is None:
        return "the PM counters (GPU busy, DRAM; no window can be traced here)"
    if i.ms_per_token is None:
        return "a token clock (ms/token)"
    if cands["bandwidth"].value is None and not i.bytes_per_token:
        return "bytes per token (PM's DRAM counters, or the model's facts)"
    if cands["bandwidth"].value is None and not i.bandwidth_gbs:
        return "the device's bandwidth (a GPU: its measured copy, or NVML's peak)"
    if _kernels_fill_step(i, cands["launch"]) and i.small_grid_share_pct is None:
        return "the grids (a traced window)"
    if i.launches_per_token is None and not i.untraced:
        return "launches per token (a traced window)"
    if i.kernel_sum_ms_per_token is None and cands["launch"].state == UNKNOWN and not i.untraced:
        return "the kernels' time per token (a traced window)"
    return ""


def _kernels_slow_off_the_floor(i: Inputs, ratio: float) -> tuple[str, str, str]:
    """Everything measured, the kernels fill the step, and none binds: the token is more than 2x its floor, its
    grids are not small and it is not launched from the host. What was measured, and what would decide."""
    dram = (f", DRAM at {100 * i.dram_gbs / i.bandwidth_gbs:.0f}% of {i.bandwidth_gbs:.0f} GB/s"
            if i.dram_gbs and i.bandwidth_gbs else "")
    grids = (f", {i.small_grid_share_pct:.0f}% of kernel time in small grids" if i.small_grid_share_pct is not None
             else "")
    sm = f", SM active {i.sm_active_pct:.0f}%" if i.sm_active_pct is not None else ""
    top = i.top_kernel
    hot = f"{top[0]} ({top[1]:.0f} µs/token)" if top else "the hottest kernel"
    return (f"none of the four binds: the kernels fill the step at {ratio:.3g}× the bandwidth floor{dram}{grids}{sm}; "
            f"past the seeds' {BANDWIDTH_BINDING_RATIO:g}× the bytes do not set the time, and the grids do not either: "
            "the kernels themselves read memory below the device's rate",
            f"Time {hot} alone at this step's shapes: if it reads memory near the device's bandwidth there, the "
            "step's own mix holds it back (order, sizes, sync); if it does not, the kernel is the fix (a faster "
            "kernel, or another quantization).",
            "n/a: no ceiling claimed")


NO_GPU_REMEDY = ("none to measure on the GPU: the target runs on the CPU, so ms/token is the figure; a kernel, launch "
                 "or bandwidth ceiling needs a GPU")
NO_GPU_FALSIFY = ("No ceiling is claimed: the target has no GPU, so bandwidth, launches and grids are not priced here; "
                  "run the same loop on a GPU to price them.")


def _advice(ceiling: str, i: Inputs, floor: float | None, comm_ms: float | None,
            launch: Candidate, priced: tuple[str, ...] = (), missing: str = "") -> tuple[str, str, str]:
    ms = i.ms_per_token or 0.0
    if i.no_gpu and ceiling == "unknown":
        return NO_GPU_REMEDY, NO_GPU_FALSIFY, ""
    if ceiling == "launch" and _priced_by_idle(i):
        busy_ms = ms * i.gpu_busy_pct / 100
        return ("the host's work per step binds (sampling, detokenizing, serving, launches): move it off the "
                "critical path or onto the device; a traced window would say how much of it is launches",
                f"Cut the host's work per step: if ms/token does not fall from {ms:.3g} toward {busy_ms:.3g} ms "
                "(the GPU's busy time), the host was not what bound the token.",
                f"no host work between steps: {ms:.3g} → ~{busy_ms:.3g} ms/token")
    if ceiling == "launch" and (i.graph_launches_per_token or 0) >= 1:
        target = i.kernel_sum_ms_per_token if i.kernel_sum_ms_per_token is not None else floor
        tgt = f"{target:.3g} ms" if target else "the kernel time"
        return ("the step is already a CUDA graph: the host's work between replays binds (sampling, stop checks, "
                "cache and position bookkeeping, Python per token): keep it on the device, check stops every N "
                "tokens, or run the host ahead of the GPU",
                f"Cut the host's work between replays: if ms/token does not fall from {ms:.3g} toward {tgt}, "
                "the host was not what bound the token.",
                f"no host work between replays: {ms:.3g} → ~{tgt}/token")
    if ceiling == "launch":
        target = i.kernel_sum_ms_per_token if i.kernel_sum_ms_per_token is not None else floor
        tgt = f"{target:.3g} ms" if target else "the kernel time"
        return ("fuse kernels, capture the step as a CUDA graph, make the step device-resident",
                f"Replay the same step as a CUDA graph: if ms/token does not fall from {ms:.3g} toward {tgt}, "
                "the gaps were not launch overhead.",
                f"graph capture: {ms:.3g} → ~{tgt}/token" + (f" ({100 * (1 - target / ms):.0f}% less)" if target and ms else ""))
    if ceiling == "bandwidth" and not ms:  # priced by the DRAM counters alone: no token clock to halve
        return ("read fewer bytes per step: quantize weights, compress or shrink the KV cache",
                "Halve the bytes each step reads: the program's own rate should nearly double while DRAM stays near "
                f"{i.dram_gbs or 0:.4g} GB/s; if it does not, bandwidth was not the binding ceiling.",
                "halving the bytes a step reads halves the step")
    if ceiling == "bandwidth":
        return ("read fewer bytes per token: quantize weights, compress or shrink the KV cache",
                f"Halve the bytes read per token (e.g. 8-bit weights): ms/token should fall close to half of "
                f"{ms:.3g}; if it does not, bandwidth was not the binding ceiling.",
                f"halving bytes/token: {ms:.3g} → ~{ms / 2:.3g} ms/token" if ms else "halving bytes/token halves the token")
    if ceiling == "occupancy":
        hot = i.hot_small_grids[0] if i.hot_small_grids else None
        if hot:
            name, grid, us = hot
            cov = min(grid, i.sm_count or grid) / max(i.sm_count or grid, 1)
            save = us * (1 - cov) / 1e3
            return ("reshape grids: split over another axis (context, value tiles, split-K), widen blocks; fuse the "
                    f"small grids of a few µs a call (under {SHORT_KERNEL_US:g} µs, more blocks do not shorten them)",
                    f"Widen {name} from {grid} blocks to ≥{i.sm_count or 'SM count'}: if its µs/token "
                    f"({us:.0f}) does not fall, it was not occupancy-bound.",
                    f"up to {save:.3g} ms/token from {name} alone ({us:.0f} µs at {100 * cov:.0f}% of the SMs)")
        return ("reshape grids: split over another axis, widen blocks",
                "Widen the hottest small grid to the SM count: if its time does not fall, it was not occupancy.",
                "unknown without a traced window")
    if ceiling == "comm":
        c = comm_ms or 0.0
        return ("change the collective: fewer calls, a different algorithm or payload, or move the reduce",
                "Microbenchmark one all-reduce at 1×, 8× and 64× the payload: if µs/call scales with bytes "
                "it is bandwidth, if it barely moves the target is the call count; if the share of the step "
                "is under 10% when measured alone, COMM was wrong.",
                f"halving calls/token saves ~{c / 2:.3g} ms/token")
    if missing and _kernels_fill_step(i, launch):
        top = i.top_kernel
        t = f" ({top[0]}, {top[1]:.0f} µs/token)" if top else ""
        far = bool(floor) and ms / floor > BANDWIDTH_NEAR_RATIO  # too far above the floor for BANDWIDTH
        return (f"the kernels fill the step{t} and no ceiling binds at these numbers: measure {missing} to say "
                + ("whether grids bind (the floor is too far below the token for bytes to)" if far else
                   "whether bytes or grids bind"),
                (f"Measure {missing}: with small grids or SM active far below GPU busy it is OCCUPANCY (the token "
                 f"is {floor and ms / floor:.3g}× its bandwidth floor, too far for BANDWIDTH)."
                 if floor and ms / floor > BANDWIDTH_NEAR_RATIO else
                 f"Measure {missing}: with small grids or SM active far below GPU busy it is OCCUPANCY; BANDWIDTH "
                 f"binds only within {BANDWIDTH_BINDING_RATIO:g}× of bytes ÷ bandwidth."),
                f"n/a: first measure {missing}")
    if missing:
        return (f"measure {missing}",
                (f"Nothing binds at these numbers ({', '.join(priced)} priced, none binding): {missing} "
                 "decides, not a fix." if priced else "n/a until a candidate has a number"), "n/a")
    if floor and ms and _kernels_fill_step(i, launch):
        return _kernels_slow_off_the_floor(i, ms / floor)
    return ("measure more: " + ("the PM counters (GPU busy, DRAM): no window can be traced here"
                                if i.untraced else "a traced window, or ms/token with launches/token and bytes/token"),
            (f"Nothing binds at these numbers ({', '.join(priced)} priced, none binding): the next "
             "measurement decides, not a fix." if priced else "n/a until a candidate has a number"), "n/a")


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
