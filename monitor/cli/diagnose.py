"""`decodemon diagnose --ms-per-token ...`: the method's arithmetic from numbers alone (no GPU, no process)."""

from __future__ import annotations

import argparse

from decodemon.monitor.cli._common import UsageError, bounded, print_json


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("diagnose", help="the verdict from numbers alone (no GPU)",
                       description="Name the binding ceiling from figures you measured yourself.",
                       epilog="Exit status: 0 when a candidate or the serial fraction (--speedup with --n, an s "
                              "between 0 and 1) could be priced from the figures given (the ceiling may still be "
                              "UNKNOWN), 3 when neither could (an s solved outside 0..1 is no fraction), 2 for bad "
                              "input.")
    p.add_argument("--ms-per-token", type=bounded("--ms-per-token", 0, 1e7), metavar="MS",
                   help="the step, token to token")
    p.add_argument("--kernels-per-token", type=bounded("--kernels-per-token", 0, 1e9), metavar="N",
                   help="kernels a token runs, however launched: an eager token launches each, a graphed token's "
                        "one graph launch runs them all; LAUNCH divides the idle by the kernels")
    p.add_argument("--launches-per-token", dest="launches_per_token", metavar="N", help=argparse.SUPPRESS)
    p.add_argument("--kernel-ms-per-token", type=bounded("--kernel-ms-per-token", 0.0, 1e7, allow_zero=True),
                   metavar="MS", help="the GPU time the kernels cover a token: their union, kernels that run at "
                                      "once counted once (--json's kernel_busy_ms_per_token; a profiler's durations "
                                      "summed overstate it where kernels overlap): with it, the idle between them "
                                      "prices LAUNCH")
    p.add_argument("--bytes-per-token", type=bounded("--bytes-per-token", 0, 1e15), metavar="B",
                   help="bytes read from memory per token (weights plus KV cache)")
    p.add_argument("--bandwidth-gbs", type=bounded("--bandwidth-gbs", 0, 1e7), metavar="GBS",
                   help="the device's memory bandwidth in GB/s")
    p.add_argument("--collectives-per-token", type=bounded("--collectives-per-token", 0.0, 1e7, allow_zero=True),
                   metavar="N", help="all-reduces (or other collectives) per token")
    p.add_argument("--us-per-collective", type=bounded("--us-per-collective", 0, 1e9), metavar="US",
                   help="what one collective costs the step, µs")
    p.add_argument("--speedup", type=bounded("--speedup", 0, 1e6), metavar="X",
                   help="with --n: the speedup measured at N ranks, for the serial fraction")
    p.add_argument("--n", type=bounded("--n", 0, 1e6, True), metavar="N", help="the rank count of --speedup")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(fn=run)


def run(a) -> int:
    """Print the verdict for the numbers given."""
    from decodemon.monitor import diagnosis as dx
    from decodemon.monitor.render import diagnose_text

    if a.launches_per_token is not None:  # a launch is a host call: a graphed token has 1 for 1,864 kernels
        raise UsageError("decodemon diagnose: give --kernels-per-token, the kernels a token runs however launched "
                         "(a graphed token's 1 launch runs them all); --launches-per-token is not taken")
    if (a.speedup is None) != (a.n is None):
        raise UsageError("decodemon diagnose: --speedup and --n go together (see `decodemon diagnose --help`)")
    if a.us_per_collective is not None and a.collectives_per_token is None:
        raise UsageError("decodemon diagnose: --us-per-collective needs --collectives-per-token "
                         "(see `decodemon diagnose --help`)")
    if (a.bytes_per_token is None) != (a.bandwidth_gbs is None):
        raise UsageError("decodemon diagnose: --bytes-per-token and --bandwidth-gbs go together: the floor is one "
                         "over the other (see `decodemon diagnose --help`)")
    if a.kernel_ms_per_token is not None and a.ms_per_token is not None and a.kernel_ms_per_token > a.ms_per_token * 1.05:
        raise UsageError("decodemon diagnose: --kernel-ms-per-token is more than 5% over the step (--ms-per-token; "
                         "a traced token runs a little longer than an untraced one); the GPU time one token's kernels "
                         "cover (their union) cannot be longer than the token")
    if a.bytes_per_token is not None and a.ms_per_token is not None:
        achieved = a.bytes_per_token / (a.ms_per_token * 1e-3) / 1e9
        if achieved > a.bandwidth_gbs * 1.05:  # a token cannot move its bytes faster than the memory can
            raise UsageError(f"decodemon diagnose: {a.bytes_per_token:.4g} bytes in {a.ms_per_token:g} ms is "
                             f"{achieved:.4g} GB/s, more than the device's {a.bandwidth_gbs:g} GB/s: one of "
                             "--bytes-per-token, --ms-per-token and --bandwidth-gbs is wrong")
    if a.us_per_collective is not None and a.ms_per_token is not None:
        share = 100 * a.collectives_per_token * a.us_per_collective / (a.ms_per_token * 1e3)
        if share > 100:  # the collectives of one token cannot take longer than the token
            raise UsageError(f"decodemon diagnose: {a.collectives_per_token:g} collectives × "
                             f"{a.us_per_collective:g} µs is {share:.0f}% of the {a.ms_per_token:g} ms step: over "
                             "100%, so --collectives-per-token, --us-per-collective or --ms-per-token is wrong")
    if a.us_per_collective is not None and a.kernel_ms_per_token is not None:
        coll_ms = a.collectives_per_token * a.us_per_collective / 1e3
        if coll_ms > a.kernel_ms_per_token * 1.05:  # a collective is a kernel: its time is inside the kernels'
            raise UsageError(f"decodemon diagnose: {a.collectives_per_token:g} collectives × {a.us_per_collective:g} "
                             f"µs is {coll_ms:.3g} ms, more than the {a.kernel_ms_per_token:g} ms of kernels they are "
                             "part of: --collectives-per-token, --us-per-collective or --kernel-ms-per-token is wrong")
    if a.n is not None and a.n < 2:
        raise UsageError("decodemon diagnose: --n must be at least 2 for a serial fraction")
    inp = dx.Inputs(ms_per_token=a.ms_per_token, kernels_per_token=a.kernels_per_token,
                    kernel_sum_ms_per_token=a.kernel_ms_per_token, kernel_busy_ms_per_token=a.kernel_ms_per_token,
                    bytes_per_token=a.bytes_per_token, bandwidth_gbs=a.bandwidth_gbs,
                    collectives_per_token=a.collectives_per_token, us_per_collective=a.us_per_collective)
    d = dx.diagnose(inp, speedup=a.speedup, n=a.n)
    if a.json:
        print_json(d.as_json())  # its notes say the figures were given (Inputs.ms_kind is "": typed in)
    else:
        print(diagnose_text(d))
    fraction = d.serial_fraction is not None and 0.0 <= d.serial_fraction <= 1.0  # an s outside is no fraction
    priced = any(c.value is not None for c in d.candidates.values()) or fraction
    return 0 if priced else 3  # no candidate and no serial fraction priced: nothing the figures given could measure
