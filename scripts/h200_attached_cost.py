"""What being attached costs an eager token between windows, part by part, switched inside one process.

    bash scripts/h200.sh scripts/h200_attached_cost.py [--rounds 12] [--block-s 3]

The eager median overhead of a default attach has sat near +1% at one core speed (runs 20-26, docs/benchmarks.md)
while a window touches one or two tokens of ~200: something costs every token a little. This script takes the
candidates apart in one eager demo model decoding in this process's main thread (Qwen3-0.6B shape, bf16, batch 1,
`.item()` every token). A second thread, standing in for the agent, switches the condition every block:

- U: nothing.
- PA: PM sampling armed as the agent arms it (`PmSampler`, 2 ms interval), never pumped: does the armed PM
  session cost each launch something? (1,863 launches per token: 0.1 us each would be ~1%.)
- PP: the same session pumped every 0.5 s as the agent pumps it, and the thread awake every 50 ms as the agent's
  select loop is: does the agent's Python take the GIL from the decode thread?
- M: a second process (standing in for the monitor) busy 10 ms of every 100 ms, on any CPU: does another
  process's work slow the decode thread's core? (Decodemon's tokens were on a slow core more often than unobserved
  ones in 10 of the 11 runs with a canary.)

- S (with `--spawn`): one Python process after another, each importing the monitor and exiting: does a monitor's
  start-up slow the decode thread? (The tokens of an attach's first 0.3 s, before the agent starts, ran 1.5-5.8%
  slower in four of five runs, thirteenth session, scripts/attach_start.py.)

- N (with `--plan`): the NVML sidecar the agent starts at an attach, running (4 Hz); NS: one sidecar start-up
  after another (process start, imports, nvmlInit, its first frame); NI: the same NVML polling from a thread of
  the decode process itself (NVML initialised once there): which way of reading NVML costs the decode thread
  least, and does the sidecar's start-up account for an attach's slow first 1.5 s?

Order per round: U, PA, PP, U, M (then U, S with `--spawn`), or `--plan`'s. The arm, its first second and the close are left out (`x`). Each token's time is
also scaled to one core speed by the same ~30 us canary of pure Python the demo engine times
(`benchmarks/overhead.py` core_speed). Each block's median is set against the mean of the U blocks on both sides
of it; the floor is the same arithmetic on a U block between two others. Writes OUTDIR/attached_cost.json.
Dry run on CPU (no PM: PA and PP are left out): BENCH_CPU=1 python scripts/h200_attached_cost.py OUT --rounds 2
--block-s 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from _child import device_header  # noqa: E402

BUSY = ("import time\n"
        "while True:\n"
        "    t = time.perf_counter() + {busy}\n"
        "    while time.perf_counter() < t:\n"
        "        pass\n"
        "    time.sleep({idle})\n")
SPAWN = "import decodemon.monitor.cli, decodemon.monitor.session"


def blocks(labels: list[str]) -> list[tuple[str, int, int]]:
    """Contiguous runs of one label: (label, first index, end index)."""
    out, start = [], 0
    for i in range(1, len(labels) + 1):
        if i == len(labels) or labels[i] != labels[start]:
            out.append((labels[start], start, i))
            start = i
    return out


def judge(labels: list[str], values: list[float]) -> dict:
    """Per condition: each block's median over the mean of the nearest U blocks' medians on both sides, as
    `{cond: {"ratios": [...], "median": m, "above_1": k}}`; "floor" the same for a U block between two U blocks.
    Blocks labelled "x" are ignored; a block without a U neighbour on both sides is left out."""
    bl = [(lab, statistics.median(values[a:b])) for lab, a, b in blocks(labels) if lab != "x" and b > a]
    u_idx = [i for i, (lab, _) in enumerate(bl) if lab == "U"]
    res: dict = {}
    for i, (lab, med) in enumerate(bl):
        before = [j for j in u_idx if j < i]
        after = [j for j in u_idx if j > i]
        if not before or not after:
            continue
        ref = (bl[before[-1]][1] + bl[after[0]][1]) / 2
        key = "floor" if lab == "U" else lab
        res.setdefault(key, {"ratios": []})["ratios"].append(round(med / ref, 5))
    for key, d in res.items():
        r = d["ratios"]
        d["median"] = round(statistics.median(r), 5)
        d["above_1"] = sum(x > 1 for x in r)
        d["n"] = len(r)
        if key == "floor":
            d["abs_median"] = round(statistics.median(abs(x - 1) for x in r), 5)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block-s", type=float, default=3.0)
    ap.add_argument("--settle-s", type=float, default=1.0, help="left out after each PM arm")
    ap.add_argument("--busy-ms", type=float, default=10.0)
    ap.add_argument("--busy-period-ms", type=float, default=100.0)
    ap.add_argument("--spawn", action="store_true", help="add U, S to each round: S starts a Python process that "
                    "imports the monitor, one after another (what a monitor's start-up does to the host)")
    ap.add_argument("--plan", default=None, help="the blocks of a round, comma-separated, from U, PM (x, PA, PP), "
                    "M, S, N (the NVML sidecar running), NS (sidecar start-ups), NI (NVML polled from a thread of this process); default U,PM,U,M (+ U,S)")
    a = ap.parse_args()
    cpu = os.environ.get("BENCH_CPU") == "1"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    header = device_header("python3 scripts/h200_attached_cost.py " + " ".join(sys.argv[2:]))

    import torch

    from decodemon.engine_adapter.model import SHAPES, DecodeModel

    device = "cpu" if cpu else "cuda"
    if cpu:
        torch.set_num_threads(1)
    model = DecodeModel(SHAPES["tiny" if cpu else "qwen3-0.6b"], device,
                        torch.float32 if cpu else torch.bfloat16, 4096)
    model.reset()
    state = {"cond": "x", "stop": False}
    pm_ok = not cpu
    pump_cpu: list[float] = []
    starts_s: list[float] = []  # NS: each sidecar's start to its first frame
    plan = a.plan.split(",") if a.plan else ["U", "PM", "U", "M"] + (["U", "S"] if a.spawn else [])
    log: list[tuple] = []

    def arm():
        from decodemon.probes.pm_inproc import PmSampler

        return PmSampler(0, 2000)

    def sleep_awake(seconds: float, pm=None) -> None:
        """Sleep `seconds`, awake every 50 ms (the agent's select timeout); pump `pm` every 0.5 s if given."""
        end = time.monotonic() + seconds
        next_pump = time.monotonic() + 0.5
        while time.monotonic() < end and not state["stop"]:
            time.sleep(0.05)
            if pm is not None and time.monotonic() >= next_pump:
                c0 = time.thread_time()
                pm.samples()
                pump_cpu.append(round((time.thread_time() - c0) * 1e3, 3))
                next_pump += 0.5

    def set_cond(c: str) -> None:
        state["cond"] = c
        log.append((time.time(), c))

    def sidecar() -> subprocess.Popen:
        """The NVML sidecar as the agent starts it at an attach (PM in process, so --no-pm)."""
        env = {k: v for k, v in os.environ.items() if k != "DECODEMON_AGENT"}
        return subprocess.Popen([sys.executable, "-m", "decodemon.probes.sidecar", "--device", "0", "--no-pm",
                                 "--nvml-hz", "4"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env)

    def sidecar_stop(sc: subprocess.Popen) -> None:
        sc.stdin.close()
        try:
            sc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            sc.kill()
            sc.wait()

    def steady(label: str, start, stop) -> None:
        """A block with something running beside the decode thread: started (and `settle_s`) outside the block,
        stopped after it."""
        set_cond("x")
        start()
        time.sleep(a.settle_s)
        set_cond(label)
        time.sleep(a.block_s)
        set_cond("x")
        stop()
        time.sleep(0.2)

    def block(label: str) -> None:
        if label == "U":
            set_cond("U")
            time.sleep(a.block_s)
        elif label == "PM" and pm_ok:
            set_cond("x")
            pm = arm()
            time.sleep(a.settle_s)
            set_cond("PA")
            time.sleep(a.block_s)
            set_cond("PP")
            sleep_awake(a.block_s, pm)
            set_cond("x")
            pm.close()
            time.sleep(0.2)
        elif label == "M":
            set_cond("x")
            busy = subprocess.Popen([sys.executable, "-c", BUSY.format(busy=a.busy_ms / 1e3,
                                                                       idle=(a.busy_period_ms - a.busy_ms) / 1e3)])
            time.sleep(0.2)
            set_cond("M")
            time.sleep(a.block_s)
            set_cond("x")
            busy.kill()
            busy.wait()
            time.sleep(0.2)
        elif label == "S":
            set_cond("S")  # one monitor start-up after another, for the whole block
            end = time.monotonic() + a.block_s
            while time.monotonic() < end:
                subprocess.run([sys.executable, "-c", SPAWN], check=False)
            set_cond("x")
            time.sleep(0.2)
        elif label == "N":
            held: list = []  # started inside steady(), after the condition is "x"; running once its first frame
            steady("N", lambda: held.append(sidecar()) or held[0].stdout.read(1), lambda: sidecar_stop(held[0]))
        elif label == "NI":
            from decodemon.probes.sidecar import _nvml_loop

            sink = type("Sink", (), {"send": lambda self, f: None})()
            stop = threading.Event()
            th = threading.Thread(target=_nvml_loop, args=(sink, 0, 4.0, stop), daemon=True)
            # NVML initialised once in this process (kept), then polled at 4 Hz from a thread
            steady("NI", th.start, lambda: (stop.set(), th.join()))
        elif label == "NS":
            set_cond("NS")  # one sidecar start-up (to NVML initialised) after another, for the whole block
            end = time.monotonic() + a.block_s
            while time.monotonic() < end:
                t0 = time.monotonic()
                sc = sidecar()
                sc.stdout.read(1)
                starts_s.append(round(time.monotonic() - t0, 3))
                sidecar_stop(sc)
            set_cond("x")
            time.sleep(0.2)

    def driver() -> None:
        nonlocal pm_ok
        try:
            time.sleep(3.0)  # warm-up
            if pm_ok:  # the process's first PM session changes its speed for good (docs/h200.md): make it first
                try:
                    pm = arm()
                    time.sleep(2.0)
                    pm.close()
                except Exception as exc:
                    print(f"PM unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
                    pm_ok = False
                time.sleep(3.0)
            for _ in range(a.rounds):
                for label in plan:
                    block(label)
            set_cond("U")
            time.sleep(a.block_s)
        finally:
            state["stop"] = True

    th = threading.Thread(target=driver, daemon=True)
    th.start()
    ms, canary, labels, ends = [], [], [], []
    t_prev = time.perf_counter()
    pos = 0
    while not state["stop"]:
        int(model.step().item())
        t1 = time.perf_counter()
        c0 = time.perf_counter_ns()
        x = 0
        for j in range(1000):
            x += j
        canary.append((time.perf_counter_ns() - c0) / 1e3)
        ms.append((t1 - t_prev) * 1e3)
        labels.append(state["cond"])
        ends.append(time.time())
        t_prev = t1
        pos += 1
        if pos >= 4000:
            model.reset()
            pos = 0
    th.join()

    from overhead import core_speed

    cs = core_speed(ms, canary, [lab == "U" for lab in labels])
    scaled = cs["ms"] if cs else ms
    res = {**header, "rounds": a.rounds, "block_s": a.block_s, "pm": pm_ok, "tokens": len(ms),
           "busy": f"{a.busy_ms:g} ms of every {a.busy_period_ms:g} ms",
           "median_ms": {lab: round(statistics.median([m for m, q in zip(ms, labels) if q == lab]), 3)
                         for lab in sorted(set(labels))},
           "canary_us": {lab: round(statistics.median([m for m, q in zip(canary, labels) if q == lab]), 3)
                         for lab in sorted(set(labels))},
           "raw": judge(labels, ms), "core": judge(labels, [float(v) for v in scaled]),
           "pump_cpu_ms": pump_cpu, "plan": plan, "sidecar_start_s": starts_s}
    (out / "attached_cost.json").write_text(json.dumps(res, indent=1))
    (out / "attached_cost_tokens.json").write_text(json.dumps(
        {"ms": [round(m, 4) for m in ms], "canary_us": [round(c, 3) for c in canary], "cond": labels,
         "end_unix_s": [round(e, 4) for e in ends], "switches": log}))
    brief = {k: res[k] for k in ("tokens", "median_ms", "canary_us")}
    brief.update({v: {c: {k: d[k] for k in ("median", "above_1", "n")} for c, d in res[v].items()}
                  for v in ("raw", "core")})
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
