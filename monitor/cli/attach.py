"""`decodemon attach PID`: watch a running decode loop in the app, or print one JSON summary (`--json`).

A pid whose children are ranks of a tensor-parallel group (each with an agent) is watched as the group, every
rank traced in its turn (`sources.staggered`)."""

from __future__ import annotations

import sys

from decodemon.monitor.cli._common import (add_last, add_pid, add_probe, add_refresh, add_seconds, attach_settings,
                                           need_json_for_last, need_terminal, print_json, resolve_pid)
from decodemon.monitor.sources.collect import collect, collect_many, staggered

JSON_SECONDS = 10.0


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("attach", help="watch a running decode loop (the app, or --json)",
                       description="Attach to a running decode loop, watch it, and detach; the loop is never "
                                   "stopped. A Python process without the agent (CPython 3.10-3.14) gets it loaded "
                                   "without a restart; `decodemon run` starts one with it.")
    add_pid(p)
    p.add_argument("--json", action="store_true",
                   help="collect, print one JSON summary of the seconds watched and detach (its first key, span, "
                        "says what it covers; rolling_5s gives the last 5 s beside it)")
    add_seconds(p, None, f"seconds to watch, then detach (app: until q; --json: {JSON_SECONDS:g}, all of them "
                         "summarised)")
    add_last(p)
    add_probe(p)
    add_refresh(p)
    from decodemon.monitor.exporter.serve import parse_address

    p.add_argument("--prometheus", type=parse_address, default=None, metavar="HOST:PORT",
                   help="serve this process's metrics for Prometheus at HOST:PORT/metrics instead of the app")
    p.set_defaults(fn=run)


def _collect_group(pids, settings, seconds):
    """Attach to every rank at once (one thread each) for `seconds`, their traced windows staggered by rank."""
    return collect_many(pids, staggered(settings, len(pids)), seconds,
                        collect_one=lambda p, st, s: collect(p, st, s))


def attach_json(pid: int, settings, seconds: float, last_s: float | None = None) -> int:
    """Print the summary of `seconds` attached to `pid` (or to its group), or of their last `last_s`; 3 if it
    ended before a token."""
    from decodemon.monitor.sources.pids import check_pid, process_age_s
    from decodemon.monitor.ranks import combine, discover_ranks
    from decodemon.monitor.render import summary_json
    from decodemon.monitor.span import summary_snapshot

    check_pid(pid)
    pids = discover_ranks(pid)
    if len(pids) > 1:
        sessions = _collect_group(pids, settings, seconds)
        errors, snaps = [], []
        for p, s in zip(pids, sessions):
            snap = None if isinstance(s, Exception) else summary_snapshot(s, last_s)
            if snap is not None and not (snap.tokens is None and snap.ended and snap.model is None):
                snaps.append(snap)
                continue
            why = str(s) if snap is None else snap.ended  # it failed, or was refused (busy) or gone before a word
            errors.append(f"pid {p}: {why}")
            print(f"decodemon attach: rank pid {p}: {why}", file=sys.stderr)
        out = summary_json(snaps[0]) if snaps else {}
        out["group"] = combine(snaps)
        out["group"]["tp"] = len(pids)  # the group found, whether or not every rank answered
        if errors:
            out["group"]["errors"] = errors
        print_json(out)
        return 0 if snaps else 3  # no rank answered: nothing was measured
    sess = collect(pid, settings, seconds)
    snap = summary_snapshot(sess, last_s)
    if snap.device_only and snap.tokens is None:
        if not snap.pm:
            why = snap.probe.get("pm") or "no PM sample arrived"
            print(f"decodemon attach: pid {pid} has no clock decodemon can read, and its GPU's counters gave "
                  f"nothing: pm {why}", file=sys.stderr)
            print_json(summary_json(snap))
            return 3
        print_json(summary_json(snap))
        return 0
    if snap.tokens is None and snap.ended:
        if snap.probe.get("token_clock") == "server_metrics":
            idle = " (llama-server had no request generating long enough to time its steps)"
        elif not snap.pid:  # refused (busy) or gone before its hello: nothing is known of its clock
            idle = ""
        elif (age := process_age_s(pid)) is not None and age < YOUNG_S:
            idle = (f" (pid {pid} started {age:.1f} s ago and had not marked a token yet: it may still be loading, "
                    "importing its engine or reading its weights; attach again once it decodes"
                    + ("; if it decodes already, it has no clock decodemon can read: an engine adapter, mark_token() "
                       "or --token-range NAME gives it one)" if not snap.sm_count else ")"))
        elif not snap.sm_count:  # no GPU in it: no window can find the steps either
            idle = (" (it marked no token and has no GPU to find its steps on: an engine adapter, mark_token() or "
                    "--token-range NAME gives it a clock)")
        else:
            idle = ""
        refused = not snap.pid and snap.ended.startswith("busy")  # another monitor is attached: said as it is
        print(f"decodemon attach: {snap.ended}" + ("" if refused else f" before any tokens were measured{idle}"),
              file=sys.stderr)
        print_json(summary_json(snap))
        return 3
    summary = summary_json(snap)
    from decodemon.monitor.cli.report import grade_in_ledger

    grade_in_ledger("attach", None, sess, summary, f"pid {pid}")  # the next attach of the loop grades it too
    print_json(summary)
    return 0


# a process this young that marked nothing may not have begun decoding (torch's import alone takes seconds)
YOUNG_S = 60.0


def run(a) -> int:
    """The app on the pid (or its group) until q or `--seconds`; with --json, the summary."""
    pid = resolve_pid(a)
    settings = attach_settings(a)
    need_json_for_last(a, "attach")
    if a.prometheus is not None:
        from decodemon.monitor.exporter.serve import serve_pid

        return serve_pid(pid, *a.prometheus, settings=settings, seconds=a.seconds)
    if a.json:
        return attach_json(pid, settings, a.seconds or JSON_SECONDS, a.last)
    from decodemon.monitor.sources.pids import check_pid, require_process

    require_process(pid)  # a missing pid first: it is the news, not the terminal
    need_terminal("attach")
    from decodemon.monitor.app import run_app
    from decodemon.monitor.ranks import discover_ranks

    check_pid(pid)
    pids = discover_ranks(pid)
    for p in pids:  # each rank, this one again, answers before the screen opens (one clear line if not)
        check_pid(p)
    if len(pids) > 1:  # a tensor-parallel group: every rank side by side, under the group's figures
        return run_app([str(p) for p in pids], settings=staggered(settings, len(pids)),
                       labels=[f"rank {r} · pid {p}" for r, p in enumerate(pids)], group=True, refresh_s=a.refresh,
                       quit_after_s=a.seconds)
    return run_app([str(pid)], settings=settings, refresh_s=a.refresh, quit_after_s=a.seconds)
