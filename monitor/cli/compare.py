"""`decodemon compare A B`: two sources side by side (pids or recordings), in the app or as JSON."""

from __future__ import annotations

from decodemon.monitor.cli._common import (UsageError, add_last, add_probe, add_refresh, add_seconds, add_source,
                                           attach_settings, bounded, live_probe, live_seconds, need_json_for_last,
                                           need_terminal, print_json, say, without_tokens)

JSON_SECONDS = 10.0
# the figures whose ratio B/A says what a change did
RATIOS = ("ms_per_token", "tokens_per_s", "throughput_tokens_per_s", "kernels_per_token", "host_launch_calls_per_token",
          "kernel_sum_ms_per_token", "gpu_busy_pct", "bytes_per_token")
# what each ratio divides: the medians and the means of the tokens are different figures, so the JSON says which
RATIO_OF = {"ms_per_token": "the clock's ms a mark (a token, or a batched engine's step): the median mark's, or a "
                            "counted clock's mean (ms_per_token_note says which)",
            "tokens_per_s": "the clock's marks a second over the mean mark (slow ones count; those the observer's own "
                            "steps overlapped are left out, observer_cost.slowed_tokens): tokens, or a batched "
                            "engine's steps",
            "throughput_tokens_per_s": "every request's tokens a second, each side's in compare's own "
                                       "throughput_tokens_per_s: a batched engine's throughput, a loop of one "
                                       "sequence's tokens_per_s",
            "kernels_per_token": "kernels per token in the latest traced window",
            "host_launch_calls_per_token": ("the host's launch calls per token: kernel launch calls (runtime and "
                                            "driver) plus graph launches (a captured graph makes many kernels one "
                                            "call)"),
            "kernel_sum_ms_per_token": "the kernels' summed ms per token in the latest traced window (their union, "
                                       "kernels at once counted once, is kernel_busy_ms_per_token)",
            "gpu_busy_pct": "the share of time the GPU ran work",
            "bytes_per_token": "DRAM bytes (read + write) a token, the floor's: measured, else the model's (a batched "
                               "engine's floor prices a step's, bytes_per_step: this is it ÷ the step's tokens)"}


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("compare", help="two sources side by side (pids or recordings)",
                       description="Two runs side by side: before and after a change, eager and graphed.")
    add_source(p, ("a", "b"))
    p.add_argument("--json", action="store_true",
                   help="print both summaries, each over its whole recording or the seconds watched, and the ratios "
                        "B/A (ms/token: of each clock's ms, a median or a counted clock's mean; tokens/s: of the means); "
                        "`differ` says where the model, "
                        "the TP degree, the device, the KV cache type, the batch, the clock or the bandwidth the "
                        "floors are priced at is not the same, or A and B are one source")
    add_seconds(p, None, f"pids: seconds to watch (app: until q; --json: {JSON_SECONDS:g}, all of them summarised)")
    add_last(p, "each summary")
    p.add_argument("--speed", type=bounded("--speed", 0, 1000), default=None,
                   help="recordings: playback speed in the app (default 1)")
    p.add_argument("--at", type=bounded("--at", 0.0, 1e6, allow_zero=True), default=None, metavar="S",
                   help="recordings: start at this many seconds")
    p.add_argument("--paused", action="store_true", help="recordings: open paused")
    add_probe(p)
    add_refresh(p)
    p.set_defaults(fn=run)


# what each of `differ`'s keys names, in words ("source": A and B are one, said whole)
DIFFER_NAMES = {"model": "model", "tp": "TP degree", "device": "device", "kv": "KV cache type", "batch": "batch",
                "clock": "clock", "bandwidth": "floor's bandwidth", "gpu_busy": "GPU busy's instrument"}


def _apart_words(apart: dict) -> str:
    """What a ratio holds besides a change of code, for b_over_a_of."""
    if "source" in apart:
        return "A and B are one source, so it is 1 by construction"
    names = [DIFFER_NAMES.get(k, k) for k in apart]
    return f"the {' and the '.join(names)} {'differ' if len(names) > 1 else 'differs'} between A and B"


def _bytes_source(j: dict) -> str | None:
    """Whose bytes a summary's bytes_per_token are: the DRAM counters', the model's, or None without a figure."""
    if j.get("bytes_per_token_measured"):
        return "the DRAM counters' (measured)"
    return "the model's weights + KV" if j.get("bytes_per_token") else None


def _floors_apart(ja: dict, jb: dict) -> str | None:
    """Where A's and B's bandwidth floors are priced at two bandwidths (two sources, or one source 5% apart)."""
    a, b = ja.get("bandwidth_gbs"), jb.get("bandwidth_gbs")
    if not a or not b:
        return None
    sa, sb = ja.get("bandwidth_source") or "?", jb.get("bandwidth_source") or "?"
    if sa == sb and abs(a - b) <= 0.05 * max(a, b):
        return None
    return (f"A's floor is priced at {a:.4g} GB/s ({sa}), B's at {b:.4g} GB/s ({sb}): each side's × floor figures "
            "are against its own bandwidth")


def _ratio(b, a):
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a:
        return round(b / a, 4)
    return None


def _throughput(j: dict) -> float | None:
    """Every request's tokens a second: a batched engine's throughput, or a one-sequence loop's tokens/s."""
    if j.get("throughput_tokens_per_s") is not None:
        return j["throughput_tokens_per_s"]
    return j.get("tokens_per_s") if j.get("clock_unit") == "token" else None


def compare_json(snap_a, snap_b, same_source: bool = False) -> dict:
    """Both summaries, B over A for the figures a change moves, and where the two are not two runs of one model on
    one kind of device at one degree (`differ`: alike.differences; `same_source`: both name one recording)."""
    from decodemon.monitor.alike import differences
    from decodemon.monitor.render import summary_json

    ja, jb = summary_json(snap_a), summary_json(snap_b)
    of = dict(RATIO_OF)
    src_a, src_b = ja.get("gpu_busy_source"), jb.get("gpu_busy_source")
    if src_a != src_b:  # two instruments (or one side with no figure): the ratio says so, and never "None"
        of["gpu_busy_pct"] += (f" (A from {src_a or 'no instrument: no GPU busy figure'}, "
                               f"B from {src_b or 'no instrument: no GPU busy figure'}"
                               + (": two instruments)" if src_a and src_b else ")"))
    bytes_a, bytes_b = (_bytes_source(j) for j in (ja, jb))
    if bytes_a != bytes_b:  # one side measured, the other the model's: the ratio holds two instruments
        of["bytes_per_token"] += (f" (A's are {bytes_a or 'not known'}, B's {bytes_b or 'not known'}"
                                  + (": two instruments)" if bytes_a and bytes_b else ")"))
    apart = differences(snap_a, snap_b, same_source)
    if apart is not None:  # each ratio then measures a change of model or device as well as of code
        of = {k: f"{v}; {_apart_words(apart)}" for k, v in of.items()}
    floors = _floors_apart(ja, jb)
    if floors:  # no ratio divides by it, but each side's × floor figures are against its own bandwidth
        apart = {**(apart or {}), "bandwidth": floors}
    if src_a and src_b and src_a != src_b:  # the busy ratio's two instruments, named where the differences are
        apart = {**(apart or {}), "gpu_busy": f"A's GPU busy is from {src_a}, B's from {src_b}: two instruments"}
    # a loop of one sequence has no throughput figure of its own: its tokens/s is every request's tokens a second.
    # compare's own key gives each side's as the ratio divides it (never a ratio of two nulls); each side's summary
    # stays as `replay --json` prints it
    tput = {"a": _throughput(ja), "b": _throughput(jb)}
    ratios = {k: _ratio(jb.get(k), ja.get(k)) for k in RATIOS}
    ratios["throughput_tokens_per_s"] = _ratio(tput["b"], tput["a"])
    return {"differ": apart, "a": ja, "b": jb, "throughput_tokens_per_s": tput, "b_over_a": ratios,
            "b_over_a_of": of, "verdicts": [ja.get("verdict"), jb.get("verdict")]}


def collect_both(specs, settings, seconds, last_s=None) -> list:
    """Both sources read at once (two pids are watched over the same seconds), each summarised over its whole
    span (or its last `last_s`); the first failure is raised."""
    from decodemon.monitor.sources.collect import collect_many
    from decodemon.monitor.span import summary_snapshot

    sessions = collect_many(list(specs), settings, seconds)
    for s in sessions:
        if isinstance(s, Exception):
            raise s
    return [summary_snapshot(s, last_s) for s in sessions]


def run(a) -> int:
    """The app on both, or their JSON."""
    from decodemon.monitor.alike import same_source
    from decodemon.monitor.sources.collect import source_of

    for s in (a.a, a.b):
        source_of(s)
    settings = attach_settings(a)
    if a.json and (a.at is not None or a.paused or a.speed is not None):
        raise UsageError("decodemon compare: --at, --paused and --speed place the app's playback; --json summarises "
                         "each source whole, or its last S seconds with --last S (see `decodemon compare --help`)")
    need_json_for_last(a, "compare")
    if a.json:
        seconds = live_seconds(a, "compare", [a.a, a.b], JSON_SECONDS)
        snaps = collect_both((a.a, a.b), settings, seconds, a.last)
        empty = without_tokens("compare", snaps)
        if empty is not None:
            return empty
        out = compare_json(*snaps, same_source=same_source(a.a, a.b))
        for what, why in (out["differ"] or {}).items():  # said where a reader of the ratios looks first, too
            say("compare", why if what == "source" else f"the {DIFFER_NAMES[what]} differs: {why}"
                if what in ("bandwidth", "gpu_busy") else
                f"the {DIFFER_NAMES.get(what, what)} differs: {why}; the ratios B/A hold that difference too")
        print_json(out)
        return 0
    live_probe(a, "compare", [a.a, a.b])  # a probe option on two recordings: refused, not dropped
    need_terminal("compare", "add --json for the two summaries instead")
    from decodemon.monitor.app import run_app
    from decodemon.monitor.sources.pids import check_pid

    for s in (a.a, a.b):
        if s.isdigit():
            check_pid(int(s))  # one clear line before the screen opens

    return run_app([a.a, a.b], settings=settings, speed=a.speed or 1.0, start_at_s=a.at, paused=a.paused,
                   refresh_s=a.refresh, quit_after_s=a.seconds)
