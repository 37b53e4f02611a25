"""The machine around the loop, per phase: CPU steal and busy, the kernel's memory work, interrupts between CPUs,
and the engine's and the monitors' own CPU.

An eager decode loop is bound by one host thread, so another process's work, the kernel moving memory or a
hypervisor taking CPUs away can slow it with no help from decodemon. These say whether a phase ran on a noisy
machine, and whose work it was.
"""

from __future__ import annotations

import os
import statistics

VM_KEYS = ("compact_stall", "compact_migrate_scanned", "pgmigrate_success", "thp_fault_alloc",
           "thp_collapse_alloc", "numa_pages_migrated", "pgfault", "pgmajfault")
IRQ_KEYS = ("irq_TLB", "irq_CAL", "irq_RES")  # /proc/interrupts: TLB shootdowns, function-call IPIs, reschedules
# the engine's minor faults and CPU (all its threads), and the CPU of the monitor processes a phase waited for
PROC_KEYS = ("engine_minflt", "engine_cpu_ms", "monitor_cpu_ms")


def host_ticks() -> list[int] | None:
    """The machine's CPU time so far (/proc/stat, all CPUs): user, nice, system, idle, iowait, irq, softirq, steal."""
    try:
        with open("/proc/stat") as fh:
            return [int(x) for x in fh.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def host_share(before: list[int] | None, after: list[int] | None) -> dict:
    """Steal and busy % of all CPUs between two host_ticks() readings (steal: time the hypervisor gave this VM's
    CPUs to someone else)."""
    if not before or not after:
        return {}
    d = [b - a for a, b in zip(before, after)]
    total = sum(d)
    if total <= 0:
        return {}
    return {"host_steal_pct": round(100 * d[7] / total, 2), "host_busy_pct": round(100 * (total - d[3] - d[4]) / total, 2)}


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


def proc_counters(pid: int | None) -> dict[str, float]:
    """So far: the engine's minor faults and CPU ms (/proc/PID/stat), and the CPU ms of this process's waited-for
    children (the monitor processes of finished attaches; RUSAGE_CHILDREN). What cannot be read is left out."""
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
    over the CPUs of the header): TLB shootdowns, function-call and reschedule IPIs, as {"irq_TLB": n, ...}."""
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
    """The kernel's memory-management counters so far (whole machine) that can stall another process's thread:
    compaction, page migration, transparent huge pages, NUMA balancing, faults; with `irq_path`, irq_counters()
    too. A key the kernel lacks is left out."""
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
    """Per second between two counter readings, as {"vm_per_s": {key: rate}} ({} without both)."""
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
