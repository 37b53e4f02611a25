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
involuntary switches and scheduler migrations (/proc/PID/task/PID/status and sched) at each phase's edges. Writes OUTDIR/migrations.json. `--cpu`: the tiny engine on this machine (a dry run).
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

from overhead import DM, start_demo  # noqa: E402


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


def phase(pid: int, label: str, secs: float, attach_args: list[str]) -> dict:
    c0 = counters(pid)
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
        time.sleep(0.001)
    if mon is not None:
        mon.wait(60)
    c1 = counters(pid)
    moves = sum(1 for a, b in zip(cpus, cpus[1:]) if a != b)
    share: dict = {}
    for c in cpus:
        share[c] = share.get(c, 0) + 1
    return {"label": label, "samples": len(cpus), "cpu_changes_seen_per_s": round(moves / secs, 2),
            "cpus_seen": {str(k): round(v / len(cpus), 3) for k, v in sorted(share.items())} if cpus else {},
            "asleep_share": round(sum(sleeps.values()) / max(1, len(cpus)), 4),
            "asleep_on": dict(sorted(sleeps.items(), key=lambda kv: -kv[1])[:8]),
            **{f"{k}_per_s": round((c1[k] - c0.get(k, 0)) / secs, 1) for k in c1}}


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
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    variants = a.variants.split(";") if a.variants is not None else [a.agent_args]
    labels = ["D"] if a.variants is None else [f"D{i}" for i in range(len(variants))]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    eng, pid = start_demo(out, "eager", tiny=a.cpu)
    if pid is None:
        return 1
    rows = []
    try:
        for _ in range(a.rounds):
            for label, args in zip(labels, variants):
                for lab, extra in (("U", []), (label, shlex.split(args))):
                    rows.append(phase(pid, lab, a.phase_s, extra))
                    print(json.dumps(rows[-1])[:400], flush=True)
        rows.append(phase(pid, "U", a.phase_s, []))
        print(json.dumps(rows[-1])[:400], flush=True)
    finally:
        eng.terminate()
        try:
            eng.wait(20)
        except subprocess.TimeoutExpired:
            eng.kill()
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "phase_s": a.phase_s,
           "agent_args": a.agent_args, "variants": dict(zip(labels, variants)), "phases": rows,
           "by_label": by_label(rows)}
    (out / "migrations.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
