"""Does attaching move the eager decode thread between CPUs?

    python scripts/h200_migrations.py OUTDIR [--phase-s 10] [--rounds 2] [--agent-args "..." | --variants
        ";--no-pm;--no-trace"] [--cpu]

In the H200's eager runs the attached phases landed on a slow core more often than the unobserved ones (run 42,
2026-11-30: 5 of 11 against 1 of 12; benchmarks/overhead.py `speeds`), while the C canary, timed on the decode
thread, said the core was no slower per cycle of work. One way an attach could do that: each time the agent
thread takes the GIL the decode thread sleeps on it (a voluntary switch) and, woken, may be placed on another
CPU. This starts the demo engine (the decode loop in its main thread) and, through unobserved phases (U) and
default attaches (D, `attach --json`) in turn, reads the decode thread's CPU and state from /proc every ~1 ms
(every 5 ms until the eighteenth session's call 4), and when it sleeps, what on: its system call with the first
argument (a futex's address: the GIL is one) and its kernel wait channel (`asleep_on`); and its voluntary and
involuntary switches and scheduler migrations (/proc/PID/task/PID/status and sched) and every CPU's interrupts
(/proc/interrupts) at each phase's edges. The engine logs every token (demo --times-file --cpu-clocks): each phase
gets its median ms/token, the C canary's median and its share of tokens on a slow core (overhead.core_speed), so
variants (`--variants`) are compared on speed as well as on waits. Writes OUTDIR/migrations.json. `--cpu`: the tiny engine on this machine (a dry run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead import DM, core_speed, phase_of, start_demo  # noqa: E402


def counters(pid: int) -> dict:
    base = Path(f"/proc/{pid}/task/{pid}")
    out = {}
    for line in (base / "status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"):
            out[k] = int(v)
    try:
        for line in (base / "sched").read_text().splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("se.nr_migrations", "nr_migrations"):
                out["nr_migrations"] = int(float(v))
    except OSError:
        pass
    return out


SYSCALLS = {0: "read", 1: "write", 7: "poll", 16: "ioctl", 23: "select", 35: "nanosleep", 202: "futex",
            232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait"}  # x86-64


def sample(pid: int) -> tuple[int, str, str | None]:
    """The decode thread's CPU and state now, and when it sleeps what on: its system call and first argument (a
    futex's address tells one lock from another: the GIL's is one address) and its kernel wait channel."""
    base = f"/proc/{pid}/task/{pid}"
    f = Path(f"{base}/stat").read_text().rsplit(")", 1)[1].split()
    cpu, state = int(f[36]), f[0]
    what = None
    if state in ("S", "D"):
        try:
            sc = Path(f"{base}/syscall").read_text().split()
            nr = int(sc[0]) if sc and sc[0].lstrip("-").isdigit() else -1
            what = f"{SYSCALLS.get(nr, nr)}({sc[1] if len(sc) > 1 else ''})"
        except OSError:
            what = "?"
        try:
            what += " " + Path(f"{base}/wchan").read_text().strip()
        except OSError:
            pass
    return cpu, state, what


def interrupts() -> dict[int, int]:
    """Interrupts taken so far by each CPU, all lines summed (/proc/interrupts; {} where unreadable)."""
    try:
        lines = Path("/proc/interrupts").read_text().splitlines()
    except OSError:
        return {}
    n = len(lines[0].split())
    tot = [0] * n
    for line in lines[1:]:
        f = line.split()[1:1 + n]
        for i, x in enumerate(f):
            if x.isdigit():
                tot[i] += int(x)
    return dict(enumerate(tot))


def phase(pid: int, label: str, secs: float, attach_args: list[str], sample_s: float = 0.001) -> dict:
    c0, irq0, t0 = counters(pid), interrupts(), time.time()
    mon = None
    if label.startswith("D"):
        mon = subprocess.Popen(DM + ["attach", str(pid), "--json", "--seconds", str(secs)] + attach_args,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cpus, sleeps, t_end = [], {}, time.time() + secs
    while time.time() < t_end:
        try:
            cpu, _, what = sample(pid)
        except (OSError, IndexError, ValueError):
            break
        cpus.append(cpu)
        if what is not None:
            sleeps[what] = sleeps.get(what, 0) + 1
        time.sleep(sample_s)
    t1 = time.time()
    if mon is not None:
        mon.wait(60)
    c1, irq1 = counters(pid), interrupts()
    moves = sum(1 for a, b in zip(cpus, cpus[1:]) if a != b)
    share: dict = {}
    for c in cpus:
        share[c] = share.get(c, 0) + 1
    main_cpu = max(share, key=share.get) if share else None
    irq = {c: irq1[c] - irq0.get(c, 0) for c in irq1}
    return {"label": label, "t0": t0, "t1": t1, "samples": len(cpus),
            "cpu_changes_seen_per_s": round(moves / secs, 2),
            "irq_per_s_decode_cpu": round(irq.get(main_cpu, 0) / secs, 1) if main_cpu is not None else None,
            "irq_per_s_all_cpus": round(sum(irq.values()) / secs, 1),
            "cpus_seen": {str(k): round(v / len(cpus), 3) for k, v in sorted(share.items())} if cpus else {},
            "asleep_share": round(sum(sleeps.values()) / max(1, len(cpus)), 4),
            "asleep_on": dict(sorted(sleeps.items(), key=lambda kv: -kv[1])[:8]),
            **{f"{k}_per_s": round((c1[k] - c0.get(k, 0)) / secs, 1) for k in c1}}


def speeds(rows: list[dict], times: dict) -> None:
    """Each phase's tokens (ended inside it, less its first 50 ms): median ms, the C canary's median, and the share
    on a slow core (overhead.core_speed by the C canary, the unobserved phases' tokens as the reference), added to
    its row. The engine's times file: {"end_unix_s", "ms", "canary_c_us", ...} (demo --times-file --cpu-clocks)."""
    ends, ms, cc = times.get("end_unix_s") or [], times.get("ms") or [], times.get("canary_c_us") or []
    if not ends or len(cc) != len(ends):
        return
    where = [None] * len(ends)
    for j, r in enumerate(rows):
        for i, e in enumerate(ends):
            if phase_of(e, r["t0"], r["t1"]):
                where[i] = j
    keep = [i for i, w in enumerate(where) if w is not None]
    cs = core_speed([ms[i] for i in keep], [cc[i] for i in keep], [rows[where[i]]["label"] == "U" for i in keep])
    for j, r in enumerate(rows):
        sel = [k for k, i in enumerate(keep) if where[i] == j]
        if not sel:
            continue
        r["tokens"] = len(sel)
        r["median_ms"] = round(statistics.median(ms[keep[k]] for k in sel), 3)
        r["c_canary_median_us"] = round(statistics.median(cc[keep[k]] for k in sel), 2)
        if cs is not None:
            r["slow_core_share"] = round(sum(cs["slow"][k] for k in sel) / len(sel), 3)
            r["median_ms_one_core_speed"] = round(statistics.median(cs["ms"][k] for k in sel), 3)
        for col in ("minflt", "nvcsw", "runq_wait_ms"):
            vals = times.get(col)
            if vals and len(vals) == len(ends):
                r[f"{col}_per_token"] = round(statistics.fmean(vals[keep[k]] for k in sel), 3)


def pair_overheads(rows: list[dict]) -> dict:
    """Per attached label, each phase's median ms/token over the mean of the unobserved phases on both sides of it,
    in %, raw and at one core speed by the C canary (the benchmark's pair arithmetic), and their medians. Rows
    without token times (an engine that wrote none) are left out."""
    out: dict = {}
    for i, r in enumerate(rows):
        if r["label"] == "U" or not 0 < i < len(rows) - 1:
            continue
        a, b = rows[i - 1], rows[i + 1]
        if a["label"] != "U" or b["label"] != "U" or any(x.get("median_ms") is None for x in (a, r, b)):
            continue
        o = out.setdefault(r["label"], {"raw": [], "one_core_speed": []})
        o["raw"].append(round(100 * (r["median_ms"] / ((a["median_ms"] + b["median_ms"]) / 2) - 1), 2))
        if all(x.get("median_ms_one_core_speed") is not None for x in (a, r, b)):
            ref = (a["median_ms_one_core_speed"] + b["median_ms_one_core_speed"]) / 2
            o["one_core_speed"].append(round(100 * (r["median_ms_one_core_speed"] / ref - 1), 2))
    for o in out.values():
        for k in ("raw", "one_core_speed"):
            o[f"{k}_median"] = statistics.median(o[k]) if o[k] else None
    return out


def by_label(rows: list[dict]) -> dict:
    """Per label, the medians of its phases' switch rates and sleeping share, and what it slept on, summed."""
    out: dict = {}
    for lab in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == lab]
        on: dict = {}
        for r in rs:
            for k, v in r["asleep_on"].items():
                on[k] = on.get(k, 0) + v
        out[lab] = {"phases": len(rs),
                    **{k: statistics.median(r.get(k, 0.0) for r in rs)
                       for k in ("voluntary_ctxt_switches_per_s", "nonvoluntary_ctxt_switches_per_s",
                                 "asleep_share")},
                    **{k: statistics.median(r[k] for r in rs if r.get(k) is not None)
                       for k in ("median_ms", "median_ms_one_core_speed", "c_canary_median_us", "slow_core_share",
                                 "irq_per_s_decode_cpu", "irq_per_s_all_cpus", "minflt_per_token",
                                 "nvcsw_per_token")
                       if any(r.get(k) is not None for r in rs)},
                    "asleep_on": dict(sorted(on.items(), key=lambda kv: -kv[1])[:8])}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--phase-s", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--agent-args", default="", help="extra `attach` arguments for the D phases")
    ap.add_argument("--variants", default=None,
                    help="attach settings to interleave on one engine, ';'-separated (e.g. ';--no-pm;--no-trace': "
                         "the defaults, then without PM, then without windows): phases D0, D1, ... in turn, each "
                         "round, with an unobserved phase before each; --agent-args is then ignored")
    ap.add_argument("--sample-ms", type=float, default=1.0,
                    help="how often the decode thread's CPU and state are read (ms)")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    variants = a.variants.split(";") if a.variants is not None else [a.agent_args]
    labels = ["D"] if a.variants is None else [f"D{i}" for i in range(len(variants))]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    times_file = out / "engine_times.json"
    eng, pid = start_demo(out, "eager", tiny=a.cpu, times_file=times_file)
    if pid is None:
        return 1
    rows = []
    try:
        for _ in range(a.rounds):
            for label, args in zip(labels, variants):
                for lab, extra in (("U", []), (label, shlex.split(args))):
                    rows.append(phase(pid, lab, a.phase_s, extra, a.sample_ms / 1e3))
                    print(json.dumps(rows[-1])[:400], flush=True)
        rows.append(phase(pid, "U", a.phase_s, [], a.sample_ms / 1e3))
        print(json.dumps(rows[-1])[:400], flush=True)
    finally:
        eng.terminate()
        try:
            eng.wait(20)
        except subprocess.TimeoutExpired:
            eng.kill()
    try:
        speeds(rows, json.loads(times_file.read_text()))
    except (OSError, ValueError) as exc:
        print(f"no token times: {exc}")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "phase_s": a.phase_s,
           "agent_args": a.agent_args, "variants": dict(zip(labels, variants)), "phases": rows,
           "by_label": by_label(rows), "pairs": pair_overheads(rows)}
    (out / "migrations.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
