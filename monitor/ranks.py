"""Tensor-parallel ranks: find every rank from any one pid, watch them together, and read Amdahl off two runs.

Pure where it can be: `combine` takes per-rank snapshots and returns the group's figures.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from decodemon.monitor.sources import agent_socket
from decodemon.monitor.diagnosis import diagnose, serial_fraction
from decodemon.monitor.render.json import collectives_json


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isascii() and d.isdigit() and _ppid(int(d)) == pid:
            out.append(int(d))
    return sorted(out)


# torch.distributed's env:// rendezvous: what a launcher (torchrun) or a rank 0 gives the ranks it starts
RANK_ENV = (b"WORLD_SIZE=", b"RANK=", b"LOCAL_RANK=", b"MASTER_PORT=")


def is_rank(pid: int) -> bool:
    """Is `pid` a rank of a group: started with torch.distributed's rendezvous in its environment (torchrun, a
    rank 0 that starts the others), or driving a GPU itself (libcuda loaded: ranks that set their rendezvous in
    code, or join by tcp://, as torch.multiprocessing.spawn workers and vLLM's do)? The other children of an
    engine that inherit the agent (data loaders, tokenizer workers) are neither, and watched as ranks they would
    arm PM on the GPU against the engine itself."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    if any(e.startswith(RANK_ENV) for e in env):
        return True
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            return any(b"/libcuda.so" in line for line in f)
    except OSError:
        return False


def discover_ranks(pid: int) -> list[int]:
    """The pids of every rank with an agent, rank 0 first, given any rank's pid or the launcher's.

    The demo engine's rank 0 starts ranks 1..N-1 as its children; a launcher (torchrun, `decodemon run`)
    starts all of them. Either way the group is a process and those of its children that have agent sockets
    and were started as ranks (is_rank).
    """
    def agents(pids):
        return [p for p in pids if agent_socket.find(p) is not None and is_rank(p)]

    for root in (pid, _ppid(pid)):
        kids = agents(_children(root)) if root else []
        if root and agent_socket.find(root) is not None and kids:
            return [root] + kids  # a rank 0 with its ranks
        if len(kids) > 1 and (root == pid or pid in kids):
            return kids  # a launcher's ranks
    return [pid]


def not_one_group(snaps: list, names: list) -> str | None:
    """Why these recordings are not ranks of one tensor-parallel group (each says it is a rank of a group of the
    same degree, no rank twice), or None when they are."""
    def who(s):
        m = s.model
        return f"{m.name} tp {m.tp_degree} rank {m.tp_rank}" if m is not None else "no model facts"

    degrees = {s.model.tp_degree if s.model is not None else 1 for s in snaps}
    ranks = [s.model.tp_rank if s.model is not None else 0 for s in snaps]
    models = {(s.model.name, s.model.layers, s.model.hidden) if s.model is not None else None for s in snaps}
    if len(degrees) == 1 and min(degrees) >= len(snaps) and min(degrees) > 1 and len(set(ranks)) == len(ranks) \
            and len(models) == 1:
        return None
    return (f"{' and '.join(map(str, names))} are not ranks of one tensor-parallel group "
            f"({', '.join(who(s) for s in snaps)}); to set runs side by side use `decodemon compare`")


def combine(snaps: list) -> dict:
    """The group's view: per-rank busy and launches, the slowest rank, the rank the others wait for in the
    collectives (last to arrive), and the collectives."""
    rows = []
    snaps_by_rank = sorted(snaps, key=lambda s: (s.model is None, s.model.tp_rank if s.model else 0))
    for s in snaps_by_rank:
        w = s.window
        rows.append({"pid": s.pid, "tp_rank": s.model.tp_rank if s.model else None,
                     "ms_per_token": round(s.tokens.ms_per_token, 4) if s.tokens else None,
                     "gpu_busy_pct": round(s.gpu_busy_pct, 1) if s.gpu_busy_pct is not None else None,
                     "kernels_per_token": round(w.kernels_per_token, 1) if w else None,
                     "verdict": s.diagnosis.ceiling, "collectives": collectives_json(s)})
    timed = [r for r in rows if r["ms_per_token"] is not None]
    slowest = max(timed, key=lambda r: r["ms_per_token"]) if timed else None
    # ranks in lockstep share one ms/token; who holds the group back shows in the collectives instead. A rank's
    # NCCL kernel runs from its own arrival to the last rank's, so the rank with the shortest kernels arrives
    # last: the others wait for it, and its call is the collective's own latency.
    kern = [(r["collectives"]["kernel_us_per_call"], r) for r in rows
            if (r["collectives"] or {}).get("kernel_us_per_call")]
    last = min(kern, key=lambda x: x[0]) if len(kern) > 1 else None
    if last:
        link_us = last[1]["collectives"]["us_per_call"]
        for us, r in kern:
            r["collectives"]["waits_for_peers_us_per_call"] = round(us - last[0], 2)
        for s, r in zip(snaps_by_rank, rows):
            # each rank's verdict with the collectives priced at the link's latency (the last rank's call)
            if s.inputs is not None and s.inputs.us_per_collective is not None and s.inputs.collectives_per_token:
                d = diagnose(replace(s.inputs, us_per_collective=min(link_us, s.inputs.us_per_collective)))
                r["verdict_alone"], r["verdict"] = r["verdict"], d.ceiling
    # ranks of one run are watched over the same seconds; spans that end further apart than a span are two runs
    ends = [s.span_end_unix_s for s in snaps_by_rank if s.span_end_unix_s is not None]
    span = max((s.span_s or 0.0) for s in snaps_by_rank) if snaps_by_rank else 0.0
    apart = (max(ends) - min(ends)) if len(ends) > 1 else 0.0
    not_one_run = (f"the ranks' spans end {apart:.0f} s apart: not one run's ranks, so the group's comparisons "
                   "between them (slowest rank, who waits) are not a straggler's") if apart > max(span, 1.0) else None
    return {"tp": len(rows), "ranks": rows, "slowest_rank": slowest["tp_rank"] if slowest else None,
            "not_one_run": not_one_run,
            # two waits, read off the same NCCL kernels: the steady one each call, and the long ones of a token
            "waits_note": ("waits_for_peers_us_per_call: how much longer a rank's typical call (its kernel when not "
                           "waiting) runs than the last-to-arrive rank's, every call; wait_ms_per_token: a token's "
                           "calls beyond their typical length, the long waits for a late peer (ranks traced in the "
                           "same tokens make them by turns)") if last else None,
            "last_to_arrive_rank": last[1]["tp_rank"] if last else None,
            "collective_us_per_call": last[1]["collectives"]["us_per_call"] if last else None,
            "slowest_ms_per_token": slowest["ms_per_token"] if slowest else None,
            "rank_spread_pct": (round(100 * (max(r["ms_per_token"] for r in timed) /
                                             min(r["ms_per_token"] for r in timed) - 1), 2) if len(timed) > 1 else 0.0)}


def serial_fraction_of_runs(ms_one: float, n_one: int, ms_n: float, n: int) -> float:
    """Amdahl from two runs of the same model: s from the speedup of N ranks over N1 (normally 1)."""
    if n <= n_one:
        raise ValueError("the second run needs more ranks than the first")
    return serial_fraction(ms_one / ms_n, round(n / n_one))

