"""`decodemon`: run, attach, record, replay, report, diagnose, compare, demo.

Exit codes: 0 ok; 2 bad input (bad arguments, no such pid, no agent, a
corrupt recording); 3 the target went away before anything was measured;
130 interrupted. Errors are one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from decodemon.monitor import _lean

_lean.start()  # before numpy's first import (client -> wire): a light start beside the decode loop

from decodemon.monitor.client import SourceError, live_frames, recording_frames  # noqa: E402
from decodemon.probes import wire  # noqa: E402

VERSION = "0.1.0"


class UsageError(Exception):
    """Bad input from the command line; str() is the one line to print."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not usage + traceback
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _positive(name, lo=0.0, hi=float("inf"), integer=False, allow_zero=False):
    def conv(s):
        try:
            v = int(s) if integer else float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, not {s!r}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be finite")
        ok = (lo <= v <= hi) if (lo != 0 or allow_zero) else (lo < v <= hi)
        if not ok:
            left = "[" if (lo != 0 or allow_zero) else "("
            raise argparse.ArgumentTypeError(f"{name} must be in {left}{lo:g}, {hi:g}], got {s}")
        return v
    return conv


def _attach_settings(a) -> wire.Attach:
    return wire.Attach(window_period_s=a.window_period, window_tokens=a.window_tokens,
                       window_min_tokens=a.window_min_tokens, window_max_s=max(a.window_max, a.window_period),
                       window_budget=a.window_budget,
                       pm_interval_us=a.pm_interval_us, trace=not a.no_trace, pm=not a.no_pm,
                       first_window_s=getattr(a, "first_window", None),
                       prepare_lead_tokens=getattr(a, "prepare_lead", 0),
                       api_every=getattr(a, "api_every", 4), agent_tick_s=getattr(a, "agent_tick", 0.25),
                       pm_pump_s=getattr(a, "pm_pump", 1.0), hold_gil=not getattr(a, "release_gil", False))


def _add_refresh_opt(p):
    p.add_argument("--refresh", type=_positive("--refresh", 0.05, 60), default=None, metavar="S",
                   help="seconds between screen refreshes (default 0.5; the screen's CPU runs beside the decode "
                        "loop, ~5%% of a core at 0.5 s, ~3%% at 1 s)")


def _add_probe_opts(p):
    p.add_argument("--window-period", type=_positive("--window-period", 0, 3600), default=4.0,
                   help="seconds between traced windows (default 4)")
    p.add_argument("--window-tokens", type=_positive("--window-tokens", 1, 64, True), default=1,
                   help="whole tokens per traced window (default 1)")
    p.add_argument("--window-min-tokens", type=_positive("--window-min-tokens", 0, 10**9, True, allow_zero=True),
                   default=250, help="tokens between windows, so their slow tokens stay under 1%% (default 250)")
    p.add_argument("--first-window", type=_positive("--first-window", 0, 3600, allow_zero=True), default=None,
                   help="seconds before the first traced window (default 0.5); for one rank of a tensor-parallel "
                        "group recorded on its own, stagger it by rank (attach to a group does this itself)")
    p.add_argument("--window-max", type=_positive("--window-max", 0, 3600), default=5.0,
                   help="but never more seconds than this between windows (default 5)")
    p.add_argument("--window-budget", type=_positive("--window-budget", 1, 10**9, True), default=500,
                   help="windows per target process at full cadence, then one a minute, and none after 4x: "
                        "each window leaves ~90-280 KB in the process for good (CUPTI) (default 500)")
    p.add_argument("--prepare-lead", type=_positive("--prepare-lead", 0, 64, True, allow_zero=True), default=0,
                   help="start CUPTI on the agent thread this many tokens before an eager window opens (default 0: "
                        "at the opening boundary, so the start-up lands in the traced token)")
    p.add_argument("--api-every", type=_positive("--api-every", 0, 10**6, True, allow_zero=True), default=4,
                   help="trace the launch calls (the timeline's CPU lane, which gaps the host caused) in one window "
                        "of every N, from the second window on; the others trace kernels only, which costs an "
                        "eager token 2-16 ms less (1: every window; 0: never; default 4)")
    p.add_argument("--agent-tick", type=_positive("--agent-tick", 0.01, 1.0), default=0.25, metavar="S",
                   help="seconds between the in-process agent's wake-ups; each takes the GIL from the decode thread "
                        "(default 0.25; 0.05 is how often it woke until the fifteenth session)")
    p.add_argument("--pm-pump", type=_positive("--pm-pump", 0.1, 10), default=1.0, metavar="S",
                   help="seconds between PM pumps in the agent thread; each pump's libcupti calls take the GIL back "
                        "from the decode thread (default 1; 0.5 until the fifteenth session)")
    p.add_argument("--release-gil", action="store_true",
                   help="the agent's short calls give the GIL up, as until the sixteenth session (each take-back "
                        "makes an eager decode thread wait); for A/B runs")
    p.add_argument("--pm-interval-us", type=_positive("--pm-interval-us", 100, 1_000_000, True), default=2000,
                   help="PM sampling interval in µs (default 2000)")
    p.add_argument("--no-trace", action="store_true", help="no CUPTI activity windows, counters only")
    p.add_argument("--no-pm", action="store_true", help="no PM sampling")


def _source_of(spec: str):
    """A pid (digits) or a recording path."""
    if spec.isdigit() or (spec.startswith("-") and spec[1:].isdigit()):
        return ("pid", int(spec))
    if not Path(spec).exists():
        raise UsageError(f"{spec}: no such recording file and not a pid")
    return ("file", spec)


def collect(spec, settings=None, seconds=None, record_to=None, on_frame=None):
    """Read a source to its end (file) or for `seconds` (pid) into a Session; optionally record it."""
    from decodemon.monitor.session import Session

    kind, val = _source_of(str(spec))
    sess = Session(label=str(spec))
    writer = None
    try:
        if kind == "pid":
            if record_to:
                writer = wire.RecordingWriter(record_to, wire.RecordingHeader(
                    wire_version=wire.WIRE_VERSION, created_unix_s=time.time(), decodemon_version=VERSION,
                    source=f"pid {val}"))
            frames = live_frames(val, settings, seconds)
        else:
            frames = recording_frames(val)
        for rx, payload, frame in frames:
            if writer is not None and not isinstance(frame, wire.RecordingHeader):
                if payload:
                    writer.write_payload(payload, rx)
                else:
                    writer.write(frame, rx)
            sess.add(rx, frame)
            if on_frame:
                on_frame(rx, frame)
    finally:
        if writer is not None:
            writer.close()
    return sess


def cmd_run(a) -> int:
    if not a.cmd:
        raise UsageError("decodemon run: give a command after --, e.g. `decodemon run -- python loop.py`")
    import importlib.util

    spec = importlib.util.find_spec("decodemon.probes._bootstrap")
    boot = list(spec.submodule_search_locations)[0]
    env = dict(os.environ)
    env["DECODEMON_AGENT"] = "1"
    env["PYTHONPATH"] = boot + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    import signal

    try:
        proc = subprocess.Popen(a.cmd, env=env)
    except OSError as exc:
        raise UsageError(f"decodemon run: cannot start {a.cmd[0]}: {exc.strerror}") from None
    print(f"decodemon: started pid {proc.pid}; attach with `decodemon attach {proc.pid}`", file=sys.stderr, flush=True)
    if a.pid_file:
        Path(a.pid_file).write_text(f"{proc.pid}\n")
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))  # the wrapper passes signals on, never dies first
    while True:
        try:
            rc = proc.wait()
            return rc if rc >= 0 else 128 - rc
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str, ensure_ascii=False))


def _staggered(settings: wire.Attach, ranks: int) -> list[wire.Attach]:
    """One rank traced at a time: rank r's first window r/N of a period after rank 0's (docs/tensor-parallel.md)."""
    import msgspec

    return [msgspec.structs.replace(settings, first_window_s=0.5 + r * settings.window_period_s / ranks)
            for r in range(ranks)]


def _collect_group(pids, settings, seconds):
    """Attach to every rank at once (one thread each) for `seconds`, their traced windows staggered by rank."""
    import threading

    out = {}

    def one(p, st):
        try:
            out[p] = collect(p, st, seconds)
        except (SourceError, wire.WireError) as exc:
            out[p] = exc

    threads = [threading.Thread(target=one, args=(p, st)) for p, st in zip(pids, _staggered(settings, len(pids)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[p] for p in pids]


def cmd_attach(a) -> int:
    if a.json:
        from decodemon.monitor.ranks import combine, discover_ranks
        from decodemon.monitor.session import summary_json

        from decodemon.monitor.client import check_pid

        check_pid(a.pid)
        pids = discover_ranks(a.pid)
        if len(pids) > 1:
            sessions = _collect_group(pids, _attach_settings(a), a.seconds)
            errors = [str(s) for s in sessions if isinstance(s, Exception)]
            snaps = [s.snapshot() for s in sessions if not isinstance(s, Exception)]
            first = summary_json(snaps[0]) if snaps else {}
            first["group"] = combine(snaps)
            if errors:
                first["group"]["errors"] = errors
            _print_json(first)
            return 0
        sess = collect(a.pid, _attach_settings(a), a.seconds)
        snap = sess.snapshot()
        if snap.tokens is None and snap.ended:
            print(f"decodemon: {snap.ended} before any tokens were measured", file=sys.stderr)
            _print_json(summary_json(snap))
            return 3
        _print_json(summary_json(snap))
        return 0
    from decodemon.monitor.app import run_app
    from decodemon.monitor.client import check_pid
    from decodemon.monitor.ranks import discover_ranks

    check_pid(a.pid)
    pids = discover_ranks(a.pid)
    if len(pids) > 1:  # a tensor-parallel group: every rank side by side, under the group's figures
        return run_app([str(p) for p in pids], settings=_staggered(_attach_settings(a), len(pids)),
                       labels=[f"rank {r} · pid {p}" for r, p in enumerate(pids)], group=True, refresh_s=a.refresh)
    return run_app([str(a.pid)], settings=_attach_settings(a), refresh_s=a.refresh)


def cmd_record(a) -> int:
    sess = collect(a.pid, _attach_settings(a), a.seconds, record_to=a.output)
    snap = sess.snapshot()
    print(f"decodemon: recorded {snap.tokens_total} tokens, {snap.windows_seen} traced windows to {a.output}",
          file=sys.stderr)
    return 0


def cmd_replay(a) -> int:
    for f in a.files:
        _source_of(f)
        if f.isdigit():
            raise UsageError(f"{f}: replay takes recordings; to watch a live pid use `decodemon attach {f}`")
    if a.json:
        from decodemon.monitor.session import summary_json

        snaps = [collect(f).snapshot() for f in a.files]
        out = summary_json(snaps[0])
        if len(snaps) > 1:  # one recording per rank: the group view, as `attach --json` shows it live
            from decodemon.monitor.ranks import combine

            out["group"] = combine(snaps)
        _print_json(out)
        return 0
    from decodemon.monitor.app import run_app

    # several recordings are the ranks of one group (two runs side by side: `decodemon compare`)
    return run_app(a.files, speed=a.speed, start_at_s=a.at, paused=a.paused, group=len(a.files) > 1,
                   refresh_s=a.refresh)


def cmd_report(a) -> int:
    from decodemon.monitor.report import diagnosis_markdown
    from decodemon.monitor.session import summary_json

    kind, _ = _source_of(a.source)
    sess = collect(a.source, _attach_settings(a), a.seconds if kind == "pid" else None)
    snap = sess.snapshot()
    if a.json:
        _print_json(summary_json(snap))
    md = diagnosis_markdown(snap)
    if a.output:
        Path(a.output).write_text(md)
        print(f"decodemon: wrote {a.output} ({snap.diagnosis.ceiling.upper()})", file=sys.stderr)
    elif not a.json:
        print(md)
    return 0


def cmd_diagnose(a) -> int:
    from decodemon.monitor import diagnosis as dx
    from decodemon.monitor.report import diagnose_text

    if (a.speedup is None) != (a.n is None):
        raise UsageError("decodemon diagnose: --speedup and --n go together")
    if a.us_per_collective is not None and a.collectives_per_token is None:
        raise UsageError("decodemon diagnose: --us-per-collective needs --collectives-per-token")
    if a.n is not None and a.n < 2:
        raise UsageError("decodemon diagnose: --n must be at least 2 for a serial fraction")
    inp = dx.Inputs(ms_per_token=a.ms_per_token, launches_per_token=a.launches_per_token,
                    bytes_per_token=a.bytes_per_token, bandwidth_gbs=a.bandwidth_gbs,
                    collectives_per_token=a.collectives_per_token, us_per_collective=a.us_per_collective)
    d = dx.diagnose(inp, speedup=a.speedup, n=a.n)
    if a.json:
        _print_json(d.as_json())
    else:
        print(diagnose_text(d))
    return 0


def cmd_compare(a) -> int:
    for s in (a.a, a.b):
        _source_of(s)
    from decodemon.monitor.app import run_app

    return run_app([a.a, a.b], settings=_attach_settings(a), speed=a.speed, start_at_s=a.at, paused=a.paused,
                   refresh_s=a.refresh)


def cmd_scaling(a) -> int:
    from decodemon.monitor.ranks import serial_fraction_of_runs

    snaps = []
    for f in (a.one, a.many):
        if not Path(f).is_file():
            raise UsageError(f"decodemon scaling: {f}: no such recording")
        snap = collect(f).snapshot()
        if snap.tokens is None:
            raise UsageError(f"decodemon scaling: {f} has no token timing")
        snaps.append(snap)
    s1, sn = snaps
    n1 = s1.model.tp_degree if s1.model else 1
    nn = a.n or (sn.model.tp_degree if sn.model else 1)
    if nn <= n1:
        raise UsageError(f"decodemon scaling: the second run has {nn} ranks and the first {n1}; give --n")
    s = serial_fraction_of_runs(s1.tokens.ms_per_token, n1, sn.tokens.ms_per_token, nn)
    stale = s1.rolling.ceiling != sn.rolling.ceiling
    applies = 0.0 <= s <= 1.0
    res = {"n1": n1, "n": nn, "ms_per_token_n1": round(s1.tokens.ms_per_token, 4),
           "ms_per_token_n": round(sn.tokens.ms_per_token, 4),
           "speedup": round(s1.tokens.ms_per_token / sn.tokens.ms_per_token, 4), "serial_fraction": round(s, 4),
           "verdicts": [s1.rolling.ceiling, sn.rolling.ceiling], "stale": stale, "amdahl_applies": applies,
           "note": ("the binding ceiling differs between the two runs: the figure mixes two bottlenecks; "
                    "re-derive it once the change has settled" if stale else
                    "re-derive after every win: a serial fraction measured before an optimisation is not valid after it")}
    if not applies:
        res["note"] = (f"{nn} ranks are {'slower than' if s > 1 else 'more than ' + str(round(nn / n1)) + 'x faster than'}"
                       f" {n1}: no serial fraction between 0 and 1 explains that, so Amdahl's law does not apply "
                       "(work that grows with the rank count, such as the all-reduces, or a change between the runs); "
                       "s is the algebra's value only")
    if a.json:
        _print_json(res)
    else:
        print(f"speedup {res['speedup']:.3f}x at N={nn} over N={n1}: serial fraction s = {res['serial_fraction']:.3f}"
              + (f" (STALE: {res['note']})" if stale and applies else "")
              + (f" ({res['note']})" if not applies else ""))
    return 0


def cmd_allreduce(a) -> int:
    cmd = [sys.executable, "-m", "decodemon.engine_adapter.collective_bench", "--payload-bytes",
           str(a.payload_bytes), "--tp", str(a.tp), "--iters", str(a.iters), "--calls", str(a.calls)] \
        + (["--device", a.device] if a.device else []) + (["--dtype", a.dtype] if a.dtype else []) \
        + (["--spacer-in", a.spacer_in] if a.spacer_in else []) + (["--profile-kernels"] if a.profile_kernels else []) \
        + (["--json"] if a.json else [])
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    return subprocess.run(cmd, env=env).returncode


def cmd_demo(a) -> int:
    from decodemon.monitor.demo import run_demo

    return run_demo(replay=a.replay, tokens=a.tokens, speed=a.speed, seconds=a.seconds, refresh_s=a.refresh)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="decodemon", description="Watch an LLM decode loop and name the ceiling that binds the token.")
    ap.add_argument("--version", action="version", version=f"decodemon {VERSION}")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("run", help="start a command with the probe agent loaded and print its pid")
    p.add_argument("--pid-file", help="also write the pid here")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("attach", help="attach to a running decode loop (the app, or --json)")
    p.add_argument("pid", type=_positive("pid", 1, 2**31, True))
    p.add_argument("--json", action="store_true", help="print one JSON summary and detach")
    p.add_argument("--seconds", type=_positive("--seconds", 0, 86400), default=10.0,
                   help="with --json: seconds to collect (default 10)")
    _add_probe_opts(p)
    _add_refresh_opt(p)
    p.set_defaults(fn=cmd_attach)

    p = sub.add_parser("record", help="attach and write a .dmon recording")
    p.add_argument("pid", type=_positive("pid", 1, 2**31, True))
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--seconds", type=_positive("--seconds", 0, 86400), default=20.0)
    _add_probe_opts(p)
    p.set_defaults(fn=cmd_record)

    p = sub.add_parser("replay", help="play a recording in the app, or summarise it with --json "
                                      "(several: one per rank of a tensor-parallel group, shown as a group)")
    p.add_argument("files", nargs="+", metavar="file")
    p.add_argument("--json", action="store_true")
    p.add_argument("--speed", type=_positive("--speed", 0, 1000), default=1.0)
    p.add_argument("--at", type=_positive("--at", 0.0, 1e6, allow_zero=True), default=None,
                   help="start at this many seconds into the recording")
    p.add_argument("--paused", action="store_true", help="open paused (space plays)")
    _add_refresh_opt(p)
    p.set_defaults(fn=cmd_replay)

    p = sub.add_parser("report", help="write DIAGNOSIS.md for a pid or a recording")
    p.add_argument("source", help="pid or .dmon file")
    p.add_argument("-o", "--output")
    p.add_argument("--json", action="store_true")
    p.add_argument("--seconds", type=_positive("--seconds", 0, 86400), default=10.0)
    _add_probe_opts(p)
    p.set_defaults(fn=cmd_report)

    p = sub.add_parser("diagnose", help="the seeds' arithmetic from numbers alone (no GPU)")
    p.add_argument("--ms-per-token", type=_positive("--ms-per-token", 0, 1e7))
    p.add_argument("--launches-per-token", type=_positive("--launches-per-token", 0, 1e9))
    p.add_argument("--bytes-per-token", type=_positive("--bytes-per-token", 0, 1e15))
    p.add_argument("--bandwidth-gbs", type=_positive("--bandwidth-gbs", 0, 1e7))
    p.add_argument("--collectives-per-token", type=_positive("--collectives-per-token", 0.0, 1e7, allow_zero=True))
    p.add_argument("--us-per-collective", type=_positive("--us-per-collective", 0, 1e9))
    p.add_argument("--speedup", type=_positive("--speedup", 0, 1e6))
    p.add_argument("--n", type=_positive("--n", 0, 1e6, True))
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_diagnose)

    p = sub.add_parser("compare", help="two sources side by side (pids or recordings)")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--speed", type=_positive("--speed", 0, 1000), default=1.0)
    p.add_argument("--at", type=_positive("--at", 0.0, 1e6, allow_zero=True), default=None,
                   help="recordings: start at this many seconds")
    p.add_argument("--paused", action="store_true", help="recordings: open paused")
    _add_probe_opts(p)
    _add_refresh_opt(p)
    p.set_defaults(fn=cmd_compare)

    p = sub.add_parser("scaling", help="Amdahl's serial fraction from a run at N1 ranks and one at N (recordings)")
    p.add_argument("one", help="recording at the lower rank count (usually TP=1)")
    p.add_argument("many", help="recording at N ranks")
    p.add_argument("--n", type=_positive("--n", 0, 1e6, True), default=None, help="ranks of the second run "
                   "(default: from its model facts)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_scaling)

    p = sub.add_parser("allreduce", help="all-reduce latency at 1x, 8x and 64x a payload (§2's lab)")
    p.add_argument("--payload-bytes", type=_positive("--payload-bytes", 0, 1 << 34, True), required=True)
    p.add_argument("--tp", type=_positive("--tp", 1, 64, True), default=2)
    p.add_argument("--iters", type=_positive("--iters", 0, 1e6, True), default=200)
    p.add_argument("--calls", type=_positive("--calls", 0, 10_000, True), default=50,
                   help="all-reduces per CUDA graph (timed by CUDA events around replays)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None)
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                   help="element type (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--spacer-in", default=None,
                   help="CUDA: input widths of the GEMVs placed before each timed call, comma-separated: the decode's "
                        "o_proj and down_proj shards (e.g. 1024,1536 for Qwen3-0.6B at TP=2)")
    p.add_argument("--profile-kernels", action="store_true",
                   help="CUDA: also read the NCCL kernels' own durations with torch.profiler")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_allreduce)

    p = sub.add_parser("demo", help="eager vs graphed, live on a GPU or from bundled H200 recordings")
    p.add_argument("--replay", action="store_true", help="play the bundled recordings even with a GPU")
    p.add_argument("--tokens", type=_positive("--tokens", 0, 1e9, True), default=0)
    p.add_argument("--speed", type=_positive("--speed", 0, 1000), default=1.0)
    p.add_argument("--seconds", type=_positive("--seconds", 0, 86400), default=None,
                   help="quit after this many seconds")
    _add_refresh_opt(p)
    p.set_defaults(fn=cmd_demo)
    return ap


def main(argv=None) -> int:
    """Entry point of the `decodemon` command."""
    try:
        a = build_parser().parse_args(argv)
        if not getattr(a, "fn", None):
            build_parser().print_help()
            return 2
        if a.command == "run" and a.cmd and a.cmd[0] == "--":
            a.cmd = a.cmd[1:]
        return a.fn(a)
    except UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except (SourceError, wire.WireError) as exc:
        print(f"decodemon: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
