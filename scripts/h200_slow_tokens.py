"""Which part of an attach makes the slow tokens: PM pumps, traced windows, or the attach itself?

    bash scripts/h200.sh scripts/h200_slow_tokens.py OUTDIR [--attach-s 8] [--plan default|first|eager|pm|short|lead]

One demo engine per case decodes until stopped, logging every token's end time; the agent logs what its thread
does (DECODEMON_AGENT_EVENTS: PM pumps with their durations, window requests, collects). Phases on that engine:
U, D (defaults: the process's first attach), U, T (trace only: --no-pm), U, P (PM only: --no-trace), U,
D2 (defaults again), U. A token is slow when it exceeds
1.1x the p99 of the case's unobserved tokens; each slow token of an attached phase is put down to the agent
event that overlaps it or ends just before it (pump, window open = the token after a request, collect), or to
nothing. Cases: graph and eager. Writes OUTDIR/slow_tokens.json.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

PY = sys.executable
DM = [PY, "-m", "decodemon.monitor.cli"]


PLANS = {
    "default": (("U", None), ("D", []), ("U", None), ("T", ["--no-pm"]), ("U", None),
                ("P", ["--no-trace"]), ("U", None), ("D2", []), ("U", None)),
    # which part of a process's first attach makes its slow tokens: PM's first session, or CUPTI activity's
    "first": (("U", None), ("P", ["--no-trace"]), ("U", None), ("T", ["--no-pm"]), ("U", None)),
    # eager loop: what PM sampling's interval costs (decode time per pump, slow tokens), PM only and defaults
    "pm": (("U", None), ("P2", ["--no-trace"]), ("U", None), ("P10", ["--no-trace", "--pm-interval-us", "10000"]),
           ("U", None), ("P2b", ["--no-trace"]), ("U", None),
           ("P10b", ["--no-trace", "--pm-interval-us", "10000"]), ("U", None),
           ("D10", ["--pm-interval-us", "10000"]), ("U", None), ("D2", []), ("U", None)),
    # eager loop, default attaches only: where do a window's costs land once CUPTI starts in the agent thread
    "eager": (("U", None), ("D", []), ("U", None), ("D2", []), ("U", None), ("D3", []), ("U", None)),
    # short attaches as the benchmark makes them (use --attach-s 4), default first window (0.5 s in) against one
    # made 2 s in, well after PM's arm and first pump; both modes, each window's tokens kept
    # eager, default attaches (CUPTI's start-up at the opening boundary) against --prepare-lead 3 (made on the agent
    # thread 3 tokens before), each window's tokens kept (use --attach-s 4)
    "lead": (("U", None), ("D", []), ("U", None), ("L", ["--prepare-lead", "3"]), ("U", None), ("D2", []),
             ("U", None), ("L2", ["--prepare-lead", "3"]), ("U", None), ("D3", []), ("U", None),
             ("L3", ["--prepare-lead", "3"]), ("U", None)),
    "short": (("U", None), ("D", []), ("U", None), ("F", ["--first-window", "2"]), ("U", None), ("D2", []),
              ("U", None), ("F2", ["--first-window", "2"]), ("U", None), ("D3", []), ("U", None),
              ("F3", ["--first-window", "2"]), ("U", None)),
}


def run_case(name, mode, env_extra, work: Path, attach_s: float, cpu: bool, plan: str = "default") -> dict:
    from decodemon.monitor.demo import spawn_engine

    times_file = work / f"times_{name}.json"
    env = dict(os.environ, DECODEMON_AGENT_EVENTS=str(work / f"events_{name}"), **env_extra)
    dev = ["--tiny", "--device", "cpu"] if cpu else []
    eng, pid = spawn_engine(dev + ["--mode", "eager" if cpu else mode, "--tokens", "0", "--cpu-clocks",
                                   "--times-file", str(times_file)], env=env)
    time.sleep(2)
    phases = []
    attach_out: dict = {}
    for label, extra in PLANS[plan]:
        a = time.time()
        if extra is None:
            time.sleep(attach_s / 2)
        else:
            r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", str(attach_s)] + extra,
                               capture_output=True, text=True)
            if r.returncode != 0:
                phases.append((label, a, time.time(), r.stderr.strip()[-300:]))
                continue
            try:
                d = json.loads(r.stdout)
                attach_out[label] = {k: d.get(k) for k in ("pm_gpu_busy_pct", "traced_gpu_busy_pct",
                                                            "kernel_share_of_step_pct", "windows", "launches_per_token",
                                                            "pm_vs_window", "observer_cost", "ms_per_token")}
                attach_out[label]["pm_stride"] = (d.get("probe") or {}).get("pm_stride")
                attach_out[label]["pm"] = (d.get("probe") or {}).get("pm")
                attach_out[label]["errors"] = (d.get("probe") or {}).get("errors")
            except (ValueError, AttributeError):
                pass
        phases.append((label, a, time.time(), ""))
    eng.send_signal(signal.SIGTERM)
    eng.wait(timeout=60)
    tt = json.loads(times_file.read_text())
    end = np.array(tt["end_unix_s"])
    ms = np.array(tt["ms"])
    events = []
    for f in sorted(glob.glob(str(work / f"events_{name}.*.json"))):
        events += json.loads(Path(f).read_text())
    ev_t = np.array([e[0] / 1e9 for e in events]) if events else np.zeros(0)
    u = np.concatenate([ms[(end > a + 0.3) & (end < b)] for lab, a, b, _ in phases if lab == "U"])
    thr = 1.1 * float(np.percentile(u, 99))
    res = {"mode": mode, "env": env_extra, "unobserved_tokens": int(len(u)),
           "unobserved_median_ms": float(np.median(u)), "unobserved_p99_ms": float(np.percentile(u, 99)),
           "slow_threshold_ms": thr, "phases": [], "attach": attach_out}
    for lab, a, b, err in phases:
        if lab == "U":
            continue
        m = (end >= a) & (end <= b)
        causes = {"window": 0, "arm": 0, "pump": 0, "collect": 0, "send": 0, "none": 0}
        arms = [((e[0] - e[2]) / 1e9, e[0] / 1e9) for e in events if e[1] == "arm"]  # PM (re-)arms: start, end
        # a window opens at the first boundary after its request: that token carries CUPTI's start-up, the
        # next ones are traced, the guard, and the close (flush + finalize): five tokens from the request on
        req = [e[0] / 1e9 for e in events if e[1] == "want_window"]
        win_tok = set()
        for r in req:
            i0 = int(np.searchsorted(end, r))
            win_tok.update(range(i0, i0 + 5))
        for e in events:  # CUPTI started in the agent thread (tracer.prepare) just before a request
            if e[1] == "prepare":
                win_tok.add(int(np.searchsorted(end, (e[0] - e[2]) / 1e9)))
        idx = np.flatnonzero(m)
        slow_ms = []
        for i in idx[ms[idx] > thr]:
            t_end, d = end[i], ms[i]
            t_start = t_end - d / 1e3
            near = [events[j] for j in np.flatnonzero((ev_t >= t_start - 0.001) & (ev_t <= t_end))] if len(ev_t) else []
            kinds = {e[1] for e in near}
            if int(i) in win_tok:
                causes["window"] += 1
            elif any(a0 <= t_end and a1 >= t_start for a0, a1 in arms):
                causes["arm"] += 1
            elif "pump" in kinds:
                causes["pump"] += 1
            elif "collect" in kinds:
                causes["collect"] += 1
            elif "send" in kinds:
                causes["send"] += 1
            else:
                causes["none"] += 1
            slow_ms.append(round(float(d), 3))
        slow = ms[m] > thr
        pm_ = ms[m]
        pumps = [e for e in events if e[1] == "pump" and a <= e[0] / 1e9 <= b]
        res["phases"].append({
            "phase": lab, "error": err, "tokens": int(m.sum()),
            "median_ms": float(np.median(pm_)) if len(pm_) else None,
            "p99_ms": float(np.percentile(pm_, 99)) if len(pm_) else None,
            "p99_ratio": float(np.percentile(pm_, 99)) / res["unobserved_p99_ms"] if len(pm_) else None,
            "slow_tokens": int(slow.sum()), "slow_causes": causes, "slow_ms": sorted(slow_ms)[-40:],
            "pumps": len(pumps),
            "pump_ms_median": float(np.median([p[2] for p in pumps]) / 1e6) if pumps else None,
            "pump_ms_max": float(max(p[2] for p in pumps) / 1e6) if pumps else None,
            "pump_decode_ms_median": float(np.median([p[3] for p in pumps]) / 1e6) if pumps else None,
            "pump_image_ms_median": float(np.median([p[5] for p in pumps if len(p) > 5]) / 1e6)
            if any(len(p) > 5 for p in pumps) else None,
            "pump_stride_median": float(np.median([p[4] for p in pumps])) if pumps else None,
            "pump_cpu_outside_libcupti_ms_median": float(np.median([p[6] for p in pumps if len(p) > 6]) / 1e6)
            if any(len(p) > 6 for p in pumps) else None,
            "pump_cpu_outside_libcupti_ms_per_s": (float(sum(p[6] for p in pumps if len(p) > 6)) / 1e6 / (b - a)) if pumps else None,
            "arms_ms": [[round(e[2] / 1e6, 2), round(e[3] / 1e6, 2)] for e in events
                        if e[1] == "arm" and a <= e[0] / 1e9 <= b],  # [wall, CPU] per PM (re-)arm
            "windows_requested": sum(1 for e in events if e[1] == "want_window" and a <= e[0] / 1e9 <= b),
            "collect_ms": [round(e[2] / 1e6, 2) for e in events if e[1] == "collect" and a <= e[0] / 1e9 <= b],
            # per window: [open, flush, finalize] ms on the decode thread
            "window_steps_ms": [[round(v / 1e6, 2) for v in e[4:7]] for e in events
                                if e[1] == "collect" and len(e) >= 7 and a <= e[0] / 1e9 <= b],
            "prepare_ms": [round(e[2] / 1e6, 2) for e in events if e[1] == "prepare" and a <= e[0] / 1e9 <= b],
            # each window's tokens on the inter-token clock, from 6 before the one its request lands in to 8 after,
            # over the unobserved median; with the seconds from the attach's start to the request
            "around_windows": [{"t_s": round(r - a, 3),
                                "ms_over_median": [round(float(x) - res["unobserved_median_ms"], 2)
                                                   for x in ms[max(0, int(np.searchsorted(end, r)) - 6):
                                                               int(np.searchsorted(end, r)) + 9]]}
                               for r in [e[0] / 1e9 for e in events if e[1] == "want_window"] if a <= r <= b],
            # the slowest three tokens, seconds after the attach started
            "slowest_at_s": [[round(float(end[i] - a), 3), round(float(ms[i]), 2)]
                             for i in idx[np.argsort(ms[idx])[-3:]]] if len(idx) else [],
        })
    return res


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "out")
    out.mkdir(parents=True, exist_ok=True)
    attach_s = float(sys.argv[sys.argv.index("--attach-s") + 1]) if "--attach-s" in sys.argv else 8.0
    cpu = os.environ.get("BENCH_CPU") == "1"
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip().split(", ") if not cpu else ["cpu", "-"]
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": q[0], "driver": q[-1],
           "command": f"bash scripts/h200.sh scripts/h200_slow_tokens.py OUT --attach-s {attach_s:g}", "cases": {}}
    work = out / "work"
    work.mkdir(exist_ok=True)
    plan = sys.argv[sys.argv.index("--plan") + 1] if "--plan" in sys.argv else "default"
    cases = {"default": [("graph", "graph", {}), ("eager", "eager", {})], "first": [("graph_first", "graph", {})],
             "eager": [("eager", "eager", {})], "pm": [("eager", "eager", {})],
             "short": [("eager", "eager", {}), ("graph", "graph", {})], "lead": [("eager", "eager", {})]}[plan]
    res["plan"] = plan
    res["command"] += f" --plan {plan}"
    for name, mode, env in cases:
        try:
            res["cases"][name] = run_case(name, mode, env, work, attach_s, cpu, plan)
        except Exception as exc:
            res["cases"][name] = {"error": f"{type(exc).__name__}: {exc}"[-1500:]}
        (out / "slow_tokens.json").write_text(json.dumps(res, indent=1))
        c = res["cases"][name]
        print(name, json.dumps([{k: p.get(k) for k in ("phase", "median_ms", "p99_ratio", "slow_tokens",
                                                        "slow_causes", "pump_ms_median", "pump_decode_ms_median", "pump_image_ms_median",
                                                        "pump_cpu_outside_libcupti_ms_per_s", "arms_ms", "window_steps_ms")}
                                for p in c.get("phases", [])]) if "phases" in c else c, flush=True)


if __name__ == "__main__":
    main()
