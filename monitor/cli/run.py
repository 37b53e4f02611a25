"""`decodemon run -- CMD ...`: start a command with the probe agent loaded (the Python agent, or for a command with
no Python, such as llama-server, the CUPTI injection library), and pass signals on to it."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from decodemon.monitor.cli._common import UsageError


def add(sub) -> None:
    """Register the verb."""
    p = sub.add_parser("run", help="start a command with the probe agent loaded and print its pid",
                       description="Start CMD with the decodemon agent loaded (dormant until an attach; for a command "
                                   "with no Python, such as llama-server, decodemon's CUPTI injection library, built "
                                   "once with the C compiler); the pid "
                                   "goes to stderr and, with --pid-file, to a file.")
    p.add_argument("--pid-file", metavar="FILE", help="also write the pid here")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(fn=run)


def runs_python(cmd: list[str]) -> bool:
    """Does CMD start a Python interpreter (directly, or a script whose #! line names one)? Those get the Python
    agent; anything else (llama-server) the CUPTI injection library."""
    import re
    import shutil

    exe = shutil.which(cmd[0]) or cmd[0]
    if re.fullmatch(r"python[0-9.]*", os.path.basename(exe)) or os.path.basename(exe) in ("pytest", "torchrun"):
        return True
    try:
        with open(exe, "rb") as f:
            head = f.readline(256)
    except OSError:
        return False
    return head.startswith(b"#!") and b"python" in head


def native_env(env: dict, cmd: list[str]) -> dict:
    """For a command with no Python: CUDA_INJECTION64_PATH set to decodemon's CUPTI injection library (built once,
    monitor/inject/cupti_lib.py), so the CUDA driver loads it at cuInit and an attach gets traced windows.
    DECODEMON_CUPTI_INJECT=0 leaves it out; a CUDA_INJECTION64_PATH already set is left as it is. A library that
    cannot be built costs the windows only: one line says why, and the command starts all the same."""
    import shutil

    if env.get("DECODEMON_CUPTI_INJECT") == "0" or shutil.which(cmd[0]) is None:  # nothing to start: Popen says so
        return env
    if env.get("CUDA_INJECTION64_PATH"):
        print(f"decodemon: CUDA_INJECTION64_PATH is already set ({env['CUDA_INJECTION64_PATH']}); no traced windows "
              f"from decodemon in {cmd[0]}", file=sys.stderr)
        return env
    from decodemon.monitor.inject.cupti_lib import BuildError, build

    try:
        lib = build()
    except (BuildError, OSError, subprocess.SubprocessError) as exc:
        print(f"decodemon: no traced windows in {cmd[0]} ({exc}); its own counters are still watched",
              file=sys.stderr)
        return env
    return {**env, "CUDA_INJECTION64_PATH": str(lib)}


def _stop(proc) -> None:
    """End a child the wrapper cannot account for: SIGTERM, then SIGKILL after 3 s."""
    proc.terminate()
    try:
        proc.wait(3)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run(a) -> int:
    """Start the command, wait for it, and return its exit status."""
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        raise UsageError("decodemon run: give a command after --, e.g. `decodemon run -- python loop.py` "
                         "(see `decodemon run --help`)")
    if a.pid_file is not None:
        from decodemon.monitor.safe_write import check_output

        check_output(a.pid_file)  # before the command starts, not after: no FIFO or device, no other user's link
    from decodemon.monitor.counters.bandwidth import measure_before_start

    measure_before_start()  # the floor's copy bandwidth, while the GPU is still idle (an attach never measures)
    try:
        from decodemon.monitor.sources.pids import agent_env

        env = agent_env()
        proc = subprocess.Popen(cmd, env=env if runs_python(cmd) else native_env(env, cmd))
    except OSError as exc:
        raise UsageError(f"decodemon run: cannot start {cmd[0]}: {exc.strerror}") from None
    print(f"decodemon: started pid {proc.pid}; attach with `decodemon attach {proc.pid}`", file=sys.stderr, flush=True)
    if a.pid_file is not None:
        from decodemon.monitor.safe_write import write_text_whole

        try:
            write_text_whole(a.pid_file, f"{proc.pid}\n")
        except Exception as exc:  # no pid file, no watched child: stop it rather than leave it unwatched
            _stop(proc)
            raise UsageError(f"decodemon run: cannot write --pid-file {a.pid_file} ({exc}); "
                             f"pid {proc.pid} stopped") from None
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda s, _f: proc.send_signal(s))  # the wrapper passes signals on, never dies first
    while True:
        try:
            rc = proc.wait()
            return rc if rc >= 0 else 128 - rc
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
