"""Attach without restart: load the agent into a running Python ≥ 3.14 with `sys.remote_exec`.

PEP 768 lets a process of the same Python version ask a running interpreter to
execute a file at its next safe point. decodemon writes a small bootstrap that
puts its own install location on the target's `sys.path` and starts the agent,
then runs the *target's* interpreter (`/proc/PID/exe`) to make the call, so the
monitor itself may run on any Python. When that cannot work, `why_not` says
exactly why, and the caller prints the two ways to make a process attachable.
No gdb, no ptrace of our own.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from decodemon.probes.wire import socket_path

BOOTSTRAP = '''\
# written by decodemon: start the probe agent in this process (sys.remote_exec, PEP 768)
import sys as _sys
for _p in {paths!r}:
    if _p not in _sys.path:
        _sys.path.append(_p)
try:
    from decodemon.probes.agent import start as _start
    _start()
except Exception as _exc:
    print("decodemon: agent not started:", _exc, file=_sys.stderr)
'''


class InjectError(RuntimeError):
    """Why the agent could not be loaded into a running process; one line."""


def bootstrap_source() -> str:
    """The bootstrap the target executes: our install location on sys.path, then start the agent."""
    import decodemon.probes.wire as w

    pkg_root = Path(w.__file__).resolve().parent.parent  # the folder that holds `probes` (or decodemon/)
    paths = sorted({str(pkg_root.parent), str(pkg_root)})
    return BOOTSTRAP.format(paths=paths)


def target_python(pid: int) -> tuple[str, tuple[int, int]]:
    """The target's interpreter path and version; InjectError if it is not a Python process."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError as exc:
        raise InjectError(f"cannot read /proc/{pid}/exe ({exc.strerror})") from None
    if "python" not in Path(exe).name:
        raise InjectError(f"pid {pid} is not a Python process ({exe})")
    try:
        out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=10).stdout.split()
        return exe, (int(out[0]), int(out[1]))
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        raise InjectError(f"cannot run the target's interpreter {exe}") from None


def why_not(pid: int) -> tuple[str, str]:
    """(interpreter, '') when injection can be tried, else ('', the reason)."""
    try:
        exe, ver = target_python(pid)
    except InjectError as exc:
        return "", str(exc)
    if ver < (3, 14):
        return "", f"pid {pid} runs Python {ver[0]}.{ver[1]}; attaching without restart needs Python 3.14 (sys.remote_exec)"
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if any(e.startswith(b"PYTHON_DISABLE_REMOTE_DEBUG=") for e in env):
            return "", f"pid {pid} was started with PYTHON_DISABLE_REMOTE_DEBUG set"
    except OSError:
        pass
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        scope = 0
    if scope >= 2 and os.geteuid() != 0:
        return "", f"kernel.yama.ptrace_scope is {scope}: only root may attach to other processes"
    if scope == 3:
        return "", "kernel.yama.ptrace_scope is 3: attaching is disabled on this machine"
    return exe, ""


def inject(pid: int, timeout_s: float = 5.0) -> Path:
    """Load the agent into `pid`; return its socket path or raise InjectError."""
    exe, reason = why_not(pid)
    if not exe:
        raise InjectError(reason)
    fd, path = tempfile.mkstemp(prefix="decodemon-bootstrap-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(bootstrap_source())
        os.chmod(path, 0o644)  # the target reads it; it contains no secrets
        r = subprocess.run([exe, "-c", f"import sys; sys.remote_exec({pid}, {path!r})"], capture_output=True,
                           text=True, timeout=15)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["unknown error"])[-1]
            raise InjectError(f"sys.remote_exec failed: {last}")
        sock = socket_path(pid)
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:  # the target runs it at its next safe point
            if sock.exists():
                return sock
            time.sleep(0.05)
        raise InjectError(f"pid {pid} did not start the agent within {timeout_s:g} s (is its main thread blocked?)")
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
