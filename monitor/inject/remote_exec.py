"""Python ≥ 3.14: the interpreter's own `sys.remote_exec` (PEP 768) runs the bootstrap at its next safe point.

The call is made by the *target's* interpreter (`/proc/PID/exe`), since `sys.remote_exec` needs the same Python
version on both sides; the monitor itself may run on any Python.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path


def disabled_reason(pid: int) -> str | None:
    """Why `sys.remote_exec` will refuse `pid`, or None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    if any(e.startswith(b"PYTHON_DISABLE_REMOTE_DEBUG=") for e in env):
        return f"pid {pid} was started with PYTHON_DISABLE_REMOTE_DEBUG set, which turns off sys.remote_exec"
    return None


def remote_exec(pid: int, exe: str, source: str) -> tuple[str | None, str | None]:
    """Ask `pid` to run `source` through `sys.remote_exec`: (None, the script's path) on success, else (the one-line
    reason, None). The target reads the script at its next safe point, which may come after this returns, so the
    caller removes the file once the target has run it (or given up)."""
    fd, path = tempfile.mkstemp(prefix="decodemon-bootstrap-", suffix=".py")
    with os.fdopen(fd, "w") as fh:
        fh.write(source)
    os.chmod(path, 0o644)  # the target reads it; it contains no secrets
    try:
        r = subprocess.run([exe, "-I", "-c", f"import sys; sys.remote_exec({pid}, {path!r})"], capture_output=True,
                           text=True, timeout=15, cwd="/")  # isolated: it reads nothing from root's directory
        why = None if r.returncode == 0 else \
            f"sys.remote_exec failed: {(r.stderr.strip().splitlines() or ['unknown error'])[-1]}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = f"sys.remote_exec could not be run with {exe} ({exc})"
    if why is not None:
        remove(path)
        return why, None
    return None, path


def remove(path: str | None) -> None:
    """Remove a script remote_exec wrote (quietly if it is gone)."""
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass
