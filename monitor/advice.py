"""What to do about a verdict: the remedy family, the one measurement that would prove it wrong, and the win
it predicts, in words, from the figures the candidates were priced on.

Pure: frozen values in, strings out.
"""

from __future__ import annotations

from decodemon.monitor.ceilings import (BANDWIDTH_BINDING_RATIO, BANDWIDTH_NEAR_RATIO, OCCUPANCY_LEANING_SHARE_PCT,
                                        SHORT_KERNEL_US, Candidate, Inputs, kernels_fill_step, priced_by_idle)


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
NO_CLOCK_REMEDY = ("none to measure on the GPU: the target runs on the CPU and no token was timed; an engine adapter, "
                   "mark_token() or --token-range NAME gives it a clock, and then ms/token is the figure")
NO_GPU_FALSIFY = ("No ceiling is claimed: the target has no GPU, so bandwidth, launches and grids are not priced here; "
                  "run the same loop on a GPU to price them.")


def advice(ceiling: str, i: Inputs, floor: float | None, comm_ms: float | None,
           launch: Candidate, priced: tuple[str, ...] = (), missing: str = "") -> tuple[str, str, str]:
    """(remedy, falsifier, predicted win) for `ceiling`; with none binding, what to measure next (`missing`: the
    one measurement that would decide, `priced`: the candidates that have a number)."""
    ms = i.ms_per_token or 0.0
    if i.no_gpu and ceiling == "unknown":
        return (NO_GPU_REMEDY if i.ms_per_token else NO_CLOCK_REMEDY), NO_GPU_FALSIFY, ""
    if ceiling == "launch":
        return _launch_advice(i, floor, ms)
    if ceiling == "bandwidth":
        return _bandwidth_advice(i, ms, floor)
    if ceiling == "occupancy":
        return _occupancy_advice(i)
    if ceiling == "comm":
        return _comm_advice(comm_ms)
    return _open_advice(i, floor, ms, launch, priced, missing)


def _launch_advice(i: Inputs, floor: float | None, ms: float) -> tuple[str, str, str]:
    """LAUNCH: the host's work per step (no traced window), between replays (a CUDA graph), or eager launches."""
    if priced_by_idle(i):
        busy_ms = ms * i.gpu_busy_pct / 100
        return ("the host's work per step binds (sampling, detokenizing, serving, launches): move it off the "
                "critical path or onto the device; a traced window would say how much of it is launches",
                f"Cut the host's work per step: if ms/token does not fall from {ms:.3g} toward {busy_ms:.3g} ms "
                "(the GPU's busy time), the host was not what bound the token.",
                f"no host work between steps: {ms:.3g} → ~{busy_ms:.3g} ms/token")
    target = i.kernel_ms if i.kernel_ms is not None else floor
    tgt = f"{target:.3g} ms" if target else "the kernel time"
    if (i.graph_launches_per_token or 0) >= 1:
        return ("the step is already a CUDA graph: the host's work between replays binds (sampling, stop checks, "
                "cache and position bookkeeping, Python per token): keep it on the device, check stops every N "
                "tokens, or run the host ahead of the GPU",
                f"Cut the host's work between replays: if ms/token does not fall from {ms:.3g} toward {tgt}, "
                "the host was not what bound the token.",
                f"no host work between replays: {ms:.3g} → ~{tgt}/token")
    return ("fuse kernels, capture the step as a CUDA graph, make the step device-resident",
            f"Replay the same step as a CUDA graph: if ms/token does not fall from {ms:.3g} toward {tgt}, "
            "the gaps were not launch overhead.",
            _graph_win(i, ms, target, tgt))


def _graph_win(i: Inputs, ms: float, target: float | None, tgt: str) -> str:
    """The eager step replayed as a graph: toward its kernels' time, or at best toward the bandwidth floor where no
    kernel time was traced (the kernels' own time, unknown, sets where it stops)."""
    less = f" ({100 * (1 - target / ms):.0f}% less)" if target and ms else ""
    if i.kernel_ms is None and target:
        return (f"graph capture: {ms:.3g} → at best ~{tgt}/token{less}, the bandwidth floor: the kernels' own time "
                "(not traced) sets where it stops")
    return f"graph capture: {ms:.3g} → ~{tgt}/token{less}"


def _bandwidth_advice(i: Inputs, ms: float, floor: float | None = None) -> tuple[str, str, str]:
    """BANDWIDTH: fewer bytes a token (or a step, where the DRAM counters alone priced it: no token clock). Halving
    the bytes halves the floor they set; the token's time above the floor stays, so the prediction is the token
    less half its floor, not half the token."""
    if not ms:
        return ("read fewer bytes per step: quantize weights, compress or shrink the KV cache",
                "Halve the bytes each step reads: the program's own rate should nearly double while DRAM stays near "
                f"{i.dram_gbs or 0:.4g} GB/s; if it does not, bandwidth was not the binding ceiling.",
                "halving the bytes a step reads halves the step")
    remedy = "read fewer bytes per token: quantize weights, compress or shrink the KV cache"
    if not floor:
        return (remedy, f"Halve the bytes read per token (e.g. 8-bit weights): ms/token should fall toward half of "
                f"{ms:.3g}; if it does not move, bandwidth was not the binding ceiling.",
                "halving bytes/token halves the time the bytes take (no floor priced: how much is unknown)")
    after, above = ms - floor / 2, max(ms - floor, 0.0)
    return (remedy,
            f"Halve the bytes read per token (e.g. 8-bit weights): ms/token should fall by about half its "
            f"{floor:.3g} ms bandwidth floor, {ms:.3g} → ~{after:.3g}; if it falls by much less, bandwidth was not "
            "the binding ceiling.",
            f"halving bytes/token: {ms:.3g} → ~{after:.3g} ms/token (the {floor:.3g} ms floor halves; the "
            f"{above:.3g} ms above it stays)")


def _occupancy_advice(i: Inputs) -> tuple[str, str, str]:
    """OCCUPANCY: reshape the grids, the hottest small one named with what widening it would save."""
    hot = i.hot_small_grids[0] if i.hot_small_grids else None
    if not hot:
        return ("reshape grids: split over another axis, widen blocks",
                "Widen the hottest small grid to the SM count: if its time does not fall, it was not occupancy.",
                "unknown without a traced window")
    name, grid, us = hot
    cov = min(grid, i.sm_count or grid) / max(i.sm_count or grid, 1)
    save = us * (1 - cov) / 1e3
    return ("reshape grids: split over another axis (context, value tiles, split-K), widen blocks; fuse the "
            f"small grids of a few µs a call (under {SHORT_KERNEL_US:g} µs, more blocks do not shorten them)",
            f"Widen {name} from {grid} blocks to ≥{i.sm_count or 'SM count'}: if its µs/token "
            f"({us:.0f}) does not fall, it was not occupancy-bound.",
            f"up to {save:.3g} ms/token from {name} alone ({us:.0f} µs at {100 * cov:.0f}% of the SMs)")


def _comm_advice(comm_ms: float | None) -> tuple[str, str, str]:
    """COMM: change the collective, and the microbenchmark that tells bytes from calls."""
    c = comm_ms or 0.0
    return ("change the collective: fewer calls, a different algorithm or payload, or move the reduce",
            "Microbenchmark one all-reduce at 1×, 8× and 64× the payload: if µs/call scales with bytes "
            "it is bandwidth, if it barely moves the target is the call count; if the share of the step "
            "is under 10% when measured alone, COMM was wrong.",
            f"halving calls/token saves ~{c / 2:.3g} ms/token")


def _counters_said(i: Inputs) -> str:
    """What PM's counters alone already say of OCCUPANCY, for a falsifier that asks for the grids."""
    if i.sm_active_pct is None or not i.gpu_busy_pct:
        return " (or with SM active far below GPU busy)"
    r = i.sm_active_pct / i.gpu_busy_pct
    if r >= 0.8:
        return (f", though PM's counters alone rule it out (SM active {i.sm_active_pct:.0f}% against GPU busy "
                f"{i.gpu_busy_pct:.0f}%): the grids would overrule them")
    return f" (SM active is {100 * r:.0f}% of GPU busy)"


def _open_advice(i: Inputs, floor: float | None, ms: float, launch: Candidate, priced: tuple[str, ...],
                 missing: str) -> tuple[str, str, str]:
    """No ceiling binds: the measurement that would decide, or, with everything measured and the kernels filling
    the step, what was measured off the floor."""
    if missing and kernels_fill_step(i, launch):
        top = i.top_kernel
        t = f" ({top[0]}, {top[1]:.0f} µs/token)" if top else ""
        far = bool(floor) and ms / floor > BANDWIDTH_NEAR_RATIO  # too far above the floor for BANDWIDTH
        fill = (f"the kernels fill {100 * i.kernel_ms / ms:.0f}% of the step{t}"
                if i.kernel_ms is not None and ms else
                f"the GPU is busy {i.gpu_busy_pct:.0f}% of the step (a launch's share is ruled out){t}"
                if i.gpu_busy_pct is not None else f"a launch's share of the step is ruled out{t}")
        share = i.small_grid_share_pct
        sm_low = i.sm_active_pct is not None and bool(i.gpu_busy_pct) and i.sm_active_pct < 0.5 * i.gpu_busy_pct
        if share is not None and share < OCCUPANCY_LEANING_SHARE_PCT and not far and not sm_low:  # grids measured
            grids = (f"{share:.0f}% of kernel time in small grids, under the {OCCUPANCY_LEANING_SHARE_PCT:g}% that "
                     "would make it OCCUPANCY" + ("; PM's SM active, its other test, is not measured"
                                                  if i.sm_active_pct is None else ""))
            return (f"{fill} and no ceiling binds at these numbers: measure {missing} to say whether bytes bind "
                    f"(the grids are measured: {grids})",
                    f"Measure {missing}: BANDWIDTH binds within {BANDWIDTH_BINDING_RATIO:g}× of bytes ÷ bandwidth; "
                    f"the grids do not ({grids}).", f"n/a: first measure {missing}")
        return (f"{fill} and no ceiling binds at these numbers: measure {missing} to say "
                + ("whether grids bind (the floor is too far below the token for bytes to)" if far else
                   "whether bytes or grids bind"),
                (f"Measure {missing}: with small grids it is OCCUPANCY{_counters_said(i)} (the token "
                 f"is {floor and ms / floor:.3g}× its bandwidth floor, too far for BANDWIDTH)."
                 if floor and ms / floor > BANDWIDTH_NEAR_RATIO else
                 f"Measure {missing}: with small grids it is OCCUPANCY{_counters_said(i)}; BANDWIDTH "
                 f"binds only within {BANDWIDTH_BINDING_RATIO:g}× of bytes ÷ bandwidth."),
                f"n/a: first measure {missing}")
    if missing:
        return (f"measure {missing}",
                (f"Nothing binds at these numbers ({', '.join(priced)} priced, none binding). The measurement "
                 f"that decides, not a fix: {missing}." if priced else "n/a until a candidate has a number"), "n/a")
    if floor and ms and kernels_fill_step(i, launch):
        return _kernels_slow_off_the_floor(i, ms / floor)
    return ("measure more: " + ("the PM counters (GPU busy, DRAM): no window can be traced here"
                                if i.untraced and i.gpu_busy_pct is None else "a traced window, or ms/token with kernels/token and bytes/token"),
            (f"Nothing binds at these numbers ({', '.join(priced)} priced, none binding): the next "
             "measurement decides, not a fix." if priced else "n/a until a candidate has a number"), "n/a")
