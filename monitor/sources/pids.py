"""A pid as a source: that it names a live process of this user's (or root's), whether it is watched from outside
(llama-server, a CUDA program with no Python) or through its agent, and the agent loaded into it if it has none."""

from __future__ import annotations

import os
import time
from pathlib import Path

from decodemon.monitor.sources.errors import NotAnswering, SourceError


HOW_TO_ATTACH = ("start it with `decodemon run -- CMD ...`, or set DECODEMON_AGENT=1 and call "
                 "decodemon.probes.agent.start_from_env(), or add `import decodemon.probes.autostart`")


def require_process(pid: int) -> None:
    """SourceError unless `pid` names a running process."""
    if pid <= 0:
        raise SourceError(f"{pid} is not a valid pid")
    if not Path(f"/proc/{pid}").exists():
        raise SourceError(f"no process with pid {pid}")


def check_pid(pid: int, inject: bool = True) -> Path | None:
    """Return the agent socket of `pid` (loading the agent into a running CPython 3.10+ target if it has none),
    None for llama-server (watched from outside), or raise SourceError saying exactly what is wrong."""
    require_process(pid)
    from decodemon.monitor.sources import agent_socket

    owner = agent_socket.target_uid(pid)
    if owner is None:
        raise SourceError(f"no process with pid {pid}")
    if owner != os.getuid() and os.geteuid() != 0:
        raise SourceError(f"pid {pid} belongs to uid {owner}; decodemon attaches only to your own processes "
                          "(or, as root, to any)")
    from decodemon.monitor.sources import outside

    if outside.is_llama_server(pid):
        outside.endpoint_of(pid)  # its /slots is the token clock: say now if it has none
        return None
    path = agent_socket.find(pid)
    if path is None and not _looks_python(pid):
        gpu, no_gpu = outside.gpu_of(pid)
        if gpu is not None:
            return None  # a CUDA program with no Python: the device-wide view, watched from outside
        if not inject:
            raise SourceError(f"pid {pid} is not a Python process and {no_gpu}: nothing of it to watch")
    if path is None:
        # whatever sits where this user's agent would listen, an agent loaded now listens in a directory of its
        # own (probes/wire_socket.socket_home) and is found by the socket it holds
        if not inject:
            raise SourceError(f"pid {pid} has no decodemon agent listening; {HOW_TO_ATTACH}")
        from decodemon.monitor.inject import InjectError, InjectTimeout, inject as load_agent

        try:
            return load_agent(pid)
        except InjectError as exc:
            # a target that never reached a safe point measured nothing (exit 3); nothing the user gave was wrong
            error = NotAnswering if isinstance(exc, InjectTimeout) else SourceError
            if not _looks_python(pid):
                exc = f"{exc}, and {outside.gpu_of(pid)[1]}"
            raise error(f"pid {pid} has no decodemon agent listening and it cannot be loaded ({exc}); "
                              f"{getattr(exc, 'fix', '') or HOW_TO_ATTACH}") from None
    return path


def _looks_python(pid: int) -> bool:
    """The process runs a CPython (its executable's name, or a libpython mapped); unreadable counts as Python (the
    loader then says what it cannot read)."""
    from decodemon.monitor.inject import elf

    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        if "python" in Path(exe).name:
            return True
        return any(elf.LIBPYTHON.search(Path(m.path).name) for m in elf.read_maps(pid))
    except OSError:
        return True


GONE_WAIT_S = 1.0  # how long a closed connection waits for its process to be gone before saying it still runs


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat), or None when it is gone: a pid with
    another start time is another process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def process_age_s(pid: int) -> float | None:
    """Seconds since `pid` started, or None where /proc does not say."""
    ticks = start_time(pid)
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError):
        return None
    return None if ticks is None else max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (one that exited and waits to be reaped is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _closed(pid: int, answered: bool) -> str:
    """Why a connection to `pid`'s agent ended without a Bye: the process went away, or (while it lives) its
    agent closed the connection, before or after answering."""
    deadline = time.monotonic() + GONE_WAIT_S
    while _alive(pid):  # a process that is exiting closes its sockets a moment before it is gone
        if time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    else:
        return f"pid {pid} went away"
    if not answered:
        return f"the agent of pid {pid} closed the connection without answering (pid {pid} still runs)"
    return f"the agent of pid {pid} closed the connection (pid {pid} still runs)"


def agent_env() -> dict:
    """This process's environment with the agent's bootstrap on PYTHONPATH: a program started with it loads the
    agent at its start (`decodemon run`, the sweep's runs)."""
    import importlib.util

    from pathlib import Path

    # the bootstrap of the decodemon running now, by its absolute path: a relative one would be read from wherever
    # the command starts
    boot = os.path.abspath(list(importlib.util.find_spec("decodemon.probes._bootstrap").submodule_search_locations)[0])
    env = dict(os.environ)
    env["DECODEMON_AGENT"] = "1"
    env["DECODEMON_PKG_ROOT"] = str(Path(boot).resolve().parent.parent)  # for an interpreter without decodemon
    env["PYTHONPATH"] = boot + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
