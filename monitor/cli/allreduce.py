"""`decodemon allreduce --payload-bytes B`: all-reduce latency at 1x, 8x and 64x a payload on this machine,
measured `--repeats` times: the median of the runs, their range, whether the conclusion is inside that range, and
a size that costs more than a bigger one."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from decodemon.monitor.cli._common import UsageError, bounded, print_json

LATENCY_BOUND_RATIO = 2.0  # 64x the bytes for under this many times the time: the call, not the bytes, costs
# a smaller payload's median over 10% above a bigger one's, each of its runs above each of the bigger's: an
# inversion beyond the runs' noise (nearer ones are the noise of a call that costs about the same at every size)
INVERSION_MARGIN = 1.1
SIZES = ("1", "8", "64")
DEFAULT_REPEATS = 5
DEFAULT_CALLS = 50
DECIMALS = 2  # µs/call and the 64x ratio, as the JSON gives them and the text prints them


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("allreduce", help="all-reduce latency at 1x, 8x and 64x a payload (torch)",
                       description="Time all-reduces of a decode's payload and 8x and 64x it across --tp ranks, "
                                   "to tell a latency-bound collective from a bandwidth-bound one.")
    p.add_argument("--payload-bytes", type=bounded("--payload-bytes", 0, 1 << 34, True), required=True, metavar="B",
                   help="bytes one all-reduce carries in the decode (hidden size x batch x element size)")
    p.add_argument("--tp", type=bounded("--tp", 1, 64, True), default=2, help="ranks, 2 or more (default 2)")
    p.add_argument("--iters", type=bounded("--iters", 0, 1e6, True), default=200, help="timed replays (default 200)")
    p.add_argument("--calls", type=bounded("--calls", 0, 10_000, True), default=None,
                   help=f"CUDA: all-reduces per CUDA graph, timed by CUDA events around replays "
                        f"(default {DEFAULT_CALLS})")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="where the ranks run (default: cuda if any)")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="element type (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--spacer-in", default=None, metavar="W,W",
                   help="CUDA: input widths of GEMVs placed before each timed call (the decode's o_proj and "
                        "down_proj shards, e.g. 1024,1536)")
    p.add_argument("--profile-kernels", action="store_true",
                   help="CUDA: also read the NCCL kernels' own durations with torch.profiler")
    p.add_argument("--repeats", type=bounded("--repeats", 1, 100, True), default=DEFAULT_REPEATS, metavar="N",
                   help=f"runs of the whole benchmark: the median and the range of their figures "
                        f"(default {DEFAULT_REPEATS})")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=run)


ELEMENT_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def _device_of(a) -> tuple[str, str]:
    """Where the ranks will run, and why: --device, else CUDA where the machine has an NVIDIA device node."""
    if a.device:
        return a.device, f"--device {a.device}"
    if os.path.exists("/dev/nvidia0"):
        return "cuda", "the default where there is an NVIDIA device"
    return "cpu", "this machine has no NVIDIA device"


def _dtype_of(a) -> tuple[str, str]:
    """The element type the benchmark will use, and why: --dtype, or its default for the device (bfloat16 on
    CUDA, float32 on CPU; with no --device, CUDA where the machine has an NVIDIA device node)."""
    if a.dtype:
        return a.dtype, f"--dtype {a.dtype}"
    device, _ = _device_of(a)
    dtype = "bfloat16" if device == "cuda" else "float32"
    return dtype, f"{dtype}, the default on {device.upper() if device == 'cpu' else 'CUDA'}; --dtype picks another"


# what each CUDA-only option does, for the line that refuses it on CPU (gloo times each call alone on the host clock)
CUDA_ONLY = {"spacer_in": ("--spacer-in", "places GEMVs between the calls in a CUDA graph"),
             "profile_kernels": ("--profile-kernels", "reads the NCCL kernels' durations on the GPU"),
             "calls": ("--calls", "sets the all-reduces per CUDA graph")}


def check_options(a) -> None:
    """UsageError in one line for an option that cannot apply: one rank (an all-reduce exchanges nothing), or a
    CUDA-only option where the ranks run on CPU."""
    if a.tp < 2:
        raise UsageError(f"decodemon allreduce: --tp {a.tp}: an all-reduce across one rank exchanges nothing, so "
                         "there is nothing to time; give --tp 2 or more")
    device, why = _device_of(a)
    if device != "cpu":
        return
    for dest, (flag, what) in CUDA_ONLY.items():
        if getattr(a, dest) not in (None, False):
            raise UsageError(f"decodemon allreduce: {flag} {what}, and the ranks run on CPU ({why}), where gloo "
                             f"times each call alone on the host clock: drop {flag} or use --device cuda")


def _spread(values: list[float]) -> dict:
    """The median of the runs' values and their range."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _us(x: float) -> float:
    """µs (or a ratio) as the summary gives it: to DECIMALS places, so the JSON and the text hold one figure."""
    return round(x, DECIMALS)


def _order(sizes: dict) -> tuple[list[str], list[dict]]:
    """The sizes that cost more than a bigger one: (those outside the runs' noise, in words; those inside it).
    Outside: the smaller's median over INVERSION_MARGIN times the bigger's and every run of it above every run of
    the bigger (with one run, the margin alone); inside: any other inversion of the medians, which the noise
    makes."""
    outside, inside = [], []
    for i, small in enumerate(SIZES):
        for big in SIZES[i + 1:]:
            s, b = sizes[small]["us_per_call"], sizes[big]["us_per_call"]
            if s <= b:
                continue
            apart = sizes[small]["us_per_call_range"][0] > sizes[big]["us_per_call_range"][1]
            if s > INVERSION_MARGIN * b and apart:
                outside.append(f"{small}x costs more than {big}x ({s:.2f} against {b:.2f} µs/call)")
            else:
                why = f"within {100 * (INVERSION_MARGIN - 1):.0f}%" if apart else "inside the runs' ranges"
                inside.append({"size": f"{small}x", "costs_more_than": f"{big}x", "us_per_call": [s, b],
                               "why": why})
    return outside, inside


def summarise(runs: list[dict]) -> dict:
    """The benchmark's reports of several runs as one: each figure the runs' median, with their range (µs, to
    DECIMALS places); the 64x/1x ratio of each run, and whether its range crosses the latency-bound line, so
    that it holds the ratio the other conclusion expects (the conclusion is then inside the runs' own noise); and
    the sizes whose median costs more than a bigger one's beyond the runs' noise, which leave the conclusion
    undecided (a latency-bound call costs about the same at every size, so an inversion inside the noise is its
    noise, and said as such)."""
    first = runs[0]
    sizes = {}
    for k in SIZES:
        rows = [r["sizes"][k] for r in runs]
        row = {"bytes": rows[0]["bytes"]}
        for key in rows[0]:
            vals = [x[key] for x in rows if _number(x.get(key))]
            if key != "bytes" and len(vals) == len(rows):
                row[key] = _us(statistics.median(vals))
        each = [_us(x["us_per_call"]) for x in rows]
        row["us_per_call"] = _us(statistics.median(each))
        row["us_per_call_range"] = [min(each), max(each)]
        row["us_per_call_runs"] = each
        sizes[k] = row
    ones, sixty_fours = sizes["1"]["us_per_call_runs"], sizes["64"]["us_per_call_runs"]
    ratios = [_us(top / base) for base, top in zip(ones, sixty_fours) if base > 0]
    ratio = _spread(ratios) if ratios else None
    if ratio:
        ratio["median"] = _us(ratio["median"])
    # both conclusions' ratios in the range: latency-bound's (under the line) and bandwidth's (at it or over)
    within_noise = bool(ratio and ratio["min"] < LATENCY_BOUND_RATIO <= ratio["max"])
    inverted, noise = _order(sizes)
    if ratio is None:
        regime = "undecided: the 1x call measured no time"
    elif inverted:
        regime = ("undecided: a larger payload cost less than a smaller one, which the machine's noise (or a change "
                  "of algorithm between the sizes) makes, not the bytes; more --iters or --repeats, or a quieter "
                  "machine")
    elif within_noise:
        regime = (f"undecided: the runs fall on both sides of {LATENCY_BOUND_RATIO:g}x, so the conclusion is "
                  "inside their own noise; more --iters or --repeats, or a quieter machine")
    elif ratio["median"] < LATENCY_BOUND_RATIO:
        regime = "latency-bound: report µs/call; the target is the number of calls"
    else:
        regime = "bandwidth matters at these sizes"
    out = {k: first[k] for k in ("device", "tp", "dtype", "method") if k in first}
    out.update({"repeats": len(runs), "sizes": sizes,
                "ratio_64x": ratio["median"] if ratio else None,
                "ratio_64x_range": [ratio["min"], ratio["max"]] if ratio else None,
                "latency_bound_below": LATENCY_BOUND_RATIO,
                "within_noise": within_noise, "regime": regime,
                "non_monotonic": inverted, "out_of_order_within_noise": noise})
    return out


def summary_text(s: dict) -> str:
    """The summary as terminal lines, headed by what was measured (a CPU figure must not read as a GPU's)."""
    lines = [f"all-reduce on {s.get('device', '?')}, {s.get('tp', '?')} ranks, {s.get('dtype', '?')}"
             + (f" ({s['method']})" if s.get("method") else "")]
    for k, v in s["sizes"].items():
        lo, hi = v["us_per_call_range"]
        host, b2b = v.get("host_issued_us_per_call"), v.get("back_to_back_us_per_call")
        lines.append(f"{k:>3}x  {v['bytes']:>10} B  {v['us_per_call']:10.2f} µs/call  (range {lo:.2f}-{hi:.2f})"
                     + (f"   (back to back {b2b:.1f}, issued from the host {host:.1f} µs/call)" if host else ""))
    runs = (f"the median of {s['repeats']} runs' own ratios" if s["repeats"] > 1 else
            "one run: no spread; --repeats gives one")
    sz = s["sizes"]
    table = (f"; the table's medians give {sz['64']['us_per_call'] / sz['1']['us_per_call']:.2f}x"
             if s["repeats"] > 1 and "64" in sz and "1" in sz and sz["1"]["us_per_call"] else "")
    if s["ratio_64x"] is not None:
        lo, hi = s["ratio_64x_range"]
        line = s["latency_bound_below"]
        side = ("" if s["within_noise"] or s["repeats"] < 2 else
                f", every run under {line:g}x" if hi < line else f", every run at {line:g}x or over")
        lines.append(f"64x the payload costs {s['ratio_64x']:.2f}x the time ({runs}, {lo:.2f}-{hi:.2f}x{side}"
                     f"{table}): {s['regime']}")
    else:
        lines.append(s["regime"])
    lines += [f"not monotonic: {x}" for x in s["non_monotonic"]]
    noise = [f"{x['size']} over {x['costs_more_than']} ({x['why']})" for x in s["out_of_order_within_noise"]]
    lines += [f"out of order, within the noise: {', '.join(noise)}"] if noise else []
    return "\n".join(lines)


def run(a) -> int:
    """Run the benchmark `--repeats` times, each in its own process (torch stays out of the monitor), and print
    the median and range of their figures."""
    check_options(a)
    dtype, why = _dtype_of(a)
    size = ELEMENT_BYTES[dtype]
    if a.payload_bytes % size:  # the benchmark would round it down and time another payload than the one asked
        raise UsageError(f"decodemon allreduce: --payload-bytes {a.payload_bytes} is not a whole number of "
                         f"{size}-byte elements ({why}); give a multiple of {size}")
    from decodemon.probes import children

    cmd = children.python_argv("decodemon.engine_adapter.collective_bench", "--payload-bytes", str(a.payload_bytes),
                               "--tp", str(a.tp), "--iters", str(a.iters), "--calls", str(a.calls or DEFAULT_CALLS))
    cmd += ["--device", a.device] if a.device else []
    cmd += ["--dtype", a.dtype] if a.dtype else []
    cmd += ["--spacer-in", a.spacer_in] if a.spacer_in else []
    cmd += ["--profile-kernels"] if a.profile_kernels else []
    cmd += ["--json"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    runs = []
    for _ in range(a.repeats):
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True,  # its own errors reach stderr as said
                           cwd=children.CWD)
        if r.returncode:
            return r.returncode
        try:
            runs.append(json.loads(r.stdout))
        except json.JSONDecodeError:
            print("decodemon allreduce: the benchmark printed no result", file=sys.stderr)
            return 1
    s = summarise(runs)
    if a.json:
        print_json(s)
    else:
        print(summary_text(s))
    return 0
