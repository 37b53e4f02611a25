"""The depth sweep: one decode command at several context depths (and a reference beside it), attached at each.

One profile is a diagnosis of one depth. The sweep starts the command once per depth with the agent loaded (as
`decodemon run` does), attaches for some seconds, keeps the summary and the depth bands, and stops it; then it
writes the table, the plot and one sentence on the divergence: which resource depth consumes.

    "CMD --max-len {depth}" x depths --> start under the agent --> attach N s --> summary + bands --> stop
                                     --> sweep.json, sweep.md (table + sentence), sweep.svg, sweep.png

With -o, each run is also kept as a recording in DIR, so `sweep --replay DIR` rebuilds the same table on a
machine without a GPU.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from decodemon.monitor.analysis.agreement import kernels_past_step
from decodemon.monitor.analysis.depth import session_depth_bands
from decodemon.monitor.ceilings import Inputs, bandwidth_floor_ms
from decodemon.monitor.divergence import DRAM_READ_WRITE, WEIGHTS_KV, divergence
from decodemon.probes import wire
from decodemon.monitor.sources import agent_socket

PLACEHOLDER = "{depth}"
MS_NOTE = ("each point's figures are the last 5 s of its attach: ms_per_token the median of those seconds' token "
           "steps, tokens how many they were; its bytes_per_token and bandwidth_x_floor are the ones its verdict "
           "priced (bytes_source says which), as replay --json's; bytes_per_token_model is the model's weights + KV "
           "at the swept depth (bytes_per_token_model_depth) where the engine gave its facts, with "
           "bandwidth_x_model_floor the floor those set, which the divergence reads; each depth band covers every "
           "mark the attach kept (the whole attach, not its last 5 s), its ms_per_token the median of that band's "
           "tokens")


class SweepError(Exception):
    """A sweep that cannot start (a command without {depth}, no depths); str() is one line."""


def argv_at(template: str, depth: int) -> list[str]:
    """The command with {depth} filled in, split as a shell would."""
    if PLACEHOLDER not in template:
        raise SweepError(f"the command must contain {PLACEHOLDER} where the depth goes: {template!r}")
    try:
        argv = shlex.split(template.replace(PLACEHOLDER, str(int(depth))))
    except ValueError as exc:
        raise SweepError(f"cannot split the command {template!r}: {exc}") from None
    if not argv:
        raise SweepError("the command is empty")
    return argv


def bytes_source(summary: dict) -> str | None:
    """What a summary_json's bytes_per_token is: the DRAM counters' read + write bytes when it is their figure,
    else the model's weights plus KV (None without a figure)."""
    b, measured = summary.get("bytes_per_token"), summary.get("bytes_per_token_measured")
    if not b:
        return None
    return DRAM_READ_WRITE if measured and abs(b - measured) <= 1.0 else WEIGHTS_KV


def band_kernels_past_step(band: dict) -> str | None:
    """A depth band's traced kernels (their union, where the band has it) past its median step, in the words the
    rest of decodemon uses (None where they fit inside it)."""
    s = SimpleNamespace(inputs=Inputs(ms_per_token=band.get("ms_per_token"),
                                      kernel_sum_ms_per_token=band.get("kernel_sum_ms_per_token"),
                                      kernel_busy_ms_per_token=band.get("kernel_busy_ms_per_token")))
    return kernels_past_step(s) or None


def point_of(summary: dict, bands: list[dict], name: str, depth: int, model=None) -> dict:
    """One sweep point from a summary_json: the median ms/token, launches, bytes (and what they are), the
    bandwidth they are priced at, the ceiling and its number; each depth band flagged where its traced kernels
    sum past its median step.

    bytes_per_token and bandwidth_x_floor are the ones the verdict priced, as `replay --json` gives them (the DRAM
    counters' where PM read them); with the engine's model facts, bytes_per_token_model is the weights plus the KV
    cache at the swept depth and bandwidth_x_model_floor the floor those set, which the divergence reads (an engine
    whose marks wrap around inside its cache reports every depth below it on the way)."""
    x_floor = ((summary.get("candidates") or {}).get("bandwidth") or {}).get("value")  # the verdict's, as replay's
    model_b = x_model = None
    if model is not None:  # the model's at the swept depth, and the floor they set: what depth reads
        model_b = float(model.bytes_per_token(depth))
        ms, bw = summary.get("ms_per_token"), summary.get("bandwidth_gbs")
        x_model = ms / bandwidth_floor_ms(model_b, bw) if ms and bw else None
    verdict = summary.get("verdict") or "unknown"
    cand = (summary.get("candidates") or {}).get(verdict) or {}
    return {"command": name, "depth": int(depth), "ms_per_token": summary.get("ms_per_token"),
            "kernels_per_token": summary.get("kernels_per_token"), "bytes_per_token": summary.get("bytes_per_token"),
            "bytes_source": bytes_source(summary),
            "bytes_per_token_measured": summary.get("bytes_per_token_measured"), "bytes_per_token_model": model_b,
            # the depth the model's bytes are priced at, as replay's key of that name says it (the swept depth here)
            "bytes_per_token_model_depth": int(depth) if model_b else None,
            # the weights alone, which every token reads once (None without the engine's facts)
            "weight_bytes": int(model.weight_bytes) if model is not None else None,
            "bandwidth_gbs": summary.get("bandwidth_gbs"), "bandwidth_source": summary.get("bandwidth_source"),
            "kernels_past_step": summary.get("kernels_past_step"),
            "verdict": verdict, "ceiling_value": cand.get("value"), "ceiling_unit": cand.get("unit", ""),
            "ceiling_detail": cand.get("detail", ""), "tokens": (summary.get("span") or {}).get("tokens"),
            "us_per_kernel": summary.get("us_per_kernel"),
            "bandwidth_x_floor": x_floor, "bandwidth_x_model_floor": x_model,
            "small_grid_share_pct": ((summary.get("candidates") or {}).get("occupancy") or {}).get("value"),
            "depth_bands": [{**b, "kernels_past_step": band_kernels_past_step(b)} for b in bands], "error": None}


def _wait_for_agent(proc: subprocess.Popen, timeout_s: float) -> str | None:
    """None once the agent's socket is up, else why not."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if agent_socket.find(proc.pid) is not None:
            return None
        if proc.poll() is not None:
            return f"the command exited ({proc.returncode}) before its agent started"
        time.sleep(0.05)
    return f"no agent socket after {timeout_s:g} s"


def _wait_for_tokens(pid: int, timeout_s: float, attach_s: float = 2.0) -> None:
    """Return once `pid` marks a token, or after `timeout_s`: a command builds its model and warms up after its
    agent starts, and an attach timed from then measured nothing on an H200 (a loop that marks no token waits the
    whole timeout, then is attached all the same). Light attaches (no trace, no counters) of `attach_s` each, one
    after another: an engine adapter hooks the engine at the attach, and an engine imported after an attach began
    is hooked by the next one."""
    from decodemon.monitor.sources.live import live_frames

    seen: list = []
    deadline = time.monotonic() + timeout_s
    while not seen and time.monotonic() < deadline:
        for _, _, frame in live_frames(pid, wire.Attach(trace=False, pm=False, nvml_hz=0),
                                       seconds=min(attach_s, max(0.1, deadline - time.monotonic())),
                                       stop=lambda: bool(seen)):
            if isinstance(frame, wire.TokenMarks) and len(frame.t_ns.array()):
                seen.append(True)
            elif isinstance(frame, wire.Bye) and "went away" in frame.reason:
                return


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:200] if lines else ""


def run_point(template: str, depth: int, name: str, seconds: float, settings=None, start_timeout_s: float = 180,
              record_to=None) -> dict:
    """Start the command at `depth` under the agent, attach for `seconds`, stop it; the point (or its error)."""
    from decodemon.monitor.sources.pids import agent_env
    from decodemon.monitor.sources.errors import SourceError
    from decodemon.monitor.sources.collect import collect

    argv = argv_at(template, depth)
    with tempfile.NamedTemporaryFile("w+", prefix="decodemon-sweep-", suffix=".err", delete=False) as err:
        err_path = Path(err.name)
    try:
        with open(err_path, "w") as err:
            try:
                proc = subprocess.Popen(argv, env=agent_env(), stdout=subprocess.DEVNULL, stderr=err,
                                        stdin=subprocess.DEVNULL)
            except OSError as exc:
                return _failed(name, depth, f"cannot start {argv[0]}: {exc.strerror or exc}")
        try:
            why = _wait_for_agent(proc, start_timeout_s)
            if why:
                return _failed(name, depth, why + (f": {_tail(err_path)}" if _tail(err_path) else ""))
            _wait_for_tokens(proc.pid, start_timeout_s)
            sess = collect(str(proc.pid), settings, seconds, record_to=record_to)
        except SourceError as exc:
            try:
                proc.wait(timeout=1.0)  # a command that ended while it was being attached: its own words say why
            except subprocess.TimeoutExpired:
                return _failed(name, depth, str(exc))
            tail = _tail(err_path)
            return _failed(name, depth, f"the command exited ({proc.returncode})" + (f": {tail}" if tail else ""))
        finally:
            _stop(proc)
    finally:
        err_path.unlink(missing_ok=True)
    pt = _point(sess, name, depth)
    if record_to:
        pt["recording"] = Path(record_to).name
    return pt


def _point(sess, name: str, depth: int) -> dict:
    from decodemon.monitor.render import summary_json

    snap = sess.snapshot()
    model = sess.feed.hello.model if sess.feed.hello else None
    return point_of(summary_json(snap), [b.as_json() for b in session_depth_bands(sess, snap)], name, depth, model)


def _failed(name: str, depth: int, why: str) -> dict:
    return {"command": name, "depth": int(depth), "ms_per_token": None, "verdict": "unknown", "error": why}


def sweep(template: str, depths, reference: str | None = None, seconds: float = 15.0, settings=None,
          outdir=None, runner=run_point, on_point=None) -> dict:
    """Run the command (and the reference) at each depth, shallow first; the sweep's result as plain values."""
    depths = sorted({int(d) for d in depths})
    if not depths:
        raise SweepError("give at least one depth")
    commands = [("candidate", template)] + ([("reference", reference)] if reference else [])
    for _, t in commands:
        argv_at(t, depths[0])  # a template without {depth} fails before anything starts
    points = []
    for d in depths:
        for name, t in commands:
            rec = str(Path(outdir) / f"{name}_{d}.dmon") if outdir else None
            pt = runner(t, d, name, seconds, settings, record_to=rec)
            points.append(pt)
            if on_point:
                on_point(pt)
    result = {"commands": dict(commands), "depths": depths, "seconds": seconds, "ms_per_token_note": MS_NOTE,
              "points": points}
    result["divergence"] = divergence(points)
    return result


def replay(outdir) -> dict:
    """The sweep rebuilt from the recordings its run kept in `outdir` (its sweep.json names them)."""
    from decodemon.monitor.sources.collect import collect

    d = Path(outdir)
    if not d.is_dir():
        raise SweepError(f"{d}: no such directory (give the folder a sweep wrote with -o)")
    if not (d / "sweep.json").exists():
        raise SweepError(f"{d} holds no sweep.json: --replay rebuilds a sweep from the folder `decodemon sweep -o` "
                         "wrote (its sweep.json names the recordings)")
    try:
        old = json.loads((d / "sweep.json").read_text())
    except (OSError, ValueError) as exc:
        raise SweepError(f"cannot read {d / 'sweep.json'}: {getattr(exc, 'strerror', None) or exc}") from None
    if not isinstance(old, dict) or not isinstance(old.get("points", []), list) or not all(
            isinstance(p, dict) and "command" in p and "depth" in p for p in old.get("points", [])):
        raise SweepError(f"{d / 'sweep.json'} is not a sweep's file (a list of points, each with command and depth)")
    points = []
    for p in old.get("points", []):
        if not p.get("recording"):
            points.append(p)
            continue
        pt = _point(collect(str(d / p["recording"])), p["command"], p["depth"])
        pt["recording"] = p["recording"]
        points.append(pt)
    result = {**old, "ms_per_token_note": MS_NOTE, "points": points}
    result["divergence"] = divergence(points)
    result["rebuilt_note"] = rebuilt_note(old, result)
    return result


# the figures a rebuilt point may read differently from the kept sweep.json's (live) one
REBUILT_KEYS = ("tokens", "ms_per_token", "bandwidth_x_floor", "verdict")


def rebuilt_note(old: dict, new: dict) -> str | None:
    """Where the rebuilt sweep reads otherwise than the kept sweep.json: which figures at which depths, and why
    (None where they agree). The kept points were read live, each as its attach detached, by the decodemon that
    ran them; the rebuilt ones are read from each recording to its last frame by this one."""
    moved = []
    for was, now in zip(old.get("points", []), new["points"]):
        if not now.get("recording"):
            continue
        for k in REBUILT_KEYS:
            a, b = was.get(k), now.get(k)
            if k == "bandwidth_x_floor" and was.get("bytes_source") == WEIGHTS_KV \
                    and "bytes_per_token_model" not in was:  # a sweep.json whose floor was its model bytes'
                b = now.get("bandwidth_x_model_floor", b)
            same = a == b or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                              and abs(a - b) <= 0.005 * max(abs(a), abs(b)))
            if not same:
                moved.append(f"{k} at {now['command']} {now['depth']:,} ({_said(a)} → {_said(b)})")
    if not moved and old.get("divergence") in (None, new["divergence"]):
        return None
    return ("the rebuilt points differ from the kept sweep.json's: "
            + ("; ".join(moved) + "; " if moved else "") +
            ("its conclusion is re-read from the rebuilt points; " if old.get("divergence") != new["divergence"]
             else "") +
            "the recordings are the same, the readers are not: the kept points were read live by the decodemon that "
            "ran the sweep, each over the 5 s before its attach detached, the rebuilt ones by this one over the 5 s "
            "before each recording's last frame (a version may count a point's tokens over another span, and price "
            "the floor otherwise)")


def _said(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v).upper() if isinstance(v, str) else str(v)


def series_of(points: list[dict]) -> list[tuple[str, list[tuple[int, float, str]]]]:
    """The points as the plots' series: [(command, [(depth, median ms/token, ceiling), ...])], candidate first."""
    names = list(dict.fromkeys(p["command"] for p in points))
    return [(n, [(p["depth"], p["ms_per_token"], p["verdict"]) for p in points
                 if p["command"] == n and p.get("ms_per_token")]) for n in names]


def markdown(result: dict) -> str:
    """sweep.md: the commands, the table (depth, command, median ms/token, launches, MB/token, ceiling and its
    number) and the sentence on the divergence."""
    from decodemon.monitor.safe_text import markdown as md
    from decodemon.monitor.safe_text import markdown_code, visible_lines

    # the commands, their names and errors (a command's own stderr) are the user's or a replayed sweep.json's:
    # escaped, so none of them can make a link, HTML or a new cell
    lines = ["# Depth sweep", ""]
    for name, cmd in result["commands"].items():
        lines.append(f"- {md(name)}: {markdown_code(cmd)}")
    lines += ["", f"Attached {result['seconds']:g} s at each depth; the figures are the last 5 s of each attach "
              "(median ms/token: the median of those seconds' token steps). Model MB/token is the weights + KV at "
              "the swept depth where the engine gave its facts, else the DRAM counters' read + write (said in the "
              "cell); DRAM MB/token is the counters' read + write over the span's tokens.", "",
              "| depth | command | median ms/token | kernels/token | model MB/token | DRAM MB/token | ceiling "
              "| its number |",
              "|---:|---|---:|---:|---:|---:|---|---|"]
    for p in result["points"]:
        if p.get("error"):
            lines.append(f"| {p['depth']:,} | {md(p['command'])} | — | — | — | — | not measured | {md(p['error'])} |")
            continue
        num = (f"{p['ceiling_value']:.4g} {md(p['ceiling_unit'])}" if p.get("ceiling_value") is not None else "—")
        model_b = _model_bytes(p)
        mb = f"{model_b / 1e6:.4g}" if model_b else "—"
        if not model_b and p.get("bytes_per_token") and p.get("bytes_source") == DRAM_READ_WRITE:
            mb = f"{p['bytes_per_token'] / 1e6:.4g} (DRAM's: no model facts)"
        dram = p.get("bytes_per_token_measured") or (p.get("bytes_per_token") if p.get("bytes_source") ==
                                                     DRAM_READ_WRITE else None)
        dram_mb = f"{dram / 1e6:.4g}" if dram else "—"
        lp = f"{p['kernels_per_token']:.0f}" if p.get("kernels_per_token") else "—"
        lines.append(f"| {p['depth']:,} | {md(p['command'])} | {p['ms_per_token']:.4g} | {lp} | {mb} | {dram_mb} "
                     f"| {md(str(p['verdict']).upper())} | {num} |")
    lines += ["", result["divergence"], ""]
    lines += _bytes_apart(result["points"], md)
    if result.get("rebuilt_note"):
        lines += [f"Rebuilt: {md(result['rebuilt_note'])}.", ""]
    return visible_lines("\n".join(lines))


BYTES_APART = 0.10  # the DRAM counters' bytes this far from the model's: said beside the table


def _model_bytes(p: dict) -> float | None:
    """A point's model bytes: bytes_per_token_model, or, in a sweep.json written before it, bytes_per_token where
    it was the model's (bytes_source)."""
    if p.get("bytes_per_token_model"):
        return p["bytes_per_token_model"]
    return p.get("bytes_per_token") if p.get("bytes_source") == WEIGHTS_KV else None


def _bytes_apart(points: list[dict], md) -> list[str]:
    """Where the DRAM counters read otherwise than the model's bytes the table gives: both, and, where they read
    less than the weights alone, which every token reads once, that the counters missed part of the span's bytes."""
    apart = [p for p in points if _model_bytes(p) and p.get("bytes_per_token_measured")
             and abs(p["bytes_per_token_measured"] / _model_bytes(p) - 1) > BYTES_APART]
    if not apart:
        return []

    def one(p) -> str:
        m, b, w = p["bytes_per_token_measured"], _model_bytes(p), p.get("weight_bytes")
        words = (f"{md(p['command'])} at {p['depth']:,}: {m / 1e6:.4g} MB/token measured, {100 * (m / b - 1):+.0f}% "
                 f"against the model's {b / 1e6:.4g}")
        if w and m < w:
            words += (f", less than the weights alone ({w / 1e6:.4g} MB), which every token reads: the counters' "
                      "figure falls short of what the loop moved (samples missing from the span, or tokens counted "
                      "outside them)")
        return words

    return ["The DRAM counters read otherwise than the model's bytes: " + "; ".join(one(p) for p in apart)
            + " (the counters count every byte the GPU moved over the span's tokens; the model, its weights and KV "
            "once a token).", ""]

OUTPUT_NAMES = ("sweep.json", "sweep.md", "sweep.svg", "sweep.png")


def write_outputs(result: dict, outdir, copy_from=None) -> list[Path]:
    """Write sweep.json, sweep.md, sweep.svg and sweep.png into `outdir` (and, for a replay, copy the recordings
    from `copy_from`, so the output rebuilds too); the paths written, with the recordings a run wrote there.
    Everything is made in memory first, and each file is written whole (safe_write: a temporary name, then
    renamed; never through another user's link)."""
    from decodemon.monitor import plots
    from decodemon.monitor.safe_write import write_text_whole, write_whole

    d = Path(outdir)
    chart = plots.sweep_chart(series_of(result["points"]))
    texts = [json.dumps(result, indent=2, default=str, ensure_ascii=False) + "\n", markdown(result), chart.svg()]
    png = plots.png_bytes(chart)
    out = [d / n for n in OUTPUT_NAMES]
    copying = copy_from is not None and Path(copy_from).resolve() != d.resolve()
    for p in result["points"]:
        name = p.get("recording")
        # a point's recording (a replayed sweep.json's name): a plain file name of that folder, never a path out of it
        if not (name and Path(name).name == name and not name.startswith(".") and name.endswith(".dmon")):
            continue
        if copying:
            write_whole(d / name, (Path(copy_from) / name).read_bytes())
            out.append(d / name)
        elif copy_from is None and (d / name).is_file():  # a run's recording, written there while it was attached
            out.append(d / name)
    for path, text in zip(out[:3], texts):
        write_text_whole(path, text)
    write_whole(out[3], png)
    return out
