"""The four ceilings, each priced with a number, a unit, a threshold and a state (the method's diagnostic sequence).

Cheapest first: BANDWIDTH (arithmetic), COMM (collective share), LAUNCH (the launch bill), OCCUPANCY (grids
against SMs). Each `price_*` reads what is known about one token (`Inputs`) and returns its `Candidate`;
`diagnosis.py` picks the verdict from them and `advice.py` words the remedy. Pure: frozen values in and out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from decodemon.monitor.numbers import bandwidth_short, said, said_pct

BINDING, RULED_OUT, UNKNOWN = "binding", "ruled_out", "unknown"
ORDER = ("bandwidth", "comm", "launch", "occupancy")

# §3 / second seed §11.2: what one launch costs the host (at 5 µs a launch, under ~10 µs available per kernel is
# launch-bound: §7 step 3).
EAGER_LAUNCH_US = (5.0, 20.0)
BANDWIDTH_BINDING_RATIO = 2.0
BANDWIDTH_RULED_OUT_RATIO = 10.0
COMM_RULED_OUT_PCT = 10.0
OCCUPANCY_SMALL_SHARE_PCT = 50.0
# near the floor the counters cannot tell bandwidth from occupancy (SMs stall on memory in both); with the kernels
# filling the step and nothing binding outright, OCCUPANCY: a quarter of kernel time in small grids, or SM active < half
# of GPU busy
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


# what a candidate's `value` is, one name a quantity (QUANTITIES): a ceiling priced two ways holds two quantities,
# and the JSON names which, so two runs' values are compared only where the quantity is one
QUANTITIES = {
    "ms_per_token_over_floor": "ms/token ÷ the bandwidth floor (bytes/token ÷ the device's bandwidth)",
    "bandwidth_over_dram_gbs": "the device's bandwidth ÷ the DRAM GB/s the PM counters saw (no token count)",
    "collective_share_of_step_pct": "collectives' ms a token (calls × µs a call) as a % of ms/token",
    "idle_pct_of_step": "the idle the traced kernels leave in the untraced step (ms/token − the traced kernels' ms a "
                        "token) as a % of ms/token",
    "floor_gap_pct_of_step": "(ms/token − the bandwidth floor) as a % of ms/token: the idle estimated, no kernel "
                             "time traced",
    "launching_pct_of_step": "kernels/token × an eager launch's least cost as a % of ms/token: the idle the host's "
                             "launching leaves, estimated with no kernel time and no floor",
    "gpu_idle_pct_of_step": "100 − PM's GPU busy: the step's idle, no traced window",
    "small_grid_kernel_time_pct": "% of the traced kernels' time in grids under 25% of the SMs",
    "sm_active_pct_of_gpu_busy": "PM's SM active as a % of PM's GPU busy: no traced window, so no grids",
}


@dataclass(frozen=True)
class Candidate:
    """One ceiling's number and what it says; `quantity` names what the number is (a key of QUANTITIES)."""

    value: float | None
    unit: str
    threshold: str
    state: str
    detail: str = ""
    quantity: str | None = None

    def as_json(self) -> dict:
        """The candidate as the JSON contract spells it: `quantity` says which figure `value` holds (null: none
        was priced and none would be, e.g. a candidate decodemon did not price)."""
        v = None if self.value is None else round(float(self.value), 4)
        return {"value": v, "quantity": self.quantity, "unit": self.unit, "threshold": self.threshold,
                "state": self.state, "detail": self.detail}


@dataclass(frozen=True)
class Inputs:
    """Whatever is known about one token; every field optional."""

    ms_per_token: float | None = None
    ms_kind: str = ""  # what ms_per_token is: "median" or "mean" (token_clock.clock_kind); "" given by hand
    kernels_per_token: float | None = None
    bytes_per_token: float | None = None
    bandwidth_gbs: float | None = None
    bandwidth_source: str = ""  # whose bandwidth_gbs is ("NVML peak (...)", "measured copy (...)"): named beside it
    collectives_per_token: float | None = None
    us_per_collective: float | None = None  # one call's price: its kernel when not waiting for a peer + launch gap
    collective_wait_ms_per_token: float | None = None  # kernels' time beyond that: waiting for a late peer
    comm_source: str = ""  # where those three come from (the traced windows, or the engine's clock), in words
    kernel_sum_ms_per_token: float | None = None  # from a trace: each kernel's own time, added
    kernel_busy_ms_per_token: float | None = None  # their union: those that run at once counted once
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
    kernel_launch_calls_per_token: float | None = None  # the host's kernel launch calls (None: not traced)
    # the KV depth the model's bytes were priced at (the span's last token), and the depths the span ran over;
    # None where the bytes are the DRAM counters' (no depth prices them)
    kv_depth: int | None = None
    kv_depth_span: tuple[int, int] | None = None
    dram_gbs: float | None = None  # DRAM read + write the counters saw, GB/s: the floor's ratio with no token count
    ranks: int | None = None  # tensor-parallel degree when the engine said it
    untraced: bool = False  # no traced window can come (watched from outside, tracing off): GPU busy prices LAUNCH
    no_gpu: bool = False  # the target runs on the CPU: no GPU ceiling can be priced, ms/token is the figure

    @property
    def kernel_ms(self) -> float | None:
        """The GPU time a token's traced kernels cover, which the step's idle is taken against: their union where
        given (kernels on two streams at once count once), else their sum (by hand, a sweep's band)."""
        busy = self.kernel_busy_ms_per_token
        return busy if busy is not None else self.kernel_sum_ms_per_token

    @property
    def kernels_overlap_words(self) -> str:
        """" (N ms summed: some run at once)" where the union is 1% or more under the sum, else ""."""
        s, u = self.kernel_sum_ms_per_token, self.kernel_busy_ms_per_token
        return f" ({s:.4g} ms summed: some run at once)" if s is not None and u is not None and s >= 1.01 * u else ""


def bandwidth_floor_ms(bytes_per_token: float, bandwidth_gbs: float) -> float:
    """Bytes ÷ bandwidth: the fastest a memory-bound token can be (ms)."""
    return bytes_per_token / (bandwidth_gbs * 1e9) * 1e3


def _bandwidth_from_dram(i: Inputs, thr: str) -> Candidate:
    """ms/token ÷ floor = peak ÷ achieved: the counters' DRAM rate against the device's bandwidth prices the floor
    with no token clock and no model facts."""
    ratio = i.bandwidth_gbs / i.dram_gbs
    state = BINDING if ratio <= BANDWIDTH_BINDING_RATIO else RULED_OUT if ratio >= BANDWIDTH_RULED_OUT_RATIO else UNKNOWN
    return Candidate(ratio, "× floor", thr, state,
                     f"DRAM moved {i.dram_gbs:.4g} GB/s of the device's {i.bandwidth_gbs:.4g} GB/s: the work "
                     f"runs at {said(ratio)}× its floor (no token count needed)", "bandwidth_over_dram_gbs")


def _needs(*figures: tuple[str, object]) -> str:
    """'needs A and B': the figures a candidate is missing, only those not given."""
    missing = [name for name, v in figures if v is None]
    return "needs " + " and ".join(missing) if missing else "needs a figure above zero"


def price_bandwidth(i: Inputs) -> tuple[Candidate, float | None]:
    thr = f"≤{BANDWIDTH_BINDING_RATIO:g}× floor binds, ≥{BANDWIDTH_RULED_OUT_RATIO:g}× ruled out"
    if not (i.ms_per_token and i.bytes_per_token and i.bandwidth_gbs):
        if i.dram_gbs and i.bandwidth_gbs:
            return _bandwidth_from_dram(i, thr), None
        needs = _needs(("ms/token", i.ms_per_token), ("bytes/token", i.bytes_per_token), ("bandwidth", i.bandwidth_gbs))
        return Candidate(None, "× floor", thr, UNKNOWN, needs, "ms_per_token_over_floor"), None
    floor = bandwidth_floor_ms(i.bytes_per_token, i.bandwidth_gbs)
    ratio = i.ms_per_token / floor
    state = BINDING if ratio <= BANDWIDTH_BINDING_RATIO else RULED_OUT if ratio >= BANDWIDTH_RULED_OUT_RATIO else UNKNOWN
    ceiling_tps = 1e3 / floor
    whose = f", {bandwidth_short(i.bandwidth_source)};" if i.bandwidth_source else ","
    detail = (f"floor {floor:.3g} ms/token ({i.bytes_per_token / 1e9:.3g} GB ÷ {i.bandwidth_gbs:.4g} GB/s{whose} "
              f"a {ceiling_tps:.4g} tok/s ceiling); the token's {i.ms_per_token:.4g} ms is {said(ratio)}× the floor"
              + _rate_words(i) + _depth_words(i))
    return Candidate(ratio, "× floor", thr, state, detail, "ms_per_token_over_floor"), floor


def _rate_words(i: Inputs) -> str:
    """The rate the ratio implies (bytes ÷ the median token), named, beside the rate the DRAM counters read (their
    mean over the span), which differs where the tokens do."""
    rate = i.bytes_per_token / (i.ms_per_token * 1e-3) / 1e9
    kind = f" {i.ms_kind}" if i.ms_kind else ""
    out = f"; {i.bytes_per_token / 1e9:.3g} GB in the {i.ms_per_token:.4g} ms{kind} token is {rate:.4g} GB/s"
    if i.dram_gbs:
        return out + f" (DRAM moved {i.dram_gbs:.4g} GB/s on average, PM's byte counters: dram_gbs)"
    return out + (" (the model's bytes: no DRAM counters)" if i.ms_kind else " (the figures given)")


def _depth_words(i: Inputs) -> str:
    """Which KV depth the model's bytes were priced at, where the model priced them ("" where counters did)."""
    if i.kv_depth is None:
        return ""
    lo, hi = i.kv_depth_span or (i.kv_depth, i.kv_depth)
    if hi == 0:  # a decoded token always has a depth: none was reported (a batch's steps), so no KV is counted
        return "; the model's bytes are its weights alone: no KV depth was reported, so no KV is counted"
    ran = f"; the span ran at depths {lo}–{hi}" if lo != hi else ""
    return f"; the model's bytes priced at KV depth {i.kv_depth}, the last token's{ran}"


def price_comm(i: Inputs) -> tuple[Candidate, float | None]:
    thr = (f"<{COMM_RULED_OUT_PCT:g}% of the step ruled out; more binds unless the GPU's idle or a binding "
           "floor is more of it")
    if i.collectives_per_token is None or i.ms_per_token is None:
        return Candidate(None, "% of step", thr, UNKNOWN, _needs(("ms/token", i.ms_per_token),
                                                                ("collectives/token", i.collectives_per_token),
                                                                ("µs/call", i.us_per_collective)), "collective_share_of_step_pct"), None
    if i.collectives_per_token == 0:
        why = "one rank (TP=1): nothing to reduce" if i.ranks == 1 else "no collective kernel in the traced windows"
        return Candidate(0.0, "% of step", thr, RULED_OUT, why, "collective_share_of_step_pct"), 0.0
    if i.us_per_collective is None:
        return Candidate(None, "% of step", thr, UNKNOWN, "needs µs per collective", "collective_share_of_step_pct"), None
    comm_ms = i.collectives_per_token * i.us_per_collective / 1e3
    share = 100.0 * comm_ms / i.ms_per_token
    state = RULED_OUT if share < COMM_RULED_OUT_PCT else BINDING
    detail = (f"{i.collectives_per_token:g} calls × {i.us_per_collective:g} µs = {comm_ms:.3g} ms of "
              f"{i.ms_per_token:.4g} ms/token" + (f" ({i.comm_source})" if i.comm_source else ""))
    if peer_wait_named(i.collective_wait_ms_per_token, i.ms_per_token):
        detail += (f"; not counted: {i.collective_wait_ms_per_token:.3g} ms/token the kernels waited for a late "
                   "peer (a straggling rank's ceiling, not the link's)")
        if state == BINDING and i.collective_wait_ms_per_token > comm_ms:
            # the calls waited longer than they ran: what is left as a call's own latency is still mostly waiting
            state = UNKNOWN
            detail += ("; unknown: the calls waited longer than they ran, so their own latency is not measured "
                       "here; a window in which the ranks run in step prices it")
    return Candidate(share, "% of step", thr, state, detail, "collective_share_of_step_pct"), comm_ms


def priced_by_idle(i: Inputs) -> bool:
    """LAUNCH has no launch count to price and no traced window will come: PM's GPU busy prices it."""
    return bool(i.untraced and i.ms_per_token and i.gpu_busy_pct is not None and not i.kernels_per_token)


def _host_idle(i: Inputs) -> Candidate:
    """No traced window, so no launch count (a process watched from outside): PM's GPU busy against the token
    clock still says how much of the token the GPU waits for the host."""
    idle = max(0.0, 100.0 - i.gpu_busy_pct)
    state = BINDING if idle > 50 else RULED_OUT if idle < 20 else UNKNOWN
    return Candidate(idle, "% of step GPU idle", LAUNCH_IDLE_THRESHOLD, state,
                     f"the GPU is idle {idle:.0f}% of the {i.ms_per_token:.4g} ms token (PM's GPU busy "
                     f"{i.gpu_busy_pct:.0f}%); PM says how long the GPU idles, not why: the host's work between steps "
                     "and waits inside the step look alike from outside, and a traced window tells them apart",
                     "gpu_idle_pct_of_step")


GRAPH_BUSY_PCT = 90.0  # a replayed graph on a GPU this busy: the host's launches are not what the step waits for
COUNTERS_APART = ("; SM active past GPU busy by {:.1f}% of it: two counters sampled apart, which cannot both hold over "
                  "the same cycles; read as every SM active while the GPU ran")


def price_launch(i: Inputs, floor: float | None) -> tuple[Candidate, float | None]:
    """LAUNCH priced by the idle the kernels leave; never binding on a replayed CUDA graph while the GPU is at least
    GRAPH_BUSY_PCT busy (the host launches one graph a step, and the GPU does not wait for it)."""
    c, per = _launch_priced(i, floor)
    if (c.state == BINDING and (i.graph_launches_per_token or 0) >= 1 and i.gpu_busy_pct is not None
            and i.gpu_busy_pct >= GRAPH_BUSY_PCT):
        c = replace(c, state=RULED_OUT, detail=f"{c.detail}; ruled out: the step is a replayed CUDA graph and the "
                                               f"GPU is {i.gpu_busy_pct:.0f}% busy")
    host = host_between_replays(i, floor)
    if c.state == UNKNOWN and host:
        c = replace(c, state=BINDING, detail=f"{c.detail}; binds: {host}")
    return c, per


def host_between_replays(i: Inputs, floor: float | None) -> str:
    """On a replayed CUDA graph, the GPU idle for a larger share of the step than any other candidate could claim
    (the bandwidth floor's share, the small grids' share of the step): the host's work between replays sets the
    token. Why, in words; "" when it does not hold."""
    if not ((i.graph_launches_per_token or 0) >= 1 and i.ms_per_token and i.kernel_ms is not None):
        return ""
    idle = max(0.0, 1.0 - i.kernel_ms / i.ms_per_token)
    kernels = min(1.0, i.kernel_ms / i.ms_per_token)
    others = {"the bandwidth floor": (floor / i.ms_per_token) if floor else 0.0,
              "the small grids": kernels * (i.small_grid_share_pct or 0.0) / 100.0}
    if idle < LAUNCH_IDLE_RULED_OUT or idle <= max(others.values()):
        return ""
    parts = ", ".join(f"{k} {100 * v:.0f}%" for k, v in others.items())
    return (f"the GPU is idle {100 * idle:.0f}% of the graphed step, more than any other candidate's share of it "
            f"({parts}): the host's work between replays sets the token, not kernel launches")


def _launches_counted(i: Inputs) -> str:
    """What the host launched a token for its kernels: kernel launch calls (where traced) and graph launches."""
    g = i.graph_launches_per_token or 0.0
    graphs = f"{g:g} graph launch{'es' if g != 1 else ''}"
    if i.kernel_launch_calls_per_token is None:
        return f"{graphs} a token for {i.kernels_per_token:.0f} kernels (kernel launch calls not traced)"
    calls = i.kernel_launch_calls_per_token
    return (f"{calls:.0f} kernel launch call{'s' if round(calls) != 1 else ''} and {graphs} a token for "
            f"{i.kernels_per_token:.0f} kernels")


def _launch_priced(i: Inputs, floor: float | None) -> tuple[Candidate, float | None]:
    lo, hi = EAGER_LAUNCH_US
    if priced_by_idle(i):
        return _host_idle(i), None
    if not (i.ms_per_token and i.kernels_per_token):
        return Candidate(None, "% of step GPU idle", LAUNCH_IDLE_THRESHOLD, UNKNOWN,
                         _needs(("ms/token", i.ms_per_token), ("kernels/token", i.kernels_per_token)),
                         "idle_pct_of_step"), None
    n = i.kernels_per_token
    if i.kernel_ms is not None:
        idle = max(i.ms_per_token - i.kernel_ms, 0.0)
        idle_share = idle / i.ms_per_token
        per = idle * 1e3 / n
        thr = LAUNCH_IDLE_THRESHOLD
        state = BINDING if idle_share > 0.5 else RULED_OUT if idle_share < 0.2 else UNKNOWN
        graphed = (i.graph_launches_per_token or 0) >= 1
        waited = i.collective_wait_ms_per_token or 0.0
        detail = (f"{idle:.3g} ms/token no kernel explains ({said_pct(100 * idle_share)}% of the step: {i.ms_per_token:.4g} "
                  f"− {i.kernel_ms:.4g} ms of kernels{i.kernels_overlap_words}"
                  + (", taken as 0: the traced kernels run longer than the untraced step"
                     if i.kernel_ms > i.ms_per_token else "")
                  + (f"; the kernels' own time, their {waited:.3g} ms waiting for a late peer left out"
                     if peer_wait_named(waited, i.ms_per_token) else "") + f") over {n:.0f} kernels = {per:.3g} µs each; "
                  + (f"the step is a replayed CUDA graph: {_launches_counted(i)}"
                     if graphed else f"eager host launches cost {lo:g}–{hi:g} µs"))
        return Candidate(100 * idle_share, "% of step GPU idle", thr, state, detail, "idle_pct_of_step"), per
    if floor is not None:  # the idle estimated as the step the bandwidth floor leaves unexplained
        gap = max(i.ms_per_token - floor, 0.0)
        per = gap * 1e3 / n
        share = gap / i.ms_per_token
        fits = lo <= per <= hi  # launches at an eager launch's cost could fill that gap
        # an estimate, not a measured idle: more than launches can explain is the host's other work or slow
        # kernels, which only kernel time tells apart, so it leaves LAUNCH unknown, not ruled out
        state = (RULED_OUT if share < LAUNCH_IDLE_RULED_OUT else BINDING if fits and share > 0.5 else UNKNOWN)
        detail = (f"no kernel time traced: the idle taken as the step over the floor, ({i.ms_per_token:.4g} − "
                  f"{floor:.3g}) ms = {said_pct(100 * share)}% of the step; ÷ {n:.0f} kernels = {per:.3g} µs each, "
                  + (f"within the {lo:g}–{hi:g} µs an eager launch costs" if fits else
                     f"less than the {lo:g} µs an eager launch costs at least: a host launching them one by one "
                     "could not fit them in the step (a replayed graph launches them together), and the kernels' "
                     "time (a traced window) tells slow kernels from the host's other work" if per < lo else
                     f"more than the {hi:g} µs an eager launch costs at most: launches alone do not explain it, "
                     "and the kernels' time (a traced window) tells the host's other work from slow kernels"))
        return Candidate(100 * share, "% of step GPU idle (est.)", LAUNCH_IDLE_THRESHOLD, state, detail,
                         "floor_gap_pct_of_step"), per
    # neither kernel time nor a floor: the idle taken as the host's launching at the low end of an eager launch's cost
    per = i.ms_per_token * 1e3 / n
    share, most = min(1.0, lo / per), min(1.0, hi / per)
    # binding only where even the cheapest launch fills half the step; ruled out only where the dearest cannot
    state = BINDING if share > 0.5 else RULED_OUT if most < LAUNCH_IDLE_RULED_OUT else UNKNOWN
    detail = (f"no kernel time traced and no floor: {i.ms_per_token:.4g} ms ÷ {n:g} kernels = {per:.4g} µs "
              f"available per kernel; at {lo:g}–{hi:g} µs a launch (an eager launch's cost) the host's launching "
              f"leaves the GPU idle {said_pct(100 * share)}–{said_pct(100 * most)}% of the step"
              + ("; unknown: the kernels' time (a traced window) says where in that range it is"
                 if state == UNKNOWN else ""))
    return Candidate(100 * share, "% of step GPU idle (est.)", LAUNCH_IDLE_THRESHOLD, state, detail,
                     "launching_pct_of_step"), per


def _occupancy_by_counters(i: Inputs, thr: str, bw_ratio: float | None = None) -> Candidate:
    """No grid dims (no traced window): OCCUPANCY priced by PM's SM active against GPU busy alone. Weaker than
    grids (gaps inside a graph count as busy), so it does not bind where the token is near its bandwidth floor."""
    if i.sm_active_pct is None or not i.gpu_busy_pct:
        return Candidate(None, "% kernel time in small grids", thr, UNKNOWN, "needs a traced window (grid dims)",
                         "small_grid_kernel_time_pct")
    ratio = i.sm_active_pct / i.gpu_busy_pct
    detail = (f"SM active {i.sm_active_pct:.0f}% vs GPU busy {i.gpu_busy_pct:.0f}% (PM counters; no traced window, "
              "so no grid dims)" + (COUNTERS_APART.format(100 * (ratio - 1)) if ratio > 1 else ""))
    if i.gpu_busy_pct < 50:
        state = UNKNOWN
        detail += "; the GPU is idle most of the step, so grids are not yet what binds"
    else:
        state = BINDING if ratio < 0.5 else RULED_OUT if ratio >= 0.8 else UNKNOWN
        if state == BINDING and bw_ratio is not None and bw_ratio <= BANDWIDTH_NEAR_RATIO:
            state = UNKNOWN
            detail += f"; the token is {bw_ratio:.2g}× its bandwidth floor, which the counters alone do not rule out"
    return Candidate(100 * ratio, "% SM active of GPU busy", thr, state, detail, "sm_active_pct_of_gpu_busy")


def _short_part(i: Inputs) -> str:
    """How much of the small grids' time is in calls under SHORT_KERNEL_US, which widening does not shorten (fusing
    does): "" where there are none or no kernel time to hold them against."""
    n, us = i.small_grids_short
    if not (n and us and i.kernel_sum_ms_per_token):
        return ""
    pct = min(100.0, us / (10 * i.kernel_sum_ms_per_token))  # µs against ms: a share in %
    return f" ({pct:.0f}% of kernel time in calls under {SHORT_KERNEL_US:g} µs, which fusing shortens, not widening)"


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


def price_occupancy(i: Inputs, bw_ratio: float | None = None) -> Candidate:
    # GPU busy here is the traced kernels' share of the step where a window has them (the screen's OCCUPANCY
    # inputs say so where that share and PM's busy fall on two sides of 50%)
    thr = (f"kernel share ≥50% of the step (traced kernels' time ÷ ms/token; with no traced window, PM's GPU busy) "
           f"and either ≥{OCCUPANCY_SMALL_SHARE_PCT:g}% of kernel time in grids under 25% of the SMs or SM active < half of "
           f"PM's GPU busy binds; where the kernels fill the step and no ceiling binds, ≥{OCCUPANCY_LEANING_SHARE_PCT:g}% "
           "in small grids binds too; < 10% in small grids (SM active ≥ 80% of busy) ruled out")
    if i.small_grid_share_pct is None:
        return _occupancy_by_counters(i, thr, bw_ratio)
    ratio = None
    if i.sm_active_pct is not None and i.gpu_busy_pct:
        ratio = i.sm_active_pct / i.gpu_busy_pct
    busy = i.gpu_busy_pct
    hot = _hot_small_grids(i)
    detail = f"{i.small_grid_share_pct:.0f}% of kernel time in grids < 25% of {i.sm_count or '?'} SMs" + _short_part(i)
    if ratio is not None:
        detail += f"; SM active {i.sm_active_pct:.0f}% vs GPU busy {busy:.0f}%"
    if hot:
        detail += f"; hot small grids: {hot}"
    # the idle LAUNCH prices (the traced kernels' share of the step) decides here too, where it is known: one
    # diagnosis never reads the GPU as idle for LAUNCH and busy for OCCUPANCY from two instruments
    step_busy = busy
    if i.kernel_ms is not None and i.ms_per_token:
        step_busy = min(100.0, 100.0 * i.kernel_ms / i.ms_per_token)
    if step_busy is not None and step_busy < 50:
        where = "" if step_busy == busy else f" (the kernel share is {step_busy:.0f}% of it)"
        return Candidate(i.small_grid_share_pct, "% kernel time in small grids", thr, UNKNOWN,
                         detail + f"; the GPU is idle most of the step{where}, so grids are not yet what binds", "small_grid_kernel_time_pct")
    small = i.small_grid_share_pct >= OCCUPANCY_SMALL_SHARE_PCT
    if (busy is not None and not small and ratio is not None and ratio < 0.5 and bw_ratio is not None
            and bw_ratio <= BANDWIDTH_NEAR_RATIO):
        # SM active alone, near the bandwidth floor: a bandwidth-bound step leaves SMs stalled on memory too, so
        # the counters do not tell the two apart (as where there are no grids: _occupancy_by_counters)
        return Candidate(i.small_grid_share_pct, "% kernel time in small grids", thr, UNKNOWN,
                         detail + f"; SM active under half of GPU busy, but the token is {bw_ratio:.2g}× its "
                                  "bandwidth floor, which SM active alone does not rule out", "small_grid_kernel_time_pct")
    if busy is not None and (small or (ratio is not None and ratio < 0.5)):
        state = BINDING
    elif i.small_grid_share_pct < 10 and (ratio is None or ratio >= 0.8):
        state = RULED_OUT
    else:
        state = UNKNOWN
    return Candidate(i.small_grid_share_pct, "% kernel time in small grids", thr, state, detail, "small_grid_kernel_time_pct")


PEER_WAIT_NAMED_SHARE = 0.01  # a collective's wait for a late peer is named where it is this share of the step


def peer_wait_named(wait_ms: float | None, step_ms: float | None) -> bool:
    """Whether collectives' wait for a late peer is enough of the step to name beside the figure it changes."""
    return bool(wait_ms and step_ms and wait_ms >= PEER_WAIT_NAMED_SHARE * step_ms)


def own_kernel_ms(kernel_ms: float | None, wait_ms: float | None) -> float | None:
    """The traced kernels' ms a token less the collectives' wait for a late peer (a spinning wait is idle)."""
    return None if kernel_ms is None else kernel_ms - min(wait_ms or 0.0, kernel_ms)


def kernels_fill_step(i: Inputs, launch: Candidate) -> bool:
    """The kernels' sum is most of the step (or, with no trace, a launch's share of it is ruled out)."""
    fills = (i.kernel_ms is not None and bool(i.ms_per_token) and i.kernel_ms / i.ms_per_token >= KERNELS_FILL_STEP)
    return fills or (i.kernel_ms is None and launch.state == RULED_OUT)

