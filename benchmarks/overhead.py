"""What watching costs: interleaved A/B phases on one running demo engine, eager and graphed.

    python benchmarks/overhead.py [OUTDIR] [--phase-s 4] [--pairs 5]

One engine per mode decodes until told to stop. Phases alternate on that
same process: unobserved (U) and decodemon attached with default settings (D),
then U / dense-trace pairs and one long attach. torch.profiler (P, toggled
in the engine by SIGUSR1) alternates with U phases in a second engine
process of the same mode. Every token's time is logged by the engine, so
each phase's ms/token (median, p99) comes from the engine's own clock:
inter-token latency, the token clock's hook included (in the token after
it); the iteration clock, stamped after the hook, is reported beside it.
Accuracy is checked in the same run: decodemon's launches and kernel time
per token against torch.profiler's, and PM GPU busy against the traced
window's.

Writes OUTDIR/overhead.json and docs/benchmarks.md (a markdown table naming
device, driver, CUPTI version, date and this command); a CPU dry run
(BENCH_CPU=1) writes its table under OUTDIR only. Use --eager-pairs and
--eager-phase-s to give the noisier eager loop more and longer pairs (the
seventeenth session's runs: 8 pairs of 10 s, graph 5 of 4 s, ~510 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from decodemon.monitor.session import observer_parts

PY = sys.executable
DM = [PY, "-m", "decodemon.monitor.cli"]
DEMO = [PY, "-m", "decodemon.engine_adapter.demo"]


def start_demo(out: Path, mode: str, tiny: bool = False,
               times_file: Path | None = None) -> tuple[subprocess.Popen, int | None]:
    """A demo engine decoding without end under `decodemon run` (its pid file and stderr in `out`), for the device
    scripts: (the process, its pid once it decodes, or None if it exited or took over 180 s; its stderr's tail is
    printed then). `times_file`: the engine writes every token's time and clocks there when it exits (the demo's
    `--times-file --cpu-clocks`, the C canary included)."""
    pid_file, err_path = out / "engine.pid", out / "engine.err"
    cpu = ["--tiny", "--device", "cpu"] if tiny else []
    times = ["--times-file", str(times_file), "--cpu-clocks"] if times_file is not None else []
    eng = subprocess.Popen(DM + ["run", "--pid-file", str(pid_file), "--"] + DEMO + cpu +
                           ["--mode", "eager" if tiny else mode, "--tokens", "0"] + times,
                           stdout=subprocess.DEVNULL, stderr=open(err_path, "w"))
    pid = until_decoding(eng, err_path, pid_file)
    if pid is None:
        print(err_path.read_text()[-2000:])
    return eng, pid


def until_decoding(eng: subprocess.Popen, err_path: Path, pid_file: Path) -> int | None:
    """Wait for a demo engine started under `decodemon run` to say it decodes (its stderr), then 2 s more: its pid,
    or None if it exited or took over 180 s."""
    t0 = time.time()
    while "decoding" not in err_path.read_text():
        if eng.poll() is not None or time.time() - t0 > 180:
            return None
        time.sleep(0.3)
    time.sleep(2)
    return int(pid_file.read_text())


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else float("nan")


def pair_stats(per: list[dict], label: str) -> dict:
    """Overhead of the `label` phases against the unobserved (U) phases on both sides of each, and the noise floor.

    Each observed phase's median (p99) is divided by the mean of the U phases just before and just after it
    (the one before alone at the end of a plan), so a drift of the loop's own speed across the pair cancels
    instead of landing on the observed phase. The noise floor is what the same arithmetic gives with nothing
    attached: the U phase after each pair against the one before it. An overhead smaller than the noise floor's
    median |ratio - 1| is not resolved by the run. `per`: phases in order, each {"phase", "median_ms", "p99_ms"}.
    """
    ratios, p99r, null, means = [], [], [], []
    for i, p in enumerate(per):
        if p["phase"] != label or i == 0 or per[i - 1]["phase"] != "U" or not p["median_ms"]:
            continue
        after = per[i + 1] if i + 1 < len(per) and per[i + 1]["phase"] == "U" and per[i + 1]["median_ms"] else None
        refs = [per[i - 1]] + ([after] if after else [])
        ratios.append(p["median_ms"] / statistics.mean(q["median_ms"] for q in refs))
        p99r.append(p["p99_ms"] / statistics.mean(q["p99_ms"] for q in refs))
        if p.get("mean_ms") and all(q.get("mean_ms") for q in refs):
            means.append(p["mean_ms"] / statistics.mean(q["mean_ms"] for q in refs))
        if after:
            null.append(after["median_ms"] / per[i - 1]["median_ms"])
    # The same arithmetic as an observed phase gets, done on an unobserved one: each U between two U's (one
    # `label` phase apart on each side) against their mean. This is the noise floor of the estimator itself;
    # the U-after / U-before one above also carries the drift across a pair that the bracketing cancels.
    bracketed, bracketed_p99 = [], []
    for i, p in enumerate(per):
        if (p["phase"] == "U" and p["median_ms"] and 2 <= i < len(per) - 2
                and per[i - 1]["phase"] == label and per[i + 1]["phase"] == label
                and per[i - 2]["phase"] == "U" and per[i + 2]["phase"] == "U"
                and per[i - 2]["median_ms"] and per[i + 2]["median_ms"]):
            bracketed.append(p["median_ms"] / statistics.mean((per[i - 2]["median_ms"], per[i + 2]["median_ms"])))
            # p99 too: a short phase's p99 is one of its few slowest tokens, and noisy (eager on the H200,
            # eighth session: ±7-14% between unobserved phases)
            if p.get("p99_ms") and per[i - 2].get("p99_ms") and per[i + 2].get("p99_ms"):
                bracketed_p99.append(p["p99_ms"] / statistics.mean((per[i - 2]["p99_ms"], per[i + 2]["p99_ms"])))
    later = ratios[1:]  # the process's first attach carries one-off costs (see D_later in run_mode)
    obs = [p["median_ms"] for p in per if p["phase"] == label and p["median_ms"]]

    def pct_(x):
        return 100 * (x - 1)
    return {"pairs": len(ratios),
            "overhead_pct_median": pct_(statistics.median(ratios)) if ratios else None,
            "overhead_pct_min": pct_(min(ratios)) if ratios else None,
            "overhead_pct_max": pct_(max(ratios)) if ratios else None,
            "overhead_pct_median_after_first": pct_(statistics.median(later)) if later else None,
            "p99_ratio_median": statistics.median(p99r) if p99r else None,
            # the mean token carries the windows' slow tokens the median leaves out: compare with the monitor's
            # live "share of the loop" (observer_cost)
            "overhead_mean_pct_median": pct_(statistics.median(means)) if means else None,
            "p99_ratio_median_after_first": statistics.median(p99r[1:]) if len(p99r) > 1 else None,
            "p99_ratios": [round(x, 3) for x in p99r],  # each pair's, in order
            "overhead_pcts": [round(pct_(x), 3) for x in ratios],  # each pair's, in order (scripts/pool_runs.py)
            "noise_floor_pct": 100 * statistics.median(abs(x - 1) for x in null) if null else None,
            "noise_floor_bracketed_pct": 100 * statistics.median(abs(x - 1) for x in bracketed) if bracketed else None,
            "bracketed_null_pct": [round(100 * (x - 1), 2) for x in bracketed],
            "p99_noise_floor_bracketed_pct": 100 * statistics.median(abs(x - 1) for x in bracketed_p99)
            if bracketed_p99 else None,
            "reference": "mean of the unobserved phases before and after",
            "median_ms": statistics.median(obs) if obs else None}


def host_ticks() -> list[int] | None:
    """The machine's CPU time so far (/proc/stat, all CPUs): user, nice, system, idle, iowait, irq, softirq, steal."""
    try:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


VM_KEYS = ("compact_stall", "compact_migrate_scanned", "pgmigrate_success", "thp_fault_alloc",
           "thp_collapse_alloc", "numa_pages_migrated", "pgfault", "pgmajfault")


IRQ_KEYS = ("irq_TLB", "irq_CAL", "irq_RES")  # /proc/interrupts: TLB shootdowns, function-call IPIs, reschedules
# the processes themselves (proc_counters): the engine's minor faults and CPU (all its threads: decode, agent),
# and the CPU of the monitor processes the phase waited for (the attaches), in ms per second
PROC_KEYS = ("engine_minflt", "engine_cpu_ms", "monitor_cpu_ms")


def proc_counters(pid: int | None) -> dict[str, float]:
    """So far: the engine's minor faults and CPU ms (/proc/PID/stat), and the CPU ms of this process's waited-for
    children (the monitor processes of finished attaches; RUSAGE_CHILDREN). What cannot be read is left out.
    Which process a phase's machine-wide faults and interrupts (vm_counters) belong to, and how busy the monitor
    kept a CPU beside the engine's."""
    import resource

    out: dict[str, float] = {}
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    out["monitor_cpu_ms"] = 1e3 * (ch.ru_utime + ch.ru_stime)
    if pid:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()  # fields after the command name, from the state on
            hz = os.sysconf("SC_CLK_TCK")
            out["engine_minflt"] = int(f[7])
            out["engine_cpu_ms"] = 1e3 * (int(f[11]) + int(f[12])) / hz
        except (OSError, IndexError, ValueError):
            pass
    return out


def irq_counters(path: str = "/proc/interrupts") -> dict[str, int]:
    """Interrupts so far that one process's memory work or scheduling sends to other CPUs (whole machine, summed
    over CPUs): TLB shootdowns (an munmap or mprotect in a process with threads on several CPUs), function-call
    IPIs and reschedule IPIs, as {"irq_TLB": n, ...}. A line the kernel lacks is left out."""
    out = {}
    try:
        with open(path) as fh:
            ncpu = len(fh.readline().split())
            for line in fh:
                name, _, rest = line.partition(":")
                key = "irq_" + name.strip()
                if key in IRQ_KEYS:
                    out[key] = sum(int(x) for x in rest.split()[:ncpu] if x.isdigit())
    except (OSError, ValueError):
        return {}
    return out


def vm_counters(path: str = "/proc/vmstat", irq_path: str | None = "/proc/interrupts") -> dict[str, int]:
    """The kernel's memory-management counters so far (whole machine) that can stall a thread of another process:
    compaction, page migration, transparent huge pages, NUMA balancing, faults. A key the kernel lacks is left out.
    (On the H200's host the eager decode thread ran ~1.65x slower for seconds at a time, on its CPU and with no
    run-queue wait, attached or not, and processes starting slowed it; these say whether the kernel was moving
    memory in a phase.) With `irq_path`, irq_counters() too."""
    out = {}
    try:
        with open(path) as fh:
            for line in fh:
                k, _, v = line.partition(" ")
                if k in VM_KEYS:
                    out[k] = int(v)
    except (OSError, ValueError):
        return {}
    return {**out, **(irq_counters(irq_path) if irq_path else {})}


def vm_rates(before: dict, after: dict, seconds: float) -> dict:
    """Per second between two vm_counters() readings, as {"vm_per_s": {key: rate}} ({} without both)."""
    if not before or not after or seconds <= 0:
        return {}
    return {"vm_per_s": {k: round((after[k] - before[k]) / seconds, 2) for k in before if k in after}}


def vm_summary(per: list[dict]) -> dict:
    """Median per-second rate of each counter over the unobserved phases (after the first) and over the default
    attaches: {key: [unobserved, decodemon]}, keys that moved in either only."""
    def med(label: str, key: str):
        xs = [p["vm_per_s"][key] for p in per[1:] if p["phase"] == label and key in p.get("vm_per_s", {})]
        return statistics.median(xs) if xs else None

    keys = {k for p in per for k in p.get("vm_per_s", {})}
    out = {k: [med("U", k), med("D", k)] for k in VM_KEYS + IRQ_KEYS + PROC_KEYS if k in keys}
    return {k: v for k, v in out.items() if any(x for x in v)}


def thp_settings() -> str:
    """The machine's transparent-huge-page settings ("enabled=... defrag=..."), '' where not exposed."""
    parts = []
    for name in ("enabled", "defrag"):
        try:
            with open(f"/sys/kernel/mm/transparent_hugepage/{name}") as fh:
                parts.append(f"{name}={fh.read().strip()}")
        except OSError:
            pass
    return " ".join(parts)


def host_share(before: list[int] | None, after: list[int] | None) -> dict:
    """Steal and busy % of all CPUs between two host_ticks() readings: is the machine itself noisy in a phase?
    (steal = time the hypervisor gave this VM's CPUs to someone else)."""
    if not before or not after:
        return {}
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    if total <= 0:
        return {}
    return {"host_steal_pct": round(100 * d[7] / total, 2), "host_busy_pct": round(100 * (total - d[3] - d[4]) / total, 2)}


def pinned(cpus: set[int] | None):
    """A preexec_fn that keeps a child on `cpus` (None: no pinning)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


def run_screen(pid: int, extra: list[str], seconds: float, size: tuple[int, int] = (160, 50),
               cpus: set[int] | None = None) -> dict:
    """`decodemon attach PID` (the live screen, not --json) in a pseudo-terminal of `size` for `seconds`, its output
    read and dropped as a terminal would take it, then `q`. Returns the monitor's CPU seconds and how it ended."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    child, fd = pty.fork()
    if child == 0:  # the monitor: no Python-level cleanup in this forked copy, exec or exit at once
        try:
            if cpus:
                os.sched_setaffinity(0, cpus)
            os.environ.update(TERM="xterm-256color", COLUMNS=str(size[0]), LINES=str(size[1]))
            os.execv(DM[0], DM + ["attach", str(pid)] + list(extra))
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))

    def drain(until: float) -> bool:
        """Read the screen until `until`; False once the monitor has closed it."""
        while time.monotonic() < until:
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    if not os.read(fd, 1 << 16):
                        return False
                except OSError:
                    return False
        return True

    out = {"screen": True}
    alive = drain(time.monotonic() + seconds)
    try:
        with open(f"/proc/{child}/stat") as fh:  # utime + stime, in clock ticks
            f = fh.read().rsplit(")", 1)[1].split()
            out["monitor_cpu_s"] = round((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError):
        pass
    if alive:
        try:
            os.write(fd, b"q")
        except OSError:
            pass
        drain(time.monotonic() + 5.0)
    for _ in range(50):
        if os.waitpid(child, os.WNOHANG)[0]:
            out["quit_on_q"] = alive
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        out["killed"] = True
    os.close(fd)
    return out


def engine_session(mode: str, tag: str, plan: list[str], phase_s: float, work: Path,
                   profiler_phase_s: float | None = None, attach_args: dict | None = None,
                   engine_cpus: set[int] | None = None, attach_cpus: dict | None = None,
                   screens: set[str] | None = None) -> dict:
    """Run one engine through a plan of phases ('U', 'D', 'Ddense', 'Dlong', 'P', or any label in `attach_args`,
    an attach with those extra arguments); return phases and token times. `engine_cpus` keeps the engine (and the
    NVML sidecar its agent starts) on those CPUs; `attach_cpus[label]` keeps that label's monitor process on its
    own. A label in `screens` attaches with the live screen in a pseudo-terminal (run_screen) instead of --json."""
    attach_args = {"Ddense": ["--window-period", "1", "--window-tokens", "2", "--window-min-tokens", "0"],
                   **(attach_args or {})}
    prof_dir = work / f"prof_{mode}_{tag}"
    prof_dir.mkdir(parents=True, exist_ok=True)
    times_file = work / f"times_{mode}_{tag}.json"
    pid_file = work / f"{mode}_{tag}.pid"
    err_path = work / f"{mode}_{tag}.engine.err"
    err = open(err_path, "w")
    cpu = ["--tiny", "--device", "cpu"] if os.environ.get("BENCH_CPU") == "1" else []  # a dry run of the script
    eng = subprocess.Popen(DM + ["run", "--pid-file", str(pid_file), "--"] + DEMO + cpu +
                           ["--mode", "eager" if cpu else mode, "--tokens", "0", "--times-file", str(times_file),
                            "--cpu-clocks", "--profiler-dir", str(prof_dir)], stdout=subprocess.DEVNULL, stderr=err,
                           preexec_fn=pinned(engine_cpus))
    pid = until_decoding(eng, err_path, pid_file)
    if pid is None:
        raise RuntimeError(err_path.read_text()[-2000:])
    phases, attach, profs, hosts = [], [], [], []
    for label in plan:
        h0, v0, w0 = host_ticks(), {**vm_counters(), **proc_counters(pid)}, time.time()
        secs = phase_s
        if isinstance(label, tuple):
            label, secs = label
        if label == "U":
            a = time.time()
            time.sleep(secs)
            phases.append(("U", a, time.time()))
        elif label in (screens or ()):
            a = time.time()
            rep = run_screen(pid, attach_args.get(label, []), secs, cpus=(attach_cpus or {}).get(label))
            phases.append((label, a, time.time()))
            attach.append((label, rep))
        elif label in ("D", "Dlong") or label in attach_args:
            extra = attach_args.get(label, [])
            a = time.time()
            r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", str(secs)] + extra,
                               capture_output=True, text=True, preexec_fn=pinned((attach_cpus or {}).get(label)))
            phases.append((label, a, time.time()))
            attach.append((label, json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()}))
        elif label == "P":
            k = len(profs)
            os.kill(pid, signal.SIGUSR1)
            while not (prof_dir / f"profiler{k}.start").exists():
                time.sleep(0.05)
            time.sleep(profiler_phase_s or phase_s)
            os.kill(pid, signal.SIGUSR1)
            res = None
            while res is None:  # the engine may still be writing it
                time.sleep(0.1)
                try:
                    res = json.loads((prof_dir / f"profiler{k}.json").read_text())
                except (OSError, ValueError):
                    res = None
            profs.append(res)
            phases.append(("P", res["start_unix_s"], res["end_unix_s"]))
            time.sleep(1.0)  # let the engine settle after the profiler's own processing
        hosts.append({**host_share(h0, host_ticks()),
                      **vm_rates(v0, {**vm_counters(), **proc_counters(pid)}, time.time() - w0)})
    os.kill(pid, signal.SIGTERM)
    eng.wait(timeout=60)
    tdata = json.loads(times_file.read_text())
    return {"phases": phases, "attach": attach, "profs": profs, "ends": tdata["end_unix_s"], "ms": tdata["ms"],
            "ms_iter": tdata.get("ms_iter"), "canary_us": tdata.get("canary_us"), "nvcsw": tdata.get("nvcsw"),
            "canary_c_us": tdata.get("canary_c_us"),
            **{k: tdata.get(k) for k in GC_KEYS},
            "hosts": hosts}


def host_summary(per: list[dict]) -> dict:
    """The machine during the unobserved phases: steal and busy ranges, and how the loop's speed went with steal."""
    u = [p for p in per if p["phase"] == "U" and p.get("median_ms") and "host_steal_pct" in p]
    if not u:
        return {}
    steal = [p["host_steal_pct"] for p in u]
    busy = [p["host_busy_pct"] for p in u]
    out = {"u_steal_pct": [min(steal), max(steal)], "u_busy_pct": [min(busy), max(busy)]}
    if len(u) >= 3 and len(set(steal)) > 1:
        out["r_ms_vs_steal"] = round(statistics.correlation([p["median_ms"] for p in u], steal), 3)
    return out


def speed_regimes(per: list[dict], factor: float = 1.25) -> dict:
    """Did the loop run at more than one speed? Phases (unobserved and decodemon's) whose median is over `factor`
    times the fastest unobserved phase's. On the H200 (seventh session, runs 11-13) the eager loop switched between
    ~21-24 and ~32-40 ms/token for seconds to a minute, attached or not; pairs across two speeds resolve nothing."""
    u = [p["median_ms"] for p in per if p["phase"] == "U" and p.get("median_ms")]
    d = [p["median_ms"] for p in per if p["phase"] in ("D", "Ddense", "Dlong") and p.get("median_ms")]
    if not u:
        return {}
    thr = factor * min(u)
    # Pairs whose three phases (U, D, U) all ran at the fast speed, judged as pair_stats judges them. This
    # conditions on the D phase being fast, so it cannot see decodemon causing the slow speed: read it beside
    # the counts of slow phases above, never alone.
    one = []
    for i in range(1, len(per) - 1):
        tri = (per[i - 1], per[i], per[i + 1])
        if per[i]["phase"] == "D" and tri[0]["phase"] == tri[2]["phase"] == "U" \
                and all(q.get("median_ms") and q["median_ms"] <= thr for q in tri):
            one.append(100.0 * (per[i]["median_ms"] / ((tri[0]["median_ms"] + tri[2]["median_ms"]) / 2) - 1))
    return {"threshold_ms": round(thr, 3), "u_slow": [sum(m > thr for m in u), len(u)],
            "observed_slow": [sum(m > thr for m in d), len(d)],
            "one_speed_pairs_pct": [round(x, 2) for x in one],
            "one_speed_overhead_pct_median": round(statistics.median(one), 2) if one else None}


def decodemon_phases(phases: list[dict]) -> list[dict]:
    """The decodemon engine's phases of a run's `phases` list (the torch.profiler engine's follow them): up to the
    unobserved phase after the long attach."""
    ends = [i for i, p in enumerate(phases) if p["phase"] == "Dlong"]
    return phases[:ends[0] + 2] if ends else phases


def speed_line(mode: str, sp: dict | None) -> str | None:
    """speed_regimes() in words, or None when every phase ran at one speed."""
    if not sp or not (sp["u_slow"][0] or sp["observed_slow"][0]):
        return None
    line = (f"Loop speed, {mode}: {sp['u_slow'][0]} of {sp['u_slow'][1]} unobserved and {sp['observed_slow'][0]} of "
            f"{sp['observed_slow'][1]} decodemon phases ran over {sp['threshold_ms']:.1f} ms/token (1.25x the fastest "
            "unobserved phase): the loop ran at more than one speed, and a pair across two speeds resolves nothing.")
    if sp.get("one_speed_overhead_pct_median") is not None:
        line += (f" The {len(sp['one_speed_pairs_pct'])} pairs whose three phases all ran at the fast speed: "
                 f"{sp['one_speed_overhead_pct_median']:+.2f}% (median; this leaves out any slow stretch decodemon "
                 "might cause, so read it with the counts).")
    return line


CANARY_WINDOW = 15  # tokens: the host's slow stretches last 1 s and more (40+ eager tokens)
CANARY_SLOW = 1.25  # a smoothed canary over 1.25x its unobserved 25th percentile: a slow core (~1.65x on the H200)


def core_speed(ms: list[float], canary_us: list[float] | None, is_u: list[bool]) -> dict | None:
    """Token times at one core speed. The eager loop is bound by its host thread, and on the H200's host that
    thread's core ran ~1.65x slower for seconds at a time, attached or not (eighth session, scripts/h200_speeds.py:
    slow tokens' decode-thread CPU time equalled their wall time, other threads' CPU ~0, run-queue wait 0, and the
    engine's ~30 us canary of fixed pure Python on the decode thread ran 1.68x slower). Each token's ms is scaled by
    ref / (the canary's rolling median over CANARY_WINDOW tokens), ref being that median over the unobserved
    tokens. Work decodemon adds to the decode thread (the hook, a window's open/close, GIL waits) is not in the
    canary, so it stays in the scaled time; a slowdown of the core itself would be scaled away, which is why
    `canary` (unobserved vs observed) is reported beside it. `is_u`: per token, whether it is unobserved."""
    if not canary_us or len(canary_us) != len(ms) or not any(is_u):
        return None
    c = np.asarray(canary_us, dtype=float)
    h = CANARY_WINDOW // 2
    pad = np.pad(c, (h, h), mode="edge")
    smooth = np.median(np.lib.stride_tricks.sliding_window_view(pad, CANARY_WINDOW), axis=1)
    u = np.asarray(is_u, dtype=bool)
    ref = float(np.median(smooth[u]))
    fast = float(np.percentile(smooth[u], 25))  # the core's usual speed, even where the unobserved phases ran slow
    return {"ms": list(np.asarray(ms, dtype=float) * ref / smooth), "ref_us": ref,
            "slow": list(smooth > CANARY_SLOW * fast)}


PHASE_SKIP_S = 0.05  # a phase's tokens: those that ended inside it, less its first 50 ms (the switch itself)
# An attach's start-up: on the H200 an eager 4 s attach's first 1.5 s ran +2.4 to +10.3% at one core speed, the
# rest +0.4 to +1.4% (scripts/attach_start.py, thirteenth session). An attach left on all day pays it once, so the
# pairs are also judged with each attach's first START_S left out.
START_S = 1.5


def after_start_phases(phases: list[tuple]) -> list[tuple]:
    """(label, t0, t1) phases with each default attach (D) starting START_S later, its start-up left out: phase_of
    then counts its tokens from START_S in (PHASE_SKIP_S is already inside START_S)."""
    return [(lab, t0 + START_S - PHASE_SKIP_S if lab == "D" else t0, t1) for lab, t0, t1 in phases]



def at_one_core_speed(phases: list[dict], times: dict, canary: str = "canary_us") -> list[float]:
    """The token times scaled to one core speed by the `canary` column (core_speed, the unobserved phases' tokens
    as its reference), or the raw ones where the log has no such canary or no unobserved token."""
    ends, ms = times["end_unix_s"], times["ms"]
    u = [(p["t0_unix_s"], p["t1_unix_s"]) for p in phases if p["phase"] == "U"]
    cs = core_speed(ms, times.get(canary), [any(phase_of(e, t0, t1) for t0, t1 in u) for e in ends])
    return cs["ms"] if cs is not None else ms


def time_profile(runs: list[tuple[list[dict], dict]], label: str = "D", bin_s: float = 0.5,
                 max_phase_s: float = 8.0) -> dict:
    """Where in an attach the tokens are slow: every token of each `label` attach after its process's first (of
    at most `max_phase_s`, so not the long one), over the mean of the median tokens of the unobserved phases on
    both sides of its attach, binned by its end's time since the attach started (the monitor process's launch),
    pooled over `runs`. Per bin: tokens and the median ratio, raw and at one core speed, as percent."""
    bins: dict[str, dict[int, list[float]]] = {"raw": {}, "core": {}}
    for phases, times in runs:
        ends, ms = times["end_unix_s"], times["ms"]
        views = {"raw": ms, "core": at_one_core_speed(phases, times)}
        first = next(i for i, p in enumerate(phases) if p["phase"] != "U")
        for i, p in enumerate(phases):
            if p["phase"] != label or i <= first or p["t1_unix_s"] - p["t0_unix_s"] > max_phase_s:
                continue
            nb = [q for q in (phases[i - 1], phases[i + 1] if i + 1 < len(phases) else None)
                  if q and q["phase"] == "U"]
            idx = [k for k, e in enumerate(ends) if phase_of(e, p["t0_unix_s"], p["t1_unix_s"])]
            for view, vals in views.items():
                refs = [[vals[k] for k, e in enumerate(ends) if phase_of(e, q["t0_unix_s"], q["t1_unix_s"])]
                        for q in nb]
                refs = [statistics.median(r) for r in refs if r]
                if not refs:
                    continue
                ref = statistics.mean(refs)
                for k in idx:
                    bins[view].setdefault(int((ends[k] - p["t0_unix_s"]) / bin_s), []).append(vals[k] / ref)
    return {"bin_s": bin_s, "label": label,
            "bins": [{"from_s": round(b * bin_s, 3), "tokens": len(bins["raw"][b]),
                      **{f"{v}_pct": round(100 * (statistics.median(bins[v][b]) - 1), 2) for v in ("raw", "core")}}
                     for b in sorted(bins["raw"])]}

def token_groups(phases: list[dict], ends: list[float], labels) -> dict[str, list[list[int]]]:
    """{label: one list of token indices per phase} for the phases of `labels` after the process's first attach
    that hold any of the tokens ending at `ends` (labels in the order their phases first come)."""
    first = next((i for i, p in enumerate(phases) if p["phase"] != "U"), len(phases))
    per: dict[str, list] = {}
    for i, p in enumerate(phases):
        if p["phase"] not in labels or i <= first:
            continue
        idx = [k for k, e in enumerate(ends) if phase_of(e, p["t0_unix_s"], p["t1_unix_s"])]
        if idx:
            per.setdefault(p["phase"], []).append(idx)
    return per


def phase_labels(spans: list[tuple], ends: list[float]) -> list[str | None]:
    """Per token, the label of the (label, t0, t1) span it ended in, or None."""
    return [next((lab for lab, t0, t1 in spans if phase_of(e, t0, t1)), None) for e in ends]


def switch_profile(phases: list[dict], times: dict, labels: tuple[str, ...] = ("U", "D", "Dlong")) -> dict:
    """The decode thread's voluntary context switches (the engine's `--cpu-clocks` token log, `nvcsw`) per label,
    every phase after the process's first attach: switches per second of its tokens (median over the phases),
    the share of its tokens that had any, and the median token without and with them (ms).

    An eager decode thread never blocks on its own (CUDA's sync spins): unobserved it made 0 a second on the
    H200. Attached, each switch is a wait, mostly for the GIL the agent thread took back (every wake-up of the
    agent and every libcupti call of a PM pump gives it up and takes it back), and the tokens that had one are
    the ones the agent touched. {} where the log has no `nvcsw` (runs before the fourteenth session's last)."""
    nv, ends, ms = times.get("nvcsw"), times["end_unix_s"], times["ms"]
    if not nv or len(nv) != len(ms):
        return {}
    out = {}
    for label, groups in token_groups(phases, ends, labels).items():
        idx = [k for g in groups for k in g]
        quiet = [ms[k] for k in idx if nv[k] == 0]
        woken = [ms[k] for k in idx if nv[k] > 0]
        out[label] = {"phases": len(groups),
                      "per_s": round(statistics.median(1e3 * sum(nv[k] for k in g) / sum(ms[k] for k in g)
                                                       for g in groups), 1),
                      "tokens": len(idx), "share_with": round(len(woken) / len(idx), 3),
                      "median_ms_without": round(statistics.median(quiet), 3) if quiet else None,
                      "median_ms_with": round(statistics.median(woken), 3) if woken else None}
    return out


GC_KEYS = ("gc_ms", "gc_n", "gc_other_ms")  # the engine's --cpu-clocks token log, since the sixteenth session


def gc_profile(phases: list[dict], times: dict, labels: tuple[str, ...] = ("U", "D", "Dlong")) -> dict:
    """The cyclic garbage collector per label, every phase after the process's first attach (the engine's
    `--cpu-clocks` log: `gc_ms`, `gc_n` on the decode thread and `gc_other_ms` on other threads, per token):
    collections and ms a second on the decode thread, ms a second on the others, and the share of tokens with a
    collection on the decode thread (medians over the phases). An attached process allocates more objects that
    live on, so the collector may run more often, on whichever thread crosses its threshold. {} without the log."""
    ends, ms = times["end_unix_s"], times["ms"]
    cols = [times.get(k) for k in GC_KEYS]
    if any(not c or len(c) != len(ms) for c in cols):
        return {}
    gms, gn, gother = cols
    per = token_groups(phases, ends, labels)
    out: dict[str, dict] = {}
    for label in (lab for lab in labels if lab in per):
        groups = per[label]
        secs = [sum(ms[k] for k in g) / 1e3 for g in groups]
        med = lambda col: round(statistics.median(sum(col[k] for k in g) / s for g, s in zip(groups, secs)), 3)  # noqa: E731
        idx = [k for g in groups for k in g]
        out[label] = {"phases": len(groups), "collections_per_s": med(gn), "ms_per_s": med(gms),
                      "other_threads_ms_per_s": med(gother),
                      "share_with": round(sum(1 for k in idx if gn[k]) / len(idx), 4)}
    return out


def gc_line(r: dict) -> str | None:
    """gc_profile in words (absent from runs before the sixteenth session's last)."""
    g = r.get("gc") or {}
    names = {"U": "unobserved", "D": "default attaches", "Dlong": "the long attach"}
    parts = [f"{names.get(k, k)} {v['collections_per_s']:g} collections and {v['ms_per_s']:g} ms a second on the "
             f"decode thread ({100 * v['share_with']:.2f}% of tokens), {v['other_threads_ms_per_s']:g} ms a second "
             "on other threads" for k, v in g.items()]
    if not parts:
        return None
    return f"The garbage collector, {r['mode']} (after the first attach): " + "; ".join(parts) + "."


def quiet_overhead(phases: list[dict], times: dict, label: str = "D") -> dict:
    """The median overhead of `label`'s attaches (pair_stats, against the unobserved phases on both sides), raw and
    at one core speed, over all their tokens and over only the tokens in which the decode thread made no
    voluntary switch (`nvcsw` 0: the agent thread did not take the GIL from it). What is left in the second is
    what watching costs a token the agent never touched: other processes, caches, the core. {} without `nvcsw`."""
    nv, ends = times.get("nvcsw"), times["end_unix_s"]
    if not nv or len(nv) != len(ends):
        return {}
    spans = [(p["phase"], p["t0_unix_s"], p["t1_unix_s"]) for p in phases]
    quiet = [k for k, x in enumerate(nv) if x == 0]
    out = {}
    for view, vals in (("raw", times["ms"]), ("core", at_one_core_speed(phases, times))):
        for name, idx in (("all", range(len(ends))), ("quiet", quiet)):
            rows = phase_rows(spans, [ends[k] for k in idx], [float(vals[k]) for k in idx])
            out[f"{view}_{name}_pct"] = round(pair_stats(rows, label)["overhead_pct_median"], 2)
    return out


def logged_phases(phases: list[dict], ends: list[float]) -> list[dict]:
    """The phases of the engine whose token log ended its tokens at `ends` (a run's phases list has torch.profiler's
    engine's after the decodemon engine's)."""
    return [p for p in phases if any(p["t0_unix_s"] <= e <= p["t1_unix_s"] for e in ends)]


def phase_of(e: float, t0: float, t1: float) -> bool:
    return t0 + PHASE_SKIP_S <= e <= t1


def phase_rows(phases: list[tuple], ends: list[float], values: list[float]) -> list[dict]:
    """Per phase (label, t0, t1): its tokens' values with their median and p99, as pair_stats reads them."""
    rows = []
    for label, t0, t1 in phases:
        xs = [v for e, v in zip(ends, values) if phase_of(e, t0, t1)]
        rows.append({"phase": label, "median_ms": statistics.median(xs) if xs else None,
                     "p99_ms": pct(xs, 99) if xs else None, "ms": xs})
    return rows


def run_mode(mode: str, phase_s: float, pairs: int, work: Path, profiler_phase_s: float, long_s: float) -> dict:
    # decodemon and torch.profiler each bring a libcupti; once kineto has initialised CUPTI it stays attached
    # (tokens after a profiler phase ran ~13% slower in graph mode), and after decodemon's CUPTI has loaded,
    # kineto recorded no GPU events at all. So they get separate engine processes of the same mode and seed.
    a = engine_session(mode, "dm", ["U", "D"] * pairs + ["U", "Ddense"] * 2 + ["U", ("Dlong", long_s), "U"],
                       phase_s, work)
    b = engine_session(mode, "prof", ["U", "P"] * 2 + ["U"], phase_s, work, profiler_phase_s)
    out = {"mode": mode, "attach": [x for _, x in a["attach"]]}
    per_all = []
    for sess in (a, b):
        per = phase_rows(sess["phases"], sess["ends"], sess["ms"])
        for row, (_, t0, t1), host in zip(per, sess["phases"], sess["hosts"]):
            xs = row["ms"]
            row.update(tokens=len(xs), mean_ms=statistics.fmean(xs) if xs else None, **host,
                       # the phase's span (unix s), so the tokens under OUT/times can be re-read by phase
                       t0_unix_s=round(t0, 3), t1_unix_s=round(t1, 3))
        per_all.append(per)
    out["phases"] = [{k: v for k, v in p.items() if k != "ms"} for per in per_all for p in per]
    # the same tokens on the engine's other clock, stamped after the token clock's hook (which then counts in the
    # token just emitted, not the one the user waits for next): p99 per pair and over the long attach
    if a.get("ms_iter"):
        per_i = phase_rows(a["phases"], a["ends"], a["ms_iter"])
        u_i = [m for p in per_i[1:] if p["phase"] == "U" for m in p["ms"]]
        dl_i = [m for p in per_i if p["phase"] == "Dlong" for m in p["ms"]]
        st = pair_stats(per_i, "D")
        out["iteration_clock"] = {"p99_ratio_median": st["p99_ratio_median"],
                                  "p99_ratio_median_after_first": st["p99_ratio_median_after_first"],
                                  "overhead_pct_median": st["overhead_pct_median"],
                                  "long_p99_ratio": pct(dl_i, 99) / pct(u_i, 99) if dl_i and u_i else None}
    for label, per in (("D", per_all[0]), ("Ddense", per_all[0]), ("P", per_all[1])):
        out[label] = pair_stats(per, label)
    # the same pairs with each default attach's start-up left out (START_S)
    after_start = after_start_phases(a["phases"])
    out["D_after_start"] = pair_stats(phase_rows(after_start, a["ends"], a["ms"]), "D")
    # where in a default attach the tokens were slow (scripts/attach_start.py --profile on this run's tokens)
    a_phases = [{"phase": lab, "t0_unix_s": t0, "t1_unix_s": t1} for lab, t0, t1 in a["phases"]]
    a_times = {"end_unix_s": a["ends"], "ms": a["ms"], "nvcsw": a.get("nvcsw"), "canary_us": a.get("canary_us"),
               **{k: a.get(k) for k in GC_KEYS}}
    out["start_profile"] = time_profile([(a_phases, a_times)], max_phase_s=max(8.0, 1.5 * phase_s))
    # the decode thread's voluntary switches: the tokens the agent thread touched (switch_profile)
    out["switches"] = switch_profile(a_phases, a_times)
    out["quiet"] = quiet_overhead(a_phases, a_times, "D")  # the tokens the agent never touched
    out["gc"] = gc_profile(a_phases, a_times)  # the garbage collector's time, per thread
    if mode == "eager":  # one core speed by the C canary (c_canary_view)
        out["core_c"] = c_canary_view(a_phases, {**a_times, "canary_c_us": a.get("canary_c_us")})
    # the same pairs at one core speed (see core_speed), and whether decodemon's phases ran on a slower core
    core_per = []
    canary = {}
    core_after_start = None
    for sess in (a, b) if mode == "eager" else ():  # a graphed loop waits on the GPU: its core's speed is not its
        ends = sess["ends"]
        where = phase_labels(sess["phases"], ends)
        cs = core_speed(sess["ms"], sess.get("canary_us"), [w == "U" for w in where])
        if cs is None:
            core_per.append(None)
            continue
        core_per.append(phase_rows(sess["phases"], ends, cs["ms"]))
        if sess is a:
            core_after_start = pair_stats(phase_rows(after_start, ends, cs["ms"]), "D")
            for kind in ("U", "D"):
                sel = [i for i, w in enumerate(where) if w == kind]
                cc = sess.get("canary_c_us")
                canary[kind] = {"median_us": round(float(np.median([sess["canary_us"][i] for i in sel])), 2)
                                if sel else None,
                                # the C canary (no bytecode): since the fifteenth session's last commits
                                "c_median_us": round(float(np.median([cc[i] for i in sel])), 3)
                                if sel and cc and len(cc) == len(sess["ms"]) else None,
                                "slow_core_share": round(sum(cs["slow"][i] for i in sel) / len(sel), 3) if sel else None}
            canary["ref_us"] = round(cs["ref_us"], 2)
    if core_per and core_per[0] is not None:
        out["core"] = {label: pair_stats(per, label) for label, per in
                       (("D", core_per[0]), ("Ddense", core_per[0]), ("P", core_per[1]))
                       if per is not None}
        cu = [m for p in core_per[0][1:] if p["phase"] == "U" for m in p["ms"]]
        cl = [m for p in core_per[0] if p["phase"] == "Dlong" for m in p["ms"]]
        out["core"]["long_p99_ratio"] = pct(cl, 99) / pct(cu, 99) if cl and cu else None
        out["core"]["D_after_start"] = core_after_start
        out["core"]["canary"] = canary
    # all tokens of each kind in the decodemon process: the first U phase (before any attach) is left out,
    # because the first attach itself changed the graphed loop's speed (see docs/benchmarks.md)
    uall = [m for p in per_all[0][1:] if p["phase"] == "U" for m in p["ms"]]
    dall = [m for p in per_all[0] if p["phase"] == "D" for m in p["ms"]]
    dlong = [m for p in per_all[0] if p["phase"] == "Dlong" for m in p["ms"]]
    out["Dlong"] = {"median_ms": statistics.median(dlong) if dlong else None, "p99_ms": pct(dlong, 99),
                    "tokens": len(dlong), "seconds": long_s,
                    "slow_tokens_over_1.1x_u_p99": sum(m > 1.1 * pct(uall, 99) for m in dlong)}
    out["host"] = host_summary(per_all[0])
    out["vm"] = vm_summary(per_all[0])
    out["speeds"] = speed_regimes(per_all[0])
    first_u = per_all[0][0]
    out["U_first"] = {"median_ms": first_u["median_ms"], "p99_ms": first_u["p99_ms"], "tokens": first_u["tokens"]}
    out["U_all"] = {"median_ms": statistics.median(uall), "p99_ms": pct(uall, 99), "tokens": len(uall)}
    out["D_all"] = {"median_ms": statistics.median(dall), "p99_ms": pct(dall, 99), "tokens": len(dall)}
    # the process's first attach carries one-off costs (cupti imports, CUPTI's first initialisation, the PM
    # first-session switch): the later short attaches pooled apart
    dlater = [m for p in [p for p in per_all[0] if p["phase"] == "D"][1:] for m in p["ms"]]
    out["D_later"] = {"median_ms": statistics.median(dlater) if dlater else None, "p99_ms": pct(dlater, 99),
                      "tokens": len(dlater)}
    profs = b["profs"]
    ok = [x for lab, x in a["attach"] if lab == "D" and "error" not in x and x.get("launches_per_token")]
    out["accuracy"] = {
        "profiler_kernels_per_token": statistics.median(p["kernels_per_token"] for p in profs) if profs else None,
        "profiler_kernel_ms_per_token": statistics.median(p["kernel_ms_per_token"] for p in profs) if profs else None,
        "decodemon_launches_per_token": statistics.median(x["launches_per_token"] for x in ok) if ok else None,
        "decodemon_kernel_ms_per_token": statistics.median(x["kernel_sum_ms_per_token"] for x in ok) if ok else None,
        "pm_gpu_busy_pct": statistics.median(x["pm_gpu_busy_pct"] for x in ok if x.get("pm_gpu_busy_pct") is not None)
        if any(x.get("pm_gpu_busy_pct") is not None for x in ok) else None,
        "traced_gpu_busy_pct": statistics.median(x["traced_gpu_busy_pct"] for x in ok) if ok else None,
        # the traced kernels' busy time per token ÷ the untraced tokens' ms/token: what PM sees, from the window
        "kernel_share_of_step_pct": statistics.median(x["kernel_share_of_step_pct"] for x in ok
                                                      if x.get("kernel_share_of_step_pct") is not None)
        if any(x.get("kernel_share_of_step_pct") is not None for x in ok) else None,
        # the two instruments over the same GPU time: the PM samples inside each attach's traced tokens, PM's busy
        # counter against the traced kernels' union over exactly those samples (pooled, sample-weighted)
        "pm_vs_window": pool_pm_checks([x.get("pm_vs_window") for lab, x in a["attach"]
                                        if lab in ("D", "Dlong") and "error" not in x]),
        "pm_state": ok[-1]["probe"].get("pm") if ok else None,
        # the agent thread's PM pumps: CPU outside libcupti's calls (which run without the GIL): the most they can
        # take from an eager decode thread, which needs the GIL
        "pm_cpu": ok[-1]["probe"].get("pm_cpu") if ok else None,
        "windows_per_attach": [x.get("windows") for x in ok],
        "seconds_per_attach": phase_s,
    }
    return out


def pool_pm_checks(checks: list) -> dict | None:
    """Attaches' `pm_vs_window` figures pooled, each weighted by its samples; the largest attach-level gap beside."""
    cs = [c for c in checks if c and c.get("samples")]
    n = sum(c["samples"] for c in cs)
    if not n:
        return None
    pm = sum(c["pm_gpu_busy_pct"] * c["samples"] for c in cs) / n
    tr = sum(c["traced_gpu_busy_pct"] * c["samples"] for c in cs) / n
    return {"samples": n, "attaches": len(cs), "pm_gpu_busy_pct": round(pm, 2), "traced_gpu_busy_pct": round(tr, 2),
            "max_attach_gap_points": round(max(abs(c["pm_gpu_busy_pct"] - c["traced_gpu_busy_pct"]) for c in cs), 1)}


def fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)


def p99_noise(v: dict) -> str:
    """' (noise ±N%)' after a p99 ratio: the same ratio taken for an unobserved phase between two others."""
    n = v.get("p99_noise_floor_bracketed_pct")
    return "" if n is None else f" (noise ±{n:.1f}%)"


def core_table(results: list[dict], names: dict) -> list[str]:
    """The pairs again at one core speed (core_speed): the same arithmetic on canary-scaled token times."""
    rows = [r for r in results if r.get("core")]
    if not rows:
        return []
    lines = ["", "## The same pairs at one core speed", "",
             "The eager loop is bound by its host thread, and that thread's core ran ~1.65× slower for seconds at a "
             "time, attached or not (scripts/h200_speeds.py: the slow tokens' thread CPU time equalled their wall "
             "time, other threads' CPU ~0, run-queue wait 0, and a fixed ~30 µs canary of pure Python on the decode "
             "thread ran 1.68× slower with them). Eager rows only: a graphed loop waits on the GPU, not its core. "
             "Here each token's time is scaled by the unobserved tokens' canary "
             f"median ÷ the canary's rolling median over {CANARY_WINDOW} tokens. Work decodemon adds on the decode "
             "thread is not in the canary and stays in; a slower core under decodemon would be scaled away, so the "
             "canary's own figures for unobserved and decodemon tokens are shown beside.", "",
             "| mode | observer | pairs | overhead (median) | spread | overhead, pairs after the first | noise floor | "
             "p99 ratio (median) | p99 ratio, pairs after the first | canary µs, unobserved vs decodemon (median) | "
             "tokens on a slow core, unobserved vs decodemon |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["core"]
        cn = c.get("canary") or {}
        cu, cd = cn.get("U") or {}, cn.get("D") or {}
        for k in ("D", "P", "Ddense"):
            v = c.get(k)
            if not v:
                continue
            can = (f"{fmt(cu.get('median_us'), '.1f')} vs {fmt(cd.get('median_us'), '.1f')} | "
                   f"{fmt(100 * cu['slow_core_share'] if cu.get('slow_core_share') is not None else None, '.1f')}% vs "
                   f"{fmt(100 * cd['slow_core_share'] if cd.get('slow_core_share') is not None else None, '.1f')}%"
                   if k == "D" else "— | —")
            lines.append(f"| {r['mode']} | {names[k]} | {v['pairs']} | {fmt(v['overhead_pct_median'], '+.2f')}% | "
                         f"{fmt(v['overhead_pct_min'], '+.2f')}%..{fmt(v['overhead_pct_max'], '+.2f')}% | "
                         f"{fmt(v.get('overhead_pct_median_after_first'), '+.2f')}% | "
                         f"±{fmt(v.get('noise_floor_bracketed_pct'), '.2f')}% | {fmt(v['p99_ratio_median'], '.3f')}"
                         f"{p99_noise(v)} | "
                         f"{fmt(v.get('p99_ratio_median_after_first'), '.3f')} | {can} |")
    lines.append("")
    lines += [f"Long attach at one core speed, {r['mode']}: p99 ratio {fmt(r['core'].get('long_p99_ratio'))}."
              for r in rows]
    lines += [x for x in (c_canary_line(r) for r in rows) if x]
    lines += [x for x in (c_canary_view_line(r) for r in rows) if x]
    return lines


def c_canary_view(phases: list[dict], times: dict, label: str = "D") -> dict:
    """The default attaches at one core speed by the C canary (`canary_c_us`: zlib.crc32 of 4 KB, 16 times, no
    bytecode) instead of the Python one: core_speed, pair_stats and the p99 ratios, as for the Python canary's view.

    Why (sixteenth session): the ~30 us Python canary ran 1-2% faster while attached in most A/B labels and runs
    (in run 37, 0.9%), the C canary not (23.36 against 23.32 us), so scaling by the Python canary adds that much
    to an attached token; and across run 37's unobserved phases the C canary's median followed the loop's own
    (19.28 ms with 22.55 us, 21.43 ms with 24.59 us). The fifteenth session set the rule before either was
    measured: a Python canary faster attached and a C one not says the Python view scales by the interpreter,
    not the core. {} without the C canary."""
    cc, ends, ms = times.get("canary_c_us"), times["end_unix_s"], times["ms"]
    spans = [(p["phase"], p["t0_unix_s"], p["t1_unix_s"]) for p in phases]
    if not cc or len(cc) != len(ms) or "U" not in phase_labels(spans, ends):
        return {}
    scaled = at_one_core_speed(phases, times, "canary_c_us")
    per = phase_rows(spans, ends, scaled)
    st = pair_stats(per, label)
    u = [m for p in per[1:] if p["phase"] == "U" for m in p["ms"]]
    first = next((i for i, p in enumerate(per) if p["phase"] != "U"), len(per))
    later = [m for i, p in enumerate(per) if p["phase"] == label and i > first for m in p["ms"]]
    lng = [m for p in per if p["phase"] == "Dlong" for m in p["ms"]]
    after = pair_stats(phase_rows(after_start_phases(spans), ends, scaled), "D") if label == "D" else {}
    return {label: {k: st.get(k) for k in ("pairs", "overhead_pct_median", "overhead_pct_median_after_first",
                                         "noise_floor_bracketed_pct", "p99_ratio_median",
                                         "p99_ratio_median_after_first", "overhead_mean_pct_median")},
            "D_after_start_pct": after.get("overhead_pct_median"),
            "pooled_p99_ratio": pct(later, 99) / pct(u, 99) if later and u else None,
            "long_p99_ratio": pct(lng, 99) / pct(u, 99) if lng and u else None}


def c_canary_view_line(r: dict) -> str | None:
    """c_canary_view in words (absent from runs before the sixteenth session's last commits)."""
    v = r.get("core_c") or {}
    d = v.get("D")
    if not d:
        return None
    return (f"At one core speed by the C canary, {r['mode']} (each token scaled as above, by zlib.crc32's rolling "
            "median instead of the Python canary's): decodemon defaults median "
            f"{fmt(d['overhead_pct_median'], '+.2f')}% (noise floor ±{fmt(d['noise_floor_bracketed_pct'], '.2f')}%, "
            f"after the first {fmt(d['overhead_pct_median_after_first'], '+.2f')}%, first 1.5 s of each attach left out "
            f"{fmt(v.get('D_after_start_pct'), '+.2f')}{'%' if v.get('D_after_start_pct') is not None else ''}); p99 ratio per pair {fmt(d['p99_ratio_median'], '.3f')} "
            f"(after the first {fmt(d['p99_ratio_median_after_first'], '.3f')}), pooled after the first "
            f"{fmt(v.get('pooled_p99_ratio'), '.3f')}, over the long attach {fmt(v.get('long_p99_ratio'), '.3f')}.")


def c_canary_line(r: dict) -> str | None:
    """The C canary beside the Python one (absent from runs before the fifteenth session's last commits)."""
    cn = (r.get("core") or {}).get("canary") or {}
    u, d = cn.get("U") or {}, cn.get("D") or {}
    if u.get("c_median_us") is None or d.get("c_median_us") is None:
        return None
    return (f"Canaries, {r['mode']} (median, unobserved vs default attaches): Python {fmt(u.get('median_us'), '.1f')} "
            f"vs {fmt(d.get('median_us'), '.1f')} µs; C (zlib.crc32 of 4 KB, 16 times, the GIL held) "
            f"{fmt(u['c_median_us'], '.2f')} vs {fmt(d['c_median_us'], '.2f')} µs. A Python canary faster while "
            "attached and a C one not would say the one core speed view scales by the interpreter, not the core.")


def after_start_line(r: dict) -> str | None:
    """The default pairs again with each attach's first START_S left out (absent from runs before the thirteenth
    session's last ones)."""
    st = r.get("D_after_start")
    if not st:
        return None
    core = (r.get("core") or {}).get("D_after_start")
    at_core = (f"; at one core speed {fmt(core.get('overhead_pct_median'), '+.2f')}% (after the first "
               f"{fmt(core.get('overhead_pct_median_after_first'), '+.2f')}%)" if core else "")
    return (f"Each default attach with its first {START_S:g} s left out (the start-up an attach left on all day pays "
            f"once), {r['mode']}: median {fmt(st.get('overhead_pct_median'), '+.2f')}% (after the first "
            f"{fmt(st.get('overhead_pct_median_after_first'), '+.2f')}%, noise floor "
            f"±{fmt(st.get('noise_floor_bracketed_pct'), '.2f')}%){at_core}.")


def switch_line(r: dict) -> str | None:
    """switch_profile in words (absent from runs before the fifteenth session)."""
    sw = r.get("switches") or {}
    names = {"U": "unobserved", "D": "default attaches", "Dlong": "the long attach"}
    parts = [f"{names.get(k, k)} {v['per_s']:g}/s, {100 * v['share_with']:.1f}% of tokens"
             + (f" (median {fmt(v['median_ms_without'], '.2f')} ms without, {fmt(v['median_ms_with'], '.2f')} with)"
                if v["share_with"] else "")
             for k, v in sw.items()]
    if not parts:
        return None
    q = r.get("quiet") or {}
    tail = (f" Default attaches' median overhead over all tokens / over the tokens without a switch: raw "
            f"{fmt(q.get('raw_all_pct'), '+.2f')}% / {fmt(q.get('raw_quiet_pct'), '+.2f')}%, at one core speed "
            f"{fmt(q.get('core_all_pct'), '+.2f')}% / {fmt(q.get('core_quiet_pct'), '+.2f')}%." if q else "")
    return (f"The decode thread's voluntary context switches, {r['mode']} (after the first attach; each one a wait, "
            "mostly for the GIL the agent thread took back): " + "; ".join(parts) + "." + tail)


def start_profile_line(r: dict) -> str | None:
    """time_profile's bins in words (absent from runs before the fourteenth session's last ones)."""
    bins = (r.get("start_profile") or {}).get("bins")
    if not bins:
        return None
    w = r["start_profile"]["bin_s"]
    return (f"Where in a default attach (after the process's first, not the long one) the tokens were slow, {r['mode']}: "
            "each token over its attach's unobserved neighbours, median per bin from the monitor's launch, raw: "
            + ", ".join(f"{b['from_s']:g}-{b['from_s'] + w:g} s {b['raw_pct']:+.2f}%" for b in bins) + ".")


LIMITS = {"median_pct": 1.0, "p99_ratio": 1.1, "window_s": 5.0, "kernel_ms_pct": 3.0, "pm_points": 5.0}


def labelled_attaches(r: dict) -> list[tuple[str, dict]]:
    """A mode's attach reports with their plan labels: run_mode keeps them in plan order (engine_session: the
    pairs' D, the dense ones, the long one), and its phases list has the same labels in the same order."""
    labels = [p["phase"] for p in r.get("phases", []) if p["phase"] in ("D", "Ddense", "Dlong")]
    return list(zip(labels, r.get("attach", [])))


def window_gaps(r: dict, label: str = "D") -> list[float]:
    """The `label` attaches' windows: each one's `window_every_s` (the monitor's median gap between windows)."""
    return [a["observer_cost"]["window_every_s"] for lab, a in labelled_attaches(r)
            if lab == label and (a.get("observer_cost") or {}).get("window_every_s")]


def pm_continuous(r: dict) -> tuple[int, int]:
    """(default and long attaches whose PM sampling stayed armed and lost nothing, all of them): armed, never
    re-armed, and no `pm_lost` in the probe's state at the attach's end."""
    probes = [a.get("probe") or {} for lab, a in labelled_attaches(r) if lab in ("D", "Dlong")]
    good = [p for p in probes if str(p.get("pm", "")).startswith("armed") and "re-armed" not in str(p.get("pm"))
            and not p.get("pm_lost")]
    return len(good), len(probes)


def acceptance_lines(results: list[dict]) -> list[str]:
    """Issue #5's limits against this run, mode by mode: the median (eager: raw and at one core speed by the C
    canary, the yardstick since the sixteenth session), the p99 per pair, how far apart the default attaches'
    windows came (the slowest attach's median gap, and the long attach's), and the accuracy figures."""
    def ok(x, limit, le=True):
        return "—" if x is None else ("met" if (x <= limit if le else abs(x) <= limit) else "not met")

    out = ["", "Issue #5's limits in this run (median ≤ 1%, p99 ≤ 1.1× per pair, a window at least every 5 s, "
           "PM sampling continuous, launches equal, kernel time within 3%, PM GPU busy within 5 points):"]
    for r in results:
        d, acc = r["D"], r.get("accuracy") or {}
        med, p99 = d.get("overhead_pct_median"), d.get("p99_ratio_median")
        parts = [f"median {fmt(med, '+.2f')}% raw ({ok(med, LIMITS['median_pct'])})"]
        c = ((r.get("core_c") or {}).get("D") or {})
        if c:
            parts.append(f"{fmt(c.get('overhead_pct_median'), '+.2f')}% by the C canary "
                         f"({ok(c.get('overhead_pct_median'), LIMITS['median_pct'])})")
        parts.append(f"p99 {fmt(p99)}× raw ({ok(p99, LIMITS['p99_ratio'])})")
        if c:
            parts.append(f"{fmt(c.get('p99_ratio_median'))}× by the C canary "
                         f"({ok(c.get('p99_ratio_median'), LIMITS['p99_ratio'])})")
        gaps, long_gap = window_gaps(r), window_gaps(r, "Dlong")
        worst = max(gaps + long_gap) if gaps + long_gap else None
        parts.append(f"windows every {fmt(worst, '.2f')} s at most ({ok(worst, LIMITS['window_s'])})")
        pm_ok, pm_all = pm_continuous(r)
        if pm_all:
            parts.append(f"PM sampling armed and nothing lost in {pm_ok} of {pm_all} attaches "
                         f"({'met' if pm_ok == pm_all else 'not met'})")
        la, lp = acc.get("decodemon_launches_per_token"), acc.get("profiler_kernels_per_token")
        if la is not None and lp is not None:
            parts.append(f"launches {la:.1f} vs {lp:.1f} ({'met' if round(la, 1) == round(lp, 1) else 'not met'})")
        km, kp = acc.get("decodemon_kernel_ms_per_token"), acc.get("profiler_kernel_ms_per_token")
        if km and kp:
            dk = 100 * (km / kp - 1)
            parts.append(f"kernel ms {dk:+.1f}% ({ok(dk, LIMITS['kernel_ms_pct'], le=False)})")
        pv = acc.get("pm_vs_window") or {}
        if pv.get("pm_gpu_busy_pct") is not None and pv.get("traced_gpu_busy_pct") is not None:
            dp = pv["pm_gpu_busy_pct"] - pv["traced_gpu_busy_pct"]
            parts.append(f"PM {dp:+.1f} points ({ok(dp, LIMITS['pm_points'], le=False)})")
        out.append(f"- {r['mode']}: " + "; ".join(parts) + ".")
    return out


def markdown(results: list[dict], env: dict, cmd: str) -> str:
    lines = [
        "# What watching costs",
        "",
        f"Device: {env.get('gpu')} · driver {env.get('driver')} · cupti-python {env.get('cupti')} · "
        f"torch {env.get('torch')} · date {env.get('date')}"
        + (f" · transparent huge pages: {env['thp']}" if env.get("thp") else ""),
        "",
        f"Command: `{cmd}` (through `bash scripts/h200.sh benchmarks/overhead.py` on the lent H200).",
        "",
        "Interleaved phases on a running demo engine per mode (Qwen3-0.6B shape, bf16, batch 1, `.item()` every "
        "token); every phase's ms/token is the engine's own clock: inter-token latency, from one token's arrival on "
        "the host to the next's, the token clock's hook included (in the token after it). "
        "Overhead = observed phase median ÷ the mean of the unobserved phases on both sides of it (p99 likewise); "
        "spread = min..max over the pairs; 'after the first' leaves out the process's first attach. "
        "decodemon's phases and torch.profiler's run in two engine processes of the same mode and seed: the two "
        "bring different libcupti builds, kineto leaves CUPTI attached after its phase, and after decodemon's "
        "CUPTI had loaded kineto recorded no GPU events.",
        "",
        "| mode | observer | pairs | median ms/token | overhead (median) | spread | overhead, pairs after the "
        "first | noise floor (unobserved between unobserved) | p99 ratio (median) | p99 ratio, pairs after the first |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = {"D": "decodemon, defaults (1 traced token every 4 s and ≥ 250 tokens, ≤ 5 s apart; PM 2 ms)", "P": "torch.profiler (CPU+CUDA)",
             "Ddense": "decodemon, dense (2 tokens every 1 s)"}
    for r in results:
        lines.append(f"| {r['mode']} | unobserved | — | {fmt(r['U_all']['median_ms'])} | — | — | — | — | — | — |")
        for k in ("D", "P", "Ddense"):
            v = r[k]
            lines.append(f"| {r['mode']} | {names[k]} | {v['pairs']} | {fmt(v['median_ms'])} | "
                         f"{fmt(v['overhead_pct_median'], '+.2f')}% | {fmt(v['overhead_pct_min'], '+.2f')}%.."
                         f"{fmt(v['overhead_pct_max'], '+.2f')}% | {fmt(v.get('overhead_pct_median_after_first'), '+.2f')}% | "
                         f"±{fmt(v.get('noise_floor_bracketed_pct'), '.2f')}% (after/before ±{fmt(v.get('noise_floor_pct'), '.2f')}%) | "
                         f"{fmt(v['p99_ratio_median'], '.3f')}{p99_noise(v)} | "
                         f"{fmt(v.get('p99_ratio_median_after_first'), '.3f')} |")
    secs = {r["mode"]: (r.get("accuracy") or {}).get("seconds_per_attach") for r in results}
    if len(set(secs.values())) > 1:  # --eager-phase-s: say which mode's phases were how long
        lines += ["", "Seconds per phase (unobserved, default and dense attaches): " +
                  ", ".join(f"{m} {s:g} s" for m, s in secs.items() if s) + "."]
    lines += acceptance_lines(results)
    lines += ["", "All decodemon phases against all unobserved phases after the first attach (p99 over every token of "
              "each kind); the first unobserved phase, before any attach, is shown apart:", "",
              "| mode | before any attach median / p99 | unobserved median / p99 | decodemon, all short attaches "
              "median / p99 (ratio) | decodemon, short attaches after the first, median / p99 (ratio) | decodemon, one long "
              "attach median / p99 (ratio) | tokens of the long attach over 1.1× unobserved p99 |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        u, d, f0, dl = r["U_all"], r["D_all"], r["U_first"], r["Dlong"]
        dlat = r.get("D_later") or {"median_ms": None, "p99_ms": float("nan")}
        lines.append(f"| {r['mode']} | {fmt(f0['median_ms'])} / {fmt(f0['p99_ms'])} | {u['median_ms']:.3f} / "
                     f"{u['p99_ms']:.3f} | {d['median_ms']:.3f} / {d['p99_ms']:.3f} ({d['p99_ms'] / u['p99_ms']:.3f}) | "
                     f"{fmt(dlat['median_ms'])} / {fmt(dlat['p99_ms'])} "
                     f"({fmt(dlat['p99_ms'] / u['p99_ms'] if dlat['p99_ms'] == dlat['p99_ms'] else None)}) | "
                     f"{fmt(dl['median_ms'])} / {fmt(dl['p99_ms'])} ({fmt(dl['p99_ms'] / u['p99_ms'] if dl['p99_ms'] else None)}) "
                     f"| {dl['slow_tokens_over_1.1x_u_p99']} of {dl['tokens']} ({dl['seconds']:g} s) |")
    lines += ["", "## Accuracy, same run", "",
              "| mode | launches/token decodemon vs torch.profiler | kernel ms/token decodemon vs torch.profiler | "
              "GPU busy over the traced tokens, same PM samples: PM vs traced kernel union | "
              "GPU busy: PM (whole attach) vs traced window (kernel union ÷ traced token) | GPU busy: PM (whole "
              "attach) vs traced kernels ÷ untraced step |", "|---|---|---|---|---|---|"]
    for r in results:
        a = r["accuracy"]
        kd = a["decodemon_kernel_ms_per_token"]
        kp = a["profiler_kernel_ms_per_token"]
        diff = f" ({100 * (kd / kp - 1):+.1f}%)" if kd and kp else ""
        c = a.get("pm_vs_window")
        same = (f"{c['pm_gpu_busy_pct']:.1f}% vs {c['traced_gpu_busy_pct']:.1f}% "
                f"({c['pm_gpu_busy_pct'] - c['traced_gpu_busy_pct']:+.1f} points; {c['samples']} samples of "
                f"{c['attaches']} attaches, widest attach {c['max_attach_gap_points']:g})" if c else "n/a")
        busy = (f"{same} | {fmt(a['pm_gpu_busy_pct'], '.1f')}% vs {fmt(a['traced_gpu_busy_pct'], '.1f')}% | "
                f"{fmt(a['pm_gpu_busy_pct'], '.1f')}% vs {fmt(a.get('kernel_share_of_step_pct'), '.1f')}%")
        lines.append(f"| {r['mode']} | {fmt(a['decodemon_launches_per_token'], '.1f')} vs "
                     f"{fmt(a['profiler_kernels_per_token'], '.1f')} | {fmt(kd)} vs {fmt(kp)}{diff} | {busy} |")
    lines += [""] + [f"PM pumps ({r['mode']}, the last attach): {r['accuracy'].get('pm_cpu') or 'n/a'}." for r in results]
    for r in results:
        last = r["attach"][-1] if r.get("attach") else {}
        lines.append(f"Mean token, {r['mode']}: decodemon defaults "
                     f"{fmt(r['D'].get('overhead_mean_pct_median'), '+.2f')}% (median of pairs); the monitor's own "
                     f"bill in the last attach: {''.join(observer_parts(last.get('observer_cost'))) or 'n/a'}.")
    for r in results:
        h = r.get("host") or {}
        if h:
            lines.append(f"The machine in {r['mode']}'s unobserved phases: steal {h['u_steal_pct'][0]:g}–"
                         f"{h['u_steal_pct'][1]:g}% and busy {h['u_busy_pct'][0]:g}–{h['u_busy_pct'][1]:g}% of all "
                         f"CPUs (/proc/stat)" + (f"; correlation of the phase's ms/token with steal "
                                                 f"{h['r_ms_vs_steal']:+.2f}" if "r_ms_vs_steal" in h else "") + ".")
    for r in results:
        vm = r.get("vm") or {}
        if vm:
            lines.append(f"Kernel memory work in {r['mode']}'s phases (/proc/vmstat and /proc/interrupts, whole machine; "
                         "engine_* the engine process's own, monitor_cpu_ms the finished attaches' monitor "
                         "processes; median per second, "
                         f"unobserved after the first vs default attaches): "
                         + ", ".join(f"{k} {fmt(u, 'g')} vs {fmt(d, 'g')}" for k, (u, d) in vm.items()) + ".")
    lines += [x for x in (speed_line(r["mode"], r.get("speeds")) for r in results) if x]
    lines += [x for x in (after_start_line(r) for r in results) if x]
    lines += [x for x in (start_profile_line(r) for r in results) if x]
    lines += [x for x in (switch_line(r) for r in results) if x]
    lines += [x for x in (gc_line(r) for r in results) if x]
    lines += core_table(results, names)
    lines += ["", "Token times above are inter-token latency: from one token's arrival on the host (`.item()` "
              "returning) to the next's, so the token clock's hook counts in the token after it. On the engine's "
              "other clock (stamped after the hook, which then counts in the token just emitted):"]
    for r in results:
        ic = r.get("iteration_clock") or {}
        lines.append(f"- {r['mode']}: p99 ratio per pair {fmt(ic.get('p99_ratio_median'))} (after the first "
                     f"{fmt(ic.get('p99_ratio_median_after_first'))}), long attach {fmt(ic.get('long_p99_ratio'))}, "
                     f"median overhead {fmt(ic.get('overhead_pct_median'), '+.2f')}%")
    lines += ["", "## Design decisions these rows reflect", "",
              "- Traced windows of whole tokens only, opened and closed at token boundaries by the engine's own "
              "token clock; CUPTI is finalized (detached) at the closing boundary, so untraced tokens run unobserved "
              "(without the finalize, graphed untraced tokens stayed ~12% slower: scripts/h200_probe_experiments.py).",
              "- Flush and finalize happen on the decode thread at that one boundary (a flush from another thread "
              "followed by a finalize crashed a graphed loop). The buffer callback inside the flush only keeps "
              "cupti-python's record objects, which own copies of their records (scripts/h200_record_lifetime.py); "
              "the agent thread reads their fields and packs the columns, sleeping 1 ms after every 256 records.",
              "- Runtime-API records are filtered to launches, copies and syncs (3,286 instead of 49,902 records for "
              "two eager tokens), which cut the flush from ~170 ms to ~15 ms. SYNCHRONIZATION records are not "
              "traced: the monitor never read them, and they cost a traced eager token ~3.6 ms "
              "(scripts/h200_window_costs.py).",
              "- Runtime-API records (the launch calls) are traced in one window of every four, from an attach's "
              "second window on (`--api-every 4`); the others trace kernels, copies and memsets only. A kernels-only "
              "eager window's traced token was 2-16 ms cheaper (medians) in three interleaved A/B runs on the H200 "
              "(scripts/h200_variant_ab.py, twelfth session). The monitor counts such a window's launches from the "
              "kernels' correlation ids and takes the CPU lane and the host-late share from the last window that "
              "traced them. A 4 s attach's one window is a kernels-only one; the 20 s attach has one with launch "
              "calls.",
              "- Tried and dropped (twelfth session): leaving CUPTI initialised between eager kernels-only windows "
              "(no start-up per window) made untraced eager tokens ~10% slower (+10.5% at one core speed against "
              "+1.9% for the defaults, eight 4 s attaches each).",
              "- A guard token is traced after the analysed one and discarded only in processes that replay CUDA "
              "graphs (their last token's end times come back wrong); eager windows trace one token.",
              "- An engine that says it never replays CUDA graphs (`report_cuda_graphs(False)`, as the demo's eager "
              "mode does) has no guard token even in an attach's first window; one that says nothing keeps it there.",
              "- CUPTI's start-up (the first CUPTI call after a finalize) is made at the window's opening boundary, "
              "so it lands in the traced token, the window's slowest anyway. `--prepare-lead N` makes it on the "
              "agent thread N tokens earlier instead (eager windows only); the token it overlapped then ran ~9 ms "
              "slower: one more slow token per window (scripts/h200_window_costs.py, docs/benchmarks.md, tenth "
              "session). Eight 4 s attaches each way, interleaved on one engine, did not separate the two "
              "(scripts/h200_variant_ab.py, eleventh session).",
              "- Windows are at least 250 tokens and at most 5 s apart. An eager window makes two slow tokens on the "
              "inter-token clock: the traced one (CUPTI's start-up and its cost per launch) and the next (the closing "
              "flush and finalize, ~5 ms): ~1% of a 26 ms eager loop's tokens at one window per 5 s. The agent "
              "asks for the capped window a tick and a token ahead (agent.cap_lead_s, eighteenth session): "
              "windows came 5.25-5.33 s apart in runs 38-40, 5.00-5.05 s in run 41, at most 4.81 s in run 42 and "
              "4.80 s in runs 43-45.",
              "- The PM samples inside a window's tokens are all evaluated (beyond the pump's stride) and set beside "
              "the traced kernels over the same intervals: the accuracy table's first GPU-busy column.",
              "- PM sampling is armed, decoded and evaluated in the agent thread (a second process could not enable "
              "it on this H200), into a work buffer reset from one initialised counter-data image (both made when "
              "PM is armed, not in the first pump, which follows the first window), with the GIL "
              "released inside libcupti's decode and kept through its short per-sample calls (sixteenth session); "
              "NVML runs in a sidecar process, and all analysis runs in the monitor process. Since a5c6f4f (after "
              "run 42) a pump resets only the part of the image the last decode wrote (its header and samples, "
              "5.2-7.3 MiB of 14.3): 0.9-1.6 ms a pump instead of 2.1-2.8 (scripts/h200_pm_reset.py). In runs "
              "43-45 the agent's CPU a pump (eager, the last attach) was 1.65-1.71 ms, 1.05-1.38 of it resetting 7.0 MB, "
              "against 2.59-3.04 and 2.40-2.86 for 14.3 MB in run 42.",
              "- The monitor's own start, light (eighteenth session, monitor/_lean.py): where numpy's bytecode is "
              "neither cached nor cachable (the H200 image's read-only site-packages), it is kept under the user's "
              "cache, and numpy is imported with one BLAS thread. An `attach --json` took 2.2-2.3 s of CPU, 2.18 s "
              "of it in its first half second, 1.12 s compiling numpy (scripts/h200_monitor_cpu_live.py); the "
              "benchmark's monitor CPU fell from 221-230 to 41 ms a second in eager and from 501-513 to 98 in "
              "graph, and the machine's TLB shootdowns from 31-41 to 3.6 a second (eager) and 92-101 to 6.0 (graph).",
              "- An attach's start-up, trimmed (fourteenth session): a process starting on another CPU slowed the "
              "eager decode thread (scripts/h200_attached_cost.py --plan U,S,U,N,U,NS,U,NI: back-to-back starts "
              "+2.9% to +3.6% at one core speed), so the NVML sidecar started at every attach imports no numpy (its "
              "start to its first frame 0.13-0.19 s instead of 0.33-0.56 s); PM's hardware buffer is sized to the "
              "interval (64 MB at 2 ms: set_config 115-131 ms instead of ~220 at 256 MB) and each pump's "
              "counter-data image to two pump periods' samples (a full image drops the rest of the buffer, "
              "scripts/h200_pm_overflow.py); the device's facts are read at a process's first attach only.",
              "- The agent thread's wake-ups, cut (fifteenth session): each one takes the GIL back from the decode "
              "thread, which then waits (a voluntary switch: 0 a second unobserved). It woke every 50 ms and at "
              "every NVML frame; since run 33 it wakes at 0.25 s ticks (`--agent-tick`), reads the sidecar's frames "
              "there, and a closed window wakes it at once: the share of eager tokens with a switch fell from ~50% "
              "to ~13% (scripts/switches.py; A/B against 50 ms ticks: -0.01% against +2.39% at one core speed, "
              "twelve pairs). Since run 34 PM is pumped every 1 s, not 0.5 (`--pm-pump`), with one GIL hand-back "
              "fewer per evaluated sample; since run 35, one send per tick on a socket left non-blocking and at most 16 "
              "regular PM samples evaluated per pump (4 s attaches: 43.6 switches a second, 15.7% of tokens).",
              "- The agent's short calls keep the GIL (sixteenth session, runs 36-37, probes/held.py): a tick's read "
              "of the sidecar's pipe and its send, the stats tick's pread and a pump's per-sample libcupti calls "
              "(through cupti-python's own function pointers, as ctypes PYFUNCTYPE) no longer give the GIL up and "
              "take it back; the tick's only hand-back is its wake-up. A/B against `--release-gil` (ten pairs): "
              "27.7 against 43.8 switches a second, +1.85% against +1.90% at one core speed by the Python canary, "
              "+0.50% against +1.12% by the C canary.",
              "- One core speed by the C canary (sixteenth session, c_canary_view): the Python canary ran faster "
              "while attached (0.9% in run 37) and the C one did not, so by the fifteenth session's rule the C "
              "canary is the core's yardstick; both views are printed.", ""]
    return "\n".join(lines)


# the command every committed run since the seventh session used (older overhead.json files do not record theirs)
STANDARD_COMMAND = "python benchmarks/overhead.py --phase-s 4 --pairs 5 --long-s 20 --eager-pairs 9 --modes eager,graph"
MARK_START, MARK_END = "<!-- benchmarks/overhead.py writes from here -->", "<!-- benchmarks/overhead.py: end -->"


def write_doc(doc: Path, md_text: str) -> None:
    """Put the run's markdown between the markers of an existing doc (its headings one level down), keeping the
    write-ups around them; a doc without the markers is replaced whole."""
    text = doc.read_text() if doc.exists() else ""
    if MARK_START in text and MARK_END in text.split(MARK_START, 1)[1]:
        head, rest = text.split(MARK_START, 1)
        tail = rest.split(MARK_END, 1)[1]
        body = "\n".join("##" + ln if ln.startswith("#") else ln for ln in md_text.splitlines())
        doc.write_text(f"{head}{MARK_START}\n\n{body.strip()}\n\n{MARK_END}{tail}")
    else:
        doc.write_text(md_text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default="out")
    ap.add_argument("--phase-s", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--modes", default="graph,eager")
    ap.add_argument("--eager-pairs", type=int, default=None,
                    help="pairs in eager mode (default: --pairs); its loop is noisier than the graphed one")
    ap.add_argument("--eager-phase-s", type=float, default=None,
                    help="seconds per phase in eager mode (default: --phase-s): its core's speed wanders for "
                         "seconds at a time, and longer phases average that out")
    ap.add_argument("--long-s", type=float, default=20.0, help="one long attach at default settings: steady p99")
    ap.add_argument("--profiler-phase-s", type=float, default=3.0,
                    help="torch.profiler phases (its trace of an eager loop takes long to process)")
    ap.add_argument("--reread", metavar="OVERHEAD_JSON",
                    help="no run: read a committed overhead.json and print its loop-speed lines (speed_regimes)")
    ap.add_argument("--render", metavar="OVERHEAD_JSON",
                    help="no run: write a committed overhead.json's tables into docs/benchmarks.md again (with the "
                         "current design notes), under the command it records (or the standard one)")
    a = ap.parse_args()
    if a.render:
        try:
            run = json.loads(Path(a.render).read_text())
            results, env = run["results"], run["env"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"overhead.py: cannot read {a.render}: {exc}", file=sys.stderr)
            sys.exit(2)
        write_doc(Path("docs/benchmarks.md"), markdown(results, env, env.get("command", STANDARD_COMMAND)))
        return
    if a.reread:
        try:
            results = json.loads(Path(a.reread).read_text())["results"]
        except (OSError, ValueError, KeyError) as exc:
            print(f"overhead.py: cannot read {a.reread}: {exc}", file=sys.stderr)
            sys.exit(2)
        for r in results:
            print(speed_line(r["mode"], speed_regimes(decodemon_phases(r["phases"])))
                  or f"Loop speed, {r['mode']}: one speed throughout.")
        return
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="dm-bench-"))
    env = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "thp": thp_settings()}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True).stdout.strip().split(", ")
        env["gpu"], env["driver"] = q[0], q[1]
        import importlib.metadata as md

        import torch

        env["cupti"] = md.version("cupti-python")
        env["torch"] = torch.__version__
    except Exception as exc:
        env["error"] = str(exc)
    results = []
    for mode in a.modes.split(","):
        pairs = a.eager_pairs if (mode == "eager" and a.eager_pairs) else a.pairs
        phase_s = a.eager_phase_s if (mode == "eager" and a.eager_phase_s) else a.phase_s
        r = run_mode(mode, phase_s, pairs, work, a.profiler_phase_s, a.long_s)
        results.append(r)
        (out / "overhead.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
        times = out / "times"  # every token of the run, for re-reading later
        times.mkdir(exist_ok=True)
        for f in work.glob(f"times_{mode}_*.json"):
            shutil.copy(f, times / f.name)
        print(json.dumps({k: r[k] for k in ("mode", "D", "P", "Ddense", "U_first", "U_all", "D_all", "D_later", "Dlong",
                                            "accuracy")}),
              flush=True)
    cmd = "python benchmarks/overhead.py " + " ".join(sys.argv[2:])
    env["command"] = cmd.strip()
    (out / "overhead.json").write_text(json.dumps({"env": env, "results": results}, indent=1))
    md_text = markdown(results, env, cmd.strip())
    (out / "benchmarks.md").write_text(md_text)
    if os.environ.get("BENCH_CPU") == "1":  # a dry run's CPU figures never replace a GPU run's table in the docs
        print(f"(a CPU dry run: the table is in {out / 'benchmarks.md'}, docs/benchmarks.md is left as it was)",
              file=sys.stderr)
    else:
        Path("docs").mkdir(exist_ok=True)
        write_doc(Path("docs/benchmarks.md"), md_text)
    print(md_text)


if __name__ == "__main__":
    main()
