"""Running one demo engine through a plan of phases.

A plan is a list of labels, each run for the phase's seconds on the same engine process:

    U       unobserved: nothing attached, the engine decodes
    D       `decodemon attach PID --json` at default settings
    Ddense  the same, traced densely (2 tokens every 1 s)
    Dlong   one long attach at defaults (a plan gives it as ("Dlong", seconds))
    P       torch.profiler, toggled inside the engine by SIGUSR1 (a process of its own: see overhead.run_mode)
    S       the live screen, `decodemon attach PID` in a pseudo-terminal (run_screen)

Any other label given in `attach_args` attaches with those extra arguments.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .machine import host_share, host_ticks, proc_counters, vm_counters, vm_rates

PY = sys.executable
DM = [PY, "-m", "decodemon.monitor.cli"]
DEMO = [PY, "-m", "decodemon.engine_adapter.demo"]
DENSE = {"window_period_s": 1, "window_tokens": 2, "window_min_tokens": 0}


def probe_args(settings: dict) -> list[str]:
    """decodemon's expert option for probe settings (`--probe KEY=VALUE`, KEY a `decodemon.probes.wire.Attach`
    field), one per setting: {"hold_gil": False} -> ["--probe", "hold_gil=false"]."""
    out = []
    for k, v in settings.items():
        out += ["--probe", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return out


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


def run_screen(pid: int, extra: list[str], seconds: float, size: tuple[int, int] = (160, 50)) -> dict:
    """`decodemon attach PID` (the live screen, not --json) in a pseudo-terminal of `size` for `seconds`, its output
    read and dropped as a terminal would take it, then `q`. Returns the monitor's CPU seconds and how it ended."""
    import fcntl
    import pty
    import struct
    import termios

    child, fd = pty.fork()
    if child == 0:  # the monitor: no Python-level cleanup in this forked copy, exec or exit at once
        try:
            os.environ.update(TERM="xterm-256color", COLUMNS=str(size[0]), LINES=str(size[1]))
            os.execv(DM[0], DM + ["attach", str(pid)] + list(extra))
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    out = {"screen": True}
    alive = _drain(fd, time.monotonic() + seconds)
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
        _drain(fd, time.monotonic() + 5.0)
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


def _drain(fd: int, until: float) -> bool:
    """Read a pseudo-terminal until `until`; False once the other side has closed it."""
    import select

    while time.monotonic() < until:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                if not os.read(fd, 1 << 16):
                    return False
            except OSError:
                return False
    return True


def _profiler_phase(pid: int, prof_dir: Path, k: int, seconds: float) -> dict:
    """torch.profiler on for `seconds` inside the engine (SIGUSR1 twice); its k-th summary once written."""
    os.kill(pid, signal.SIGUSR1)
    while not (prof_dir / f"profiler{k}.start").exists():
        time.sleep(0.05)
    time.sleep(seconds)
    os.kill(pid, signal.SIGUSR1)
    while True:  # the engine may still be writing it
        time.sleep(0.1)
        try:
            return json.loads((prof_dir / f"profiler{k}.json").read_text())
        except (OSError, ValueError):
            pass


def _attach_json(pid: int, extra: list[str], seconds: float) -> dict:
    """One `decodemon attach PID --json` for `seconds`: its report, or {"error": stderr}."""
    r = subprocess.run(DM + ["attach", str(pid), "--json", "--seconds", f"{seconds:g}"] + extra,
                       capture_output=True, text=True)
    return json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()}


def _start_engine(mode: str, tag: str, work: Path, tiny: bool) -> tuple[subprocess.Popen, int, dict]:
    """A demo engine decoding without end under `decodemon run`, logging every token's clocks."""
    paths = {"prof": work / f"prof_{mode}_{tag}", "times": work / f"times_{mode}_{tag}.json",
             "pid": work / f"{mode}_{tag}.pid", "err": work / f"{mode}_{tag}.engine.err"}
    paths["prof"].mkdir(parents=True, exist_ok=True)
    cpu = ["--tiny", "--device", "cpu"] if tiny else []
    eng = subprocess.Popen(DM + ["run", "--pid-file", str(paths["pid"]), "--"] + DEMO + cpu +
                           ["--mode", "eager" if tiny else mode, "--tokens", "0", "--times-file", str(paths["times"]),
                            "--cpu-clocks", "--profiler-dir", str(paths["prof"])],
                           stdout=subprocess.DEVNULL, stderr=open(paths["err"], "w"))
    pid = until_decoding(eng, paths["err"], paths["pid"])
    if pid is None:
        raise RuntimeError(paths["err"].read_text()[-2000:])
    return eng, pid, paths


def engine_session(mode: str, tag: str, plan: list, phase_s: float, work: Path,
                   profiler_phase_s: float | None = None, attach_args: dict | None = None,
                   screens: set[str] | None = None, tiny: bool = False) -> dict:
    """Run one engine through `plan` (see the module's docstring); return its phases as (label, t0, t1), the
    attach reports as (label, report), torch.profiler's summaries, the machine per phase and the token log.
    `attach_args[label]`: that label's extra attach arguments; a label in `screens` attaches with the live screen.
    `tiny`: the tiny CPU engine, a dry run of the plan."""
    attach_args = {"Ddense": probe_args(DENSE), **(attach_args or {})}
    eng, pid, paths = _start_engine(mode, tag, work, tiny)
    phases, attach, profs, hosts = [], [], [], []
    for label in plan:
        label, secs = label if isinstance(label, tuple) else (label, phase_s)
        h0, v0, t0 = host_ticks(), {**vm_counters(), **proc_counters(pid)}, time.time()
        if label == "P":
            res = _profiler_phase(pid, paths["prof"], len(profs), profiler_phase_s or phase_s)
            profs.append(res)
            phases.append(("P", res["start_unix_s"], res["end_unix_s"]))
            time.sleep(1.0)  # let the engine settle after the profiler's own processing
        elif label == "U":
            time.sleep(secs)
            phases.append(("U", t0, time.time()))
        else:
            extra = attach_args.get(label, [])
            rep = (run_screen(pid, extra, secs) if label in (screens or ()) or label == "S"
                   else _attach_json(pid, extra, secs))
            phases.append((label, t0, time.time()))
            attach.append((label, rep))
        hosts.append({**host_share(h0, host_ticks()),
                      **vm_rates(v0, {**vm_counters(), **proc_counters(pid)}, time.time() - t0)})
    os.kill(pid, signal.SIGTERM)
    eng.wait(timeout=60)
    tdata = json.loads(paths["times"].read_text())
    return {"phases": phases, "attach": attach, "profs": profs, "hosts": hosts, "times": tdata,
            "ends": tdata["end_unix_s"], "ms": tdata["ms"]}
