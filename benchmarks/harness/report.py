"""A run's results as markdown: the pairs, the limits, every token pooled, accuracy, and the diagnostics.

The run prints this and writes it to OUTDIR/benchmarks.md; docs/benchmarks.md is written by hand from it.
"""

from __future__ import annotations

from .judge import CANARY_WINDOW, START_S, window_busy
from .limits import fmt, limit_lines

NAMES = {"D": "decodemon, defaults", "P": "torch.profiler (CPU+CUDA)", "Ddense": "decodemon, dense (2 tokens every 1 s)",
         "S": "decodemon, the live screen"}
LABELS = {"U": "unobserved", "D": "default attaches", "Dlong": "the long attach"}
METHOD = (
    "Interleaved phases on one running demo engine per mode (Qwen3-0.6B shape, bf16, batch 1, `.item()` every "
    "token). Every phase's ms/token is the engine's own clock: inter-token latency, from one token's arrival on "
    "the host to the next's. Overhead = observed phase median ÷ the mean of the unobserved phases on both sides "
    "of it (p99 likewise); spread = min..max over the pairs; 'after the first' leaves out the process's first "
    "attach; the noise floor is the same arithmetic on an unobserved phase between two others. torch.profiler "
    "runs in a second engine process of the same mode and seed: the two bring different libcupti builds, and "
    "kineto leaves CUPTI attached after its phase.")


def p99_noise(v: dict) -> str:
    """' (noise ±N%)' after a p99 ratio: the same ratio taken for an unobserved phase between two others."""
    n = v.get("p99_noise_floor_bracketed_pct")
    return "" if n is None else f" (noise ±{n:.1f}%)"


def _pair_row(mode: str, name: str, v: dict) -> str:
    return (f"| {mode} | {name} | {v['pairs']} | {fmt(v['median_ms'])} | {fmt(v['overhead_pct_median'], '+.2f', '%')} | "
            f"{fmt(v['overhead_pct_min'], '+.2f', '%')}..{fmt(v['overhead_pct_max'], '+.2f', '%')} | "
            f"{fmt(v.get('overhead_pct_median_after_first'), '+.2f', '%')} | "
            f"{fmt(v.get('noise_floor_bracketed_pct'), '.2f', '%', '±')} (after/before {fmt(v.get('noise_floor_pct'), '.2f', '%', '±')}) | "
            f"{fmt(v['p99_ratio_median'], '.3f')}{p99_noise(v)} | {fmt(v.get('p99_ratio_median_after_first'), '.3f')} |")


def pairs_table(results: list[dict]) -> list[str]:
    """The main table: each observer's pairs against the unobserved phases, per mode."""
    lines = ["| mode | observer | pairs | median ms/token | overhead (median) | spread | overhead, pairs after the "
             "first | noise floor (unobserved between unobserved) | p99 ratio (median) | p99 ratio, pairs after the "
             "first |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['mode']} | unobserved | — | {fmt(r['U_all']['median_ms'])} | — | — | — | — | — | — |")
        lines += [_pair_row(r["mode"], NAMES[k], r[k]) for k in ("D", "P", "Ddense", "S") if r.get(k, {}).get("pairs")]
    return lines


def _ratio(a, b):
    return a / b if a is not None and b and a == a else None


def pooled_table(results: list[dict]) -> list[str]:
    """Every token of each kind in the decodemon engine, the phase before any attach apart."""
    lines = ["", "All decodemon phases against all unobserved phases after the first attach (p99 over every token "
             "of each kind):", "",
             "| mode | before any attach median / p99 | unobserved median / p99 | all short attaches median / p99 "
             "(ratio) | short attaches after the first (ratio) | one long attach (ratio) | tokens of the long attach "
             "over 1.1× unobserved p99 |", "|---|---|---|---|---|---|---|"]
    for r in results:
        u, f0, dl = r["U_all"], r["U_first"], r["Dlong"]
        cells = [f"{fmt(f0['median_ms'])} / {fmt(f0['p99_ms'])}", f"{fmt(u['median_ms'])} / {fmt(u['p99_ms'])}"]
        for k in ("D_all", "D_later", "Dlong"):
            v = r[k]
            cells.append(f"{fmt(v['median_ms'])} / {fmt(v['p99_ms'])} ({fmt(_ratio(v['p99_ms'], u['p99_ms']))})")
        cells.append(f"{dl['slow_tokens_over_1.1x_u_p99']} of {dl['tokens']} ({dl['seconds']:g} s)")
        lines.append(f"| {r['mode']} | " + " | ".join(cells) + " |")
    return lines


def accuracy_table(results: list[dict]) -> list[str]:
    """decodemon against torch.profiler, and PM against the traced kernels."""
    lines = ["", "## Accuracy, same run", "",
             "| mode | kernels/token decodemon vs torch.profiler | kernel ms/token decodemon vs torch.profiler | "
             "GPU busy over the traced tokens, same PM samples: PM vs traced kernel union | GPU busy: PM (whole "
             "attach) vs traced kernels ÷ untraced step |", "|---|---|---|---|---|"]
    for r in results:
        a = r["accuracy"]
        kd, kp = a["decodemon_kernel_ms_per_token"], a["profiler_kernel_ms_per_token"]
        diff = f" ({100 * (kd / kp - 1):+.1f}%)" if kd and kp else ""
        c = a.get("pm_vs_window")
        same = (f"{c['pm_gpu_busy_pct']:.1f}% vs {window_busy(c):.1f}% "
                f"({c['pm_gpu_busy_pct'] - window_busy(c):+.1f} points; {c['samples']} samples of "
                f"{c['attaches']} attaches, widest attach {c['max_attach_gap_points']:g})" if c else "n/a")
        lines.append(f"| {r['mode']} | {fmt(a['decodemon_kernels_per_token'], '.1f')} vs "
                     f"{fmt(a['profiler_kernels_per_token'], '.1f')} | {fmt(kd)} vs {fmt(kp)}{diff} | {same} | "
                     f"{fmt(a['pm_gpu_busy_pct'], '.1f', '%')} vs {fmt(a.get('kernel_share_of_step_pct'), '.1f', '%')} |")
    return lines


def observer_words(o: dict | None) -> str:
    """The monitor's own bill for an attach (its `observer_cost`), in words."""
    if not o or o.get("probe_ms_per_window") is None:
        return "n/a"
    s = f"{o['probe_ms_per_window']:.1f} ms probe + {o.get('tracing_ms_per_window') or 0:.1f} ms tracing per window"
    if o.get("share_of_loop_pct") is not None:
        s += f", one per {o['window_every_s']:.1f} s = {o['share_of_loop_pct']:.1f}% of the loop"
    if o.get("decode_waits_per_s") is not None:
        s += f"; the decode thread waited {o['decode_waits_per_s']:.0f}×/s"
    if o.get("agent_cpu_ms_per_s") is not None:
        s += f"; the agent thread used {o['agent_cpu_ms_per_s']:.0f} ms of CPU a second"
    return s


def pump_words(probe: dict) -> str:
    """What a PM pump cost the agent thread in the last attach, from the probe's status."""
    if probe.get("pm_cpu_ms_per_pump") is not None:
        return (f"{probe['pm_cpu_ms_per_pump']:.2f} ms of agent CPU per pump outside GIL-free libcupti calls, "
                f"{fmt(probe.get('pm_image_reset_ms_per_pump'), '.2f')} of it resetting "
                f"{(probe.get('pm_image_reset_bytes') or 0) / 2**20:.1f} MB of the counter-data image "
                f"({probe.get('pm_pumps', 0)} pumps)")
    return str(probe.get("pm_cpu") or "n/a")


def run_lines(r: dict) -> list[str]:
    """One mode's diagnostics, one line each: PM pumps, the mean token, the machine, the decode thread's waits,
    the garbage collector, speeds, start-up."""
    m, acc = r["mode"], r.get("accuracy") or {}
    attaches = [a for a in r.get("attach", []) if "error" not in a and a.get("label") in ("D", "Dlong")]
    last = attaches[-1] if attaches else {}
    out = [f"PM pumps, {m} (the last attach): {pump_words(last.get('probe') or {})}.",
           f"Mean token, {m}: decodemon defaults {fmt(r['D'].get('overhead_mean_pct_median'), '+.2f', '%')} (median of "
           f"pairs); the monitor's own bill in the last attach: {observer_words(last.get('observer_cost'))}."]
    h = r.get("host") or {}
    if h:
        out.append(f"The machine in {m}'s unobserved phases: steal {h['u_steal_pct'][0]:g}–{h['u_steal_pct'][1]:g}% "
                   f"and busy {h['u_busy_pct'][0]:g}–{h['u_busy_pct'][1]:g}% of all CPUs.")
    if r.get("vm"):
        out.append(f"Counters a second in {m}'s phases (whole machine; engine_* the engine's own, monitor_cpu_ms the "
                   "monitor processes'; median, unobserved vs default attaches): "
                   + ", ".join(f"{k} {fmt(u, 'g')} vs {fmt(d, 'g')}" for k, (u, d) in r["vm"].items()) + ".")
    sp = r.get("speeds") or {}
    if sp and (sp["u_slow"][0] or sp["observed_slow"][0]):
        out.append(f"Loop speed, {m}: {sp['u_slow'][0]} of {sp['u_slow'][1]} unobserved and {sp['observed_slow'][0]} "
                   f"of {sp['observed_slow'][1]} decodemon phases ran over {sp['threshold_ms']:.1f} ms/token (1.25× "
                   "the fastest unobserved phase): a pair across two speeds resolves nothing; the pairs at the fast "
                   f"speed alone: {fmt(sp.get('one_speed_overhead_pct_median'), '+.2f', '%')}.")
    st = r.get("D_after_start") or {}
    if st:
        out.append(f"Each default attach with its first {START_S:g} s left out, {m}: median "
                   f"{fmt(st.get('overhead_pct_median'), '+.2f', '%')} (after the first "
                   f"{fmt(st.get('overhead_pct_median_after_first'), '+.2f', '%')}).")
    bins = (r.get("start_profile") or {}).get("bins")
    if bins:
        w = r["start_profile"]["bin_s"]
        out.append(f"Where in a default attach the tokens were slow, {m} (median token over its attach's unobserved "
                   "neighbours, by time since the monitor started): "
                   + ", ".join(f"{b['from_s']:g}-{b['from_s'] + w:g} s {b['raw_pct']:+.2f}%" for b in bins) + ".")
    out += [x for x in (switch_line(r), gc_line(r)) if x]
    ic = r.get("iteration_clock") or {}
    if ic:
        out.append(f"On the iteration clock (stamped after the token clock's hook), {m}: p99 ratio per pair "
                   f"{fmt(ic.get('p99_ratio_median'))}, long attach {fmt(ic.get('long_p99_ratio'))}, median "
                   f"overhead {fmt(ic.get('overhead_pct_median'), '+.2f', '%')}.")
    return out


def switch_line(r: dict) -> str | None:
    """The decode thread's voluntary context switches per label, in words."""
    sw = r.get("switches") or {}
    parts = [f"{LABELS.get(k, k)} {v['per_s']:g}/s, {100 * v['share_with']:.1f}% of tokens"
             + (f" (median {fmt(v['median_ms_without'], '.2f')} ms without, {fmt(v['median_ms_with'], '.2f')} with)"
                if v["share_with"] else "")
             for k, v in sw.items()]
    if not parts:
        return None
    q = r.get("quiet") or {}
    tail = (f" Default attaches' median overhead over all tokens / over the tokens without a switch: raw "
            f"{fmt(q.get('raw_all_pct'), '+.2f', '%')} / {fmt(q.get('raw_quiet_pct'), '+.2f', '%')}, at one core speed "
            f"{fmt(q.get('core_all_pct'), '+.2f', '%')} / {fmt(q.get('core_quiet_pct'), '+.2f', '%')}." if q else "")
    return (f"The decode thread's waits (voluntary context switches), {r['mode']}, after the first attach: "
            + "; ".join(parts) + "." + tail)


def gc_line(r: dict) -> str | None:
    """The garbage collector's time per label, in words."""
    g = r.get("gc") or {}
    parts = [f"{LABELS.get(k, k)} {v['collections_per_s']:g} collections and {v['ms_per_s']:g} ms a second on the "
             f"decode thread ({100 * v['share_with']:.2f}% of tokens), {v['other_threads_ms_per_s']:g} ms a second "
             "on other threads" for k, v in g.items()]
    return f"The garbage collector, {r['mode']}, after the first attach: " + "; ".join(parts) + "." if parts else None


def core_table(results: list[dict]) -> list[str]:
    """The eager pairs again at one core speed: the same arithmetic on canary-scaled token times."""
    rows = [r for r in results if r.get("core")]
    if not rows:
        return []
    lines = ["", "## The same pairs at one core speed", "",
             "An eager loop is bound by its host thread, whose core can run slower for seconds at a time, attached "
             "or not. Each token's time is scaled by the unobserved tokens' canary median ÷ the canary's rolling "
             f"median over {CANARY_WINDOW} tokens (a fixed piece of work timed on the decode thread every token). "
             "Work decodemon adds on the decode thread is not in the canary and stays in.", "",
             "| mode | observer | pairs | overhead (median) | spread | after the first | noise floor | p99 ratio | "
             "canary µs, unobserved vs decodemon | tokens on a slow core, unobserved vs decodemon |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        c = r["core"]
        cu, cd = (c.get("canary") or {}).get("U") or {}, (c.get("canary") or {}).get("D") or {}
        for k in ("D", "P", "Ddense", "S"):
            v = c.get(k)
            if not v or not v.get("pairs"):
                continue
            can = (f"{fmt(cu.get('median_us'), '.1f')} vs {fmt(cd.get('median_us'), '.1f')} | "
                   f"{fmt(_share(cu), '.1f', '%')} vs {fmt(_share(cd), '.1f', '%')}" if k == "D" else "— | —")
            lines.append(f"| {r['mode']} | {NAMES[k]} | {v['pairs']} | {fmt(v['overhead_pct_median'], '+.2f', '%')} | "
                         f"{fmt(v['overhead_pct_min'], '+.2f', '%')}..{fmt(v['overhead_pct_max'], '+.2f', '%')} | "
                         f"{fmt(v.get('overhead_pct_median_after_first'), '+.2f', '%')} | "
                         f"{fmt(v.get('noise_floor_bracketed_pct'), '.2f', '%', '±')} | "
                         f"{fmt(v['p99_ratio_median'], '.3f')}{p99_noise(v)} | {can} |")
    lines.append("")
    for r in rows:
        lines.append(f"Long attach at one core speed, {r['mode']}: p99 ratio {fmt(r['core'].get('long_p99_ratio'))}.")
        lines += [x for x in (c_canary_line(r),) if x]
    return lines


def _share(c: dict):
    return 100 * c["slow_core_share"] if c.get("slow_core_share") is not None else None


def c_canary_line(r: dict) -> str | None:
    """The default attaches at one core speed by the C canary, with both canaries' medians."""
    v = r.get("core_c") or {}
    d = v.get("D")
    cn = (r.get("core") or {}).get("canary") or {}
    if not d:
        return None
    u, a = cn.get("U") or {}, cn.get("D") or {}
    return (f"By the C canary (zlib.crc32 of 4 KB, 16 times; unobserved vs attached "
            f"{fmt(u.get('c_median_us'), '.2f')} vs {fmt(a.get('c_median_us'), '.2f')} µs, the Python canary "
            f"{fmt(u.get('median_us'), '.1f')} vs {fmt(a.get('median_us'), '.1f')} µs), {r['mode']}: decodemon "
            f"defaults median {fmt(d['overhead_pct_median'], '+.2f', '%')} (noise floor "
            f"{fmt(d['noise_floor_bracketed_pct'], '.2f', '%', '±')}, after the first {fmt(d['overhead_pct_median_after_first'], '+.2f', '%')}, "
            f"first {START_S:g} s of each attach left out {fmt(v.get('D_after_start_pct'), '+.2f', '%')}); p99 ratio per "
            f"pair {fmt(d['p99_ratio_median'])}, pooled after the first {fmt(v.get('pooled_p99_ratio'))}, over the "
            f"long attach {fmt(v.get('long_p99_ratio'))}.")


def markdown(results: list[dict], env: dict, cmd: str) -> str:
    """The whole run as markdown, headed by the device, the versions, the date, the commit and the command."""
    lines = ["# What watching costs", "",
             f"Device: {env.get('gpu')} · driver {env.get('driver')} · cupti-python {env.get('cupti')} · "
             f"torch {env.get('torch')} · date {env.get('date')} · commit {env.get('commit')}"
             + (f" · transparent huge pages: {env['thp']}" if env.get("thp") else ""), "",
             f"Command: `{cmd}`", "", METHOD, ""]
    lines += pairs_table(results)
    secs = {r["mode"]: (r.get("accuracy") or {}).get("seconds_per_attach") for r in results}
    if len(set(secs.values())) > 1:
        lines += ["", "Seconds per phase: " + ", ".join(f"{m} {s:g} s" for m, s in secs.items() if s) + "."]
    lines += limit_lines(results)
    lines += pooled_table(results)
    lines += accuracy_table(results)
    lines += ["", "## Diagnostics", ""]
    for r in results:
        lines += [f"- {x}" for x in run_lines(r)]
    lines += core_table(results)
    errors = [f"{r['mode']} {e}" for r in results for e in r.get("attach_errors", [])]
    if errors:
        lines += ["", f"Attaches that failed ({len(errors)}; their phases measured nothing):", ""]
        lines += [f"- {e.splitlines()[0]}" for e in errors]
    return "\n".join(lines) + "\n"
