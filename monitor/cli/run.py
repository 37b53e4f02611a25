"""`decodemon run -- CMD ...`: start a command with the probe agent loaded, and pass signals on to it."""

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
                       description="Start CMD with the decodemon agent loaded (dormant until an attach); the pid "
                                   "goes to stderr and, with --pid-file, to a file.")
    p.add_argument("--pid-file", metavar="FILE", help="also write the pid here")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    p.set_defaults(fn=run)


def agent_env() -> dict:
    """This process's environment with the agent's bootstrap on PYTHONPATH."""
    import importlib.util

    from pathlib import Path

    boot = list(importlib.util.find_spec("decodemon.probes._bootstrap").submodule_search_locations)[0]
    env = dict(os.environ)
    env["DECODEMON_AGENT"] = "1"
    env["DECODEMON_PKG_ROOT"] = str(Path(boot).resolve().parent.parent)  # for an interpreter without decodemon
    env["PYTHONPATH"] = boot + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


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
        from decodemon.monitor.sources import check_output

        check_output(a.pid_file)  # before the command starts, not after
        if os.path.exists(a.pid_file) and not os.path.isfile(a.pid_file):  # a FIFO would block, a device eat it
            raise UsageError(f"decodemon run: --pid-file {a.pid_file} is not a regular file (give a file name)")
    from decodemon.monitor.bandwidth import measure_before_start

    measure_before_start()  # the floor's copy bandwidth, while the GPU is still idle (an attach never measures)
    try:
        proc = subprocess.Popen(cmd, env=agent_env())
    except OSError as exc:
        raise UsageError(f"decodemon run: cannot start {cmd[0]}: {exc.strerror}") from None
    print(f"decodemon: started pid {proc.pid}; attach with `decodemon attach {proc.pid}`", file=sys.stderr, flush=True)
    if a.pid_file is not None:
        from decodemon.monitor.sources import write_text_whole

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
