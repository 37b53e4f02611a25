"""`decodemon scaling ONE MANY`: Amdahl's serial fraction from a run at N1 ranks and one at N (recordings)."""

from __future__ import annotations

from pathlib import Path

from decodemon.monitor.alike import model_difference, model_words, same_source
from decodemon.monitor.cli._common import UsageError, bounded, print_json

STALE = ("the binding ceiling differs between the two runs: the figure mixes two bottlenecks; re-derive it once "
         "the change has settled")
FRESH = "re-derive after every win: a serial fraction measured before an optimisation is not valid after it"


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("scaling", help="Amdahl's serial fraction from two recordings at different rank counts",
                       description="The serial fraction s from the speedup between a run at N1 ranks (the "
                                   "baseline, usually TP=1) and one at N ranks, each run's ms/token over its whole "
                                   "recording. One model under two names is matched by its facts (layers, hidden "
                                   "size, dtype, weight bytes).",
                       epilog="Exit status: 0 when both runs are timed: the speedup is measured, whether or not a "
                              "serial fraction between 0 and 1 explains it (`diagnose --speedup`, given no measured "
                              "run, exits 3 where none does); 3 where a run has no token timing; 2 for bad input.")
    p.add_argument("one", metavar="BASELINE", help="recording at the lower rank count (usually TP=1)")
    p.add_argument("many", metavar="SCALED", help="recording at N ranks")
    p.add_argument("--n", type=bounded("--n", 0, 1e6, True), default=None,
                   help="ranks of the second run, where its model facts do not say (a recording whose facts give "
                        "a tensor-parallel degree above 1 is taken at it; an --n that contradicts it is refused)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(fn=run)


def _timed(path: str):
    from decodemon.monitor.sources.collect import collect_recording

    if not Path(path).is_file():
        raise UsageError(f"decodemon scaling: {path}: no such recording")
    from decodemon.monitor.span import summary_snapshot

    snap = summary_snapshot(collect_recording(path))
    if snap.tokens is None:
        from decodemon.monitor.sources.errors import NothingMeasured

        raise NothingMeasured(f"{path} has no token timing, so no speedup can be measured from it")
    return snap


def _ranks(a, s1, sn) -> tuple[int, int]:
    """(N1, N), checked: the baseline has fewer ranks."""
    n1 = s1.model.tp_degree if s1.model else 1
    own = sn.model.tp_degree if sn.model else 1
    if a.n is not None and own > 1 and a.n != own:  # facts of 1 are the default a loop that says nothing gets
        raise UsageError(f"decodemon scaling: --n {a.n} contradicts {a.many}, whose model facts say {own} ranks "
                         f"(tp_degree {own}): leave --n out, or give --n {own}")
    nn = a.n or own
    if a.n is not None and own == 1 and nn > 1 and sn.windows_seen and sn.inputs is not None \
            and sn.inputs.collectives_per_token == 0:
        raise UsageError(f"decodemon scaling: --n {a.n}: {a.many} traced {sn.windows_seen} window(s) and no "
                         f"collective in them, and its model facts say 1 rank; a run across {a.n} ranks all-reduces "
                         f"every layer: is it the {a.n}-rank run?")
    if nn > n1:
        return n1, nn
    if a.n is None and nn < n1:
        raise UsageError(f"decodemon scaling: {a.one} has {n1} ranks and {a.many} {nn}: the run with fewer ranks "
                         f"is the baseline and goes first: `decodemon scaling {a.many} {a.one}`")
    if a.n is None:
        raise UsageError(f"decodemon scaling: both recordings have {n1} rank(s) in their model facts: give the "
                         f"second run's rank count with --n")
    raise UsageError(f"decodemon scaling: --n {nn} must be more than the baseline's {n1} ranks")


def scaling_result(a, s1, sn) -> dict:
    """The serial fraction and whether Amdahl's law explains the two runs."""
    from decodemon.monitor.ranks import serial_fraction_of_runs

    n1, nn = _ranks(a, s1, sn)
    ms1, msn = s1.tokens.ms_per_token, sn.tokens.ms_per_token
    s = serial_fraction_of_runs(ms1, n1, msn, nn)
    stale = s1.rolling.ceiling != sn.rolling.ceiling
    applies = 0.0 <= s <= 1.0
    res = {"n1": n1, "n": nn, "ms_per_token_n1": round(ms1, 4), "ms_per_token_n": round(msn, 4),
           # null where no fraction between 0 and 1 explains the runs (amdahl_applies false; solved_s is the algebra's)
           "speedup": round(ms1 / msn, 4), "serial_fraction": round(s, 4) if applies else None,
           "solved_s": round(s, 4),
           "span_s": [round(s1.span_s, 3), round(sn.span_s, 3)],  # each run's ms/token is over its whole recording
           "verdicts": [s1.rolling.ceiling, sn.rolling.ceiling], "stale": stale, "amdahl_applies": applies,
           "note": STALE if stale else FRESH}
    if not applies:
        how = "slower than" if s > 1 else f"more than {round(nn / n1)}x faster than"
        res["note"] = (f"{nn} ranks are {how} {n1}: no serial fraction between 0 and 1 explains that, so Amdahl's "
                       "law does not apply (work that grows with the rank count, such as the all-reduces, or a "
                       "change between the runs); s is the algebra's value only")
    return res


def _one_run(a, s1, sn) -> None:
    """Two ranks of one run are not two runs: refuse them by their facts."""
    m1, mn = s1.model, sn.model
    if m1 is not None and mn is not None and m1.tp_degree > 1 and m1.tp_degree == mn.tp_degree \
            and m1.tp_rank != mn.tp_rank:
        raise UsageError(f"decodemon scaling: {a.one} and {a.many} are ranks {m1.tp_rank} and {mn.tp_rank} of one "
                         f"run at tp {m1.tp_degree}: the serial fraction needs a baseline run at fewer ranks "
                         "(usually TP=1) against one of them")


def cautions(a, s1, sn) -> list[str]:
    """What the two runs leave open, said beside the figure: a model nothing matches, a change of launch mode."""
    from decodemon.monitor.alike import device_difference

    out = []
    dev = device_difference(s1, sn)
    if dev is not None:
        out.append(f"{a.one} ran on {dev.replace(' against ', f', {a.many} on ', 1)}: the speedup mixes the device "
                   "with the rank count")
    for path, snap in ((a.one, s1), (a.many, sn)):
        if snap.diagnosis.edge:  # a verdict on a threshold: STALE (or not) may turn on a hair
            out.append(f"{path}'s verdict is {snap.diagnosis.edge}, so whether the two runs' ceilings differ "
                       "(STALE) turns on it")
    for path, snap in ((a.one, s1), (a.many, sn)):
        if snap.model is None:
            out.append(f"{path} carries no model facts: nothing says the two runs are one model")
    g = [snap.window.graph_launches_per_token if snap.window else None for snap in (s1, sn)]
    if None not in g and (g[0] > 0) != (g[1] > 0):
        graphed, eager = (a.one, a.many) if g[0] > 0 else (a.many, a.one)
        out.append(f"{graphed} replays CUDA graphs and {eager} launches its kernels one by one: the speedup mixes "
                   "that change with the rank count")
    return out


def run(a) -> int:
    """Print the serial fraction."""
    if Path(a.one).is_file() and same_source(a.one, a.many):
        raise UsageError(f"decodemon scaling: {a.one} and {a.many} are the same recording: the serial fraction "
                         "compares two runs at different rank counts, so give two recordings")
    s1, sn = _timed(a.one), _timed(a.many)
    differ = model_difference(s1.model, sn.model)  # by the facts: one model may come under two names
    if differ is not None:  # a serial fraction compares one model at two rank counts
        raise UsageError(f"decodemon scaling: {a.one} is {model_words(s1.model)} and {a.many} is "
                         f"{model_words(sn.model)} ({differ}): the serial fraction compares one model at two rank "
                         "counts")
    _one_run(a, s1, sn)
    res = scaling_result(a, s1, sn)
    res["cautions"] = cautions(a, s1, sn)
    if a.json:
        print_json(res)
        return 0
    note = ""
    if not res["amdahl_applies"]:
        note = f" ({res['note']})"
    elif res["stale"]:
        note = f" (STALE: {res['note']})"
    what = (f"serial fraction s = {res['serial_fraction']:.3f}" if res["serial_fraction"] is not None else
            f"Amdahl's s solved = {res['solved_s']:.3f}, not a fraction")  # --json's serial_fraction, else solved_s
    print(f"speedup {res['speedup']:.3f}x at N={res['n']} over N={res['n1']}: {what}{note}")
    for c in res["cautions"]:
        print(f"  caution: {c}")
    return 0
