"""Which threads of a decoding engine unmap memory while decodemon is attached, and how often.

    python scripts/h200_unmaps.py OUTDIR [--mode eager] [--phase-s 8]

On the H200 (seventeenth session's runs 38-40) the machine took 0.4-0.5 TLB shootdowns a second while an eager
engine ran unobserved and 31-41 while it was attached, and the engine 187-243 minor faults a second attached
against 0 (benchmarks/overhead.py's proc and vm counters; on this CPU machine's tiny engine an attach changed
neither). A shootdown interrupts every CPU the process's threads ran on, the decode thread's among
them, and flushes its TLB. This starts the demo engine, then counts, by thread (its /proc comm name) and by call,
the engine's munmap, mremap, madvise, brk, mmap and mprotect calls under `strace -f` for one unobserved phase and one
default attach of the same length, with /proc/interrupts' TLB line and each thread's minor faults a second
(/proc/PID/task/TID/stat, from when the thread was first seen) beside. strace stops the engine at each of its
system calls, so its token times are not figures of overhead; only the counts are. Writes OUTDIR/unmaps.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from overhead import DM, irq_counters, start_demo  # noqa: E402

CALLS = "munmap,mremap,madvise,brk,mmap,mprotect"
LINE = re.compile(r"^(\d+)\s+(\w+)\((.*?)\)\s+=\s+(\S+)")


def comm_names(pid: int) -> dict[int, str]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = f"{(task / 'comm').read_text().strip()} {task.name}"
        except OSError:
            pass
    return out


def thread_faults(pid: int) -> dict[int, int]:
    """{tid: minor faults so far} for each of the process's threads (field 10 of /proc/PID/task/TID/stat)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "stat").read_text().rsplit(")", 1)[1].split()[7])
        except (OSError, ValueError, IndexError):
            pass
    return out


def count(trace: Path, names: dict[int, str]) -> dict:
    """{call: {thread name: n}} and the bytes munmap'd per thread, from an `strace -f -o` file."""
    calls: dict = collections.defaultdict(collections.Counter)
    unmapped: collections.Counter = collections.Counter()
    for line in trace.read_text(errors="replace").splitlines():
        m = LINE.match(line)
        if not m:
            continue
        tid, call, args = int(m.group(1)), m.group(2), m.group(3)
        who = names.get(tid, f"tid {tid}")
        calls[call][who] += 1
        if call == "munmap":
            try:
                unmapped[who] += int(args.split(",")[1].strip())
            except (IndexError, ValueError):
                pass
    return {"calls": {c: dict(v) for c, v in calls.items()}, "munmap_bytes": dict(unmapped)}


def phase(pid: int, secs: float, out: Path, tag: str, attach: bool) -> dict:
    trace = out / f"strace_{tag}.txt"
    irq0 = irq_counters()
    st = subprocess.Popen(["strace", "-f", "-qq", "-e", f"trace={CALLS}", "-o", str(trace), "-p", str(pid)],
                          stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    t0 = time.time()
    names: dict[int, str] = {}
    first: dict[int, int] = thread_faults(pid)
    last: dict[int, int] = dict(first)
    att = subprocess.Popen(DM + ["attach", str(pid), "--json", "--seconds", str(secs)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL) if attach else None
    while time.time() - t0 < secs or (att is not None and att.poll() is None):
        names.update(comm_names(pid))  # threads that come and go (the agent's) by their name while they live
        for tid, n in thread_faults(pid).items():  # a thread's faults from when it was first seen
            first.setdefault(tid, n)
            last[tid] = n
        time.sleep(0.25)
    rc = att.wait() if att is not None else 0
    names.update(comm_names(pid))
    names[pid] = "main (decode thread)"
    st.terminate()
    st.wait(timeout=10)
    seconds = time.time() - t0
    irq1 = irq_counters()
    if not trace.exists():
        raise SystemExit(f"h200_unmaps: strace wrote nothing (rc {st.returncode}): is ptrace allowed here?")
    faults = {names.get(t, f"tid {t}"): round((last[t] - first[t]) / seconds, 1) for t in last if last[t] > first[t]}
    return {"seconds": round(seconds, 2), "attach_rc": rc, "threads": sorted(set(names.values())),
            "minor_faults_per_s": faults,
            "irq_TLB_per_s": round((irq1.get("irq_TLB", 0) - irq0.get("irq_TLB", 0)) / seconds, 2),
            **count(trace, names)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--mode", default="eager")
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--cpu", action="store_true", help="the tiny engine on the CPU (a dry run of the script)")
    a = ap.parse_args()
    if not shutil.which("strace"):
        sys.exit("h200_unmaps: no strace on this machine")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    eng, pid = start_demo(out, a.mode, tiny=a.cpu)
    try:
        if pid is None:
            sys.exit("h200_unmaps: the engine did not start (its stderr's tail above)")
        res = {"mode": a.mode, "U": phase(pid, a.phase_s, out, "U", False),
               "D": phase(pid, a.phase_s, out, "D", True)}
        (out / "unmaps.json").write_text(json.dumps(res, indent=1))
        print(json.dumps(res, indent=1))
    finally:
        eng.terminate()


if __name__ == "__main__":
    main()
