"""A batched engine read against its own clock: transformers' continuous batching at several requests in flight,
attached by pid as a new user would, and a recording of each for the tests to replay.

    python benchmarks/serving.py OUTDIR [--in-flight 1,4,16] [--attaches 5] [--seconds 6] [--new-tokens 64]

For each in-flight count the engine (benchmarks/loops/hf_cb.py, plain python, no decodemon in it) is started and
warmed, then `decodemon record PID` writes OUTDIR/h200_hf_cb_<n>.dmon (or cpu_...) and `decodemon attach PID
--json` runs `--attaches` times in a row. Each is held against the engine's own timestamps over the same seconds:

    step time       the median gap between two tokens of one request (a step makes one token of each request)
    tokens/step     the requests in flight (the engine keeps `n` in flight)
    total tokens/s  every request's tokens that the engine stamped in the span, over the span

The span is the command's last `--seconds` before its summary (the load and connect come before the first mark).

Everything lands in OUTDIR/serving.json, with a table on stdout. With no GPU the tiny CPU shape runs: the
structure, not the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from unmodified import DM, LOOPS, PY, cli_json, stop  # noqa: E402


SUMMARY_S = 0.3  # from the detach to the summary printed


def engine_own(log: Path, t0: float, t1: float) -> dict:
    """The engine's own figures over [t0, t1] from its per-request token stamps (unix s)."""
    steps, count = [], 0
    if log.exists():
        for line in log.read_text().splitlines():
            try:
                t = json.loads(line)["t"]
            except (ValueError, KeyError):
                continue
            count += sum(1 for x in t if t0 <= x <= t1)
            steps.extend(1e3 * (b - a) for a, b in zip(t[1:], t[2:]) if t0 <= b <= t1)  # t[0]: the prefill's
    return {"step_ms": statistics.median(steps) if steps else None,
            "tokens_per_s": count / (t1 - t0) if t1 > t0 else None, "tokens": count}


def marks_span(rec: Path) -> tuple[float, float] | None:
    """A recording's first and last token marks as unix s (each ship's arrival; the first less one ship period)."""
    from decodemon.probes import wire

    try:
        frames = list(wire.read_recording(rec))
    except (OSError, wire.WireError):
        return None
    t0 = next((f.created_unix_s for _, f in frames if isinstance(f, wire.RecordingHeader)), None)
    rx = [r for r, f in frames if isinstance(f, wire.TokenMarks)]
    return (t0 + rx[0] / 1e9 - 0.25, t0 + rx[-1] / 1e9) if (t0 is not None and rx) else None


def start(n: int, a, tiny: bool, log: Path, out: Path) -> subprocess.Popen:
    """The engine at `n` requests in flight; returns once it decodes and has warmed."""
    argv = [PY, str(LOOPS / "hf_cb.py"), "--shape", "tiny" if tiny else a.shape, "--in-flight", str(n),
            "--new-tokens", str(a.new_tokens), "--log", str(log),
            *(["--device", "cpu", "--num-blocks", "16"] if tiny else [])]
    warm_s = a.warm_s
    with open(out / f"cb{n}.engine.log", "w") as sink:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()
    while time.time() - t0 < 600:
        if proc.poll() is not None:
            raise RuntimeError(f"cb{n} exited with {proc.returncode}: {(out / f'cb{n}.engine.log').read_text()[-800:]}")
        if "decoding" in (out / f"cb{n}.engine.log").read_text():
            time.sleep(warm_s)
            return proc
        time.sleep(0.5)
    stop(proc)  # never leave an engine holding the GPU behind
    raise RuntimeError(f"cb{n} did not decode within 600 s")


def seen(j: dict | None) -> dict:
    """What decodemon said of the engine."""
    j = j or {}
    return {k: j.get(k) for k in ("ms_per_token", "tokens_per_step", "throughput_tokens_per_s", "steps", "tokens",
                                  "token_clock", "verdict", "ceiling", "kernels_per_token", "gpu_busy_pct",
                                  "bytes_per_token_measured")}


def off(a, b) -> float | None:
    """a against b, in percent."""
    return round(100 * (a / b - 1), 2) if (a is not None and b) else None


def run(n: int, a, out: Path, tiny: bool) -> dict:
    log = out / f"cb{n}.tokens"
    log.unlink(missing_ok=True)
    proc = start(n, a, tiny, log, out)
    rows = []
    try:
        rec = out / f"{'cpu' if tiny else 'h200'}_hf_cb_{n}.dmon"
        t0 = time.time()
        j, err = cli_json("record", proc.pid, "-o", rec, "--seconds", a.seconds, timeout=a.seconds + 180)
        rows.append({"what": "record", "t": [t0, time.time()], "error": err if j is None else "", **seen(j)})
        for _ in range(a.attaches):
            t0 = time.time()
            j, err = cli_json("attach", proc.pid, "--seconds", a.seconds, timeout=a.seconds + 180)
            rows.append({"what": "attach", "t": [t0, time.time()], "error": err if j is None else "", **seen(j)})
        time.sleep(a.tail_s)  # the requests in flight during the last attach finish and are logged
    finally:
        stop(proc)
    for r in rows:
        # the seconds decodemon watched: a recording's first to last mark; an attach's last `seconds` before its
        # summary (its start, and an injection's load, come before the first mark)
        t1 = r["t"][1] - SUMMARY_S
        span = marks_span(rec) if r["what"] == "record" else None
        own = engine_own(log, *(span or (max(r["t"][0], t1 - a.seconds), t1)))
        r["own"] = own
        r["step_off_pct"] = off(r.get("ms_per_token"), own["step_ms"])
        r["tokens_per_s_off_pct"] = off(r.get("throughput_tokens_per_s"), own["tokens_per_s"])
    return {"in_flight": n, "shape": "tiny" if tiny else a.shape, "rows": rows,
            "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}


def table(res: list[dict]) -> str:
    out = ["in flight | what | step ms (own) | tokens/step | tok/s (own) | step off | tok/s off | verdict"]
    for r in res:
        for x in r.get("rows", []):
            o = x["own"]
            out.append(f"{r['in_flight']} | {x['what']} | {x.get('ms_per_token')} ({o['step_ms'] and round(o['step_ms'], 2)})"
                       f" | {x.get('tokens_per_step')} | {x.get('throughput_tokens_per_s')} "
                       f"({o['tokens_per_s'] and round(o['tokens_per_s'], 1)}) | {x['step_off_pct']}% | "
                       f"{x['tokens_per_s_off_pct']}% | {x.get('verdict')} {x.get('error') or ''}".rstrip())
        if "error" in r:
            out.append(f"{r['in_flight']} | error: {r['error'][-300:]}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--in-flight", default="1,4,16")
    ap.add_argument("--attaches", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--shape", default="qwen3-0.6b", choices=["qwen3-0.6b", "llama-8b"])
    ap.add_argument("--new-tokens", type=int, default=64,
                    help="each request's tokens (its stamps are logged when it finishes: keep it short)")
    ap.add_argument("--warm-s", type=float, default=8.0)
    ap.add_argument("--tail-s", type=float, default=12.0, help="seconds after the last attach (requests finish)")
    ap.add_argument("--tiny", action="store_true", help="the tiny CPU shape (default with no GPU)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    tiny = a.tiny or not Path("/dev/nvidia0").exists()
    res = []
    for n in (int(x) for x in a.in_flight.split(",")):
        try:
            r = run(n, a, out, tiny)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            r = {"in_flight": n, "error": str(exc)}
        res.append(r)
        (out / "serving.json").write_text(json.dumps(res, indent=1))
        print(table([r]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
