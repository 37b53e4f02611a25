"""Whether this process may ptrace another one, and if not, the one-line reason.

The kernel's answer to PTRACE_SEIZE is only EPERM; the reason comes from what we can read: the target's owner,
an existing tracer, Yama's ptrace_scope and our effective capabilities, and whether we run in a container.
"""

from __future__ import annotations

import os
from pathlib import Path

CAP_SYS_PTRACE = 19


def _status_field(pid: int | str, name: str) -> str | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def has_cap_sys_ptrace() -> bool:
    """Whether this process holds CAP_SYS_PTRACE in its effective set."""
    cap = _status_field("self", "CapEff")
    return cap is not None and bool(int(cap, 16) >> CAP_SYS_PTRACE & 1)


def ptrace_scope() -> int:
    """kernel.yama.ptrace_scope (0 where Yama is absent)."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return 0


def in_container() -> bool:
    """A best guess: the markers Docker and Podman leave, or a cgroup path that names a container runtime."""
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    try:
        text = Path("/proc/1/cgroup").read_text()
    except OSError:
        return False
    return any(w in text for w in ("docker", "containerd", "kubepods", "libpod"))


def refusal(pid: int) -> str | None:
    """Why ptrace of `pid` will be refused, or None when nothing we can see stands in the way."""
    uid = _status_field(pid, "Uid")
    if uid is not None and os.geteuid() != 0 and int(uid.split()[0]) != os.geteuid():
        return f"pid {pid} belongs to uid {uid.split()[0]}; only the same user or root may attach"
    tracer = _status_field(pid, "TracerPid")
    if tracer not in (None, "0"):
        return f"pid {pid} is already traced by pid {tracer} (a debugger or profiler); detach it first"
    scope = ptrace_scope()
    if scope == 3:
        return "kernel.yama.ptrace_scope is 3: ptrace is disabled on this machine until reboot"
    if scope >= 1 and not has_cap_sys_ptrace():
        if in_container():
            return (f"kernel.yama.ptrace_scope is {scope} and this container has no CAP_SYS_PTRACE "
                    "(docker run --cap-add SYS_PTRACE)")
        if scope == 2:
            return "kernel.yama.ptrace_scope is 2: only root (CAP_SYS_PTRACE) may attach"
        return ("kernel.yama.ptrace_scope is 1: only a parent process may attach "
                "(run decodemon as root, or sysctl kernel.yama.ptrace_scope=0)")
    return None


def explain_eperm(pid: int) -> str:
    """The reason for an EPERM from ptrace, from what `refusal` sees, or the likely causes."""
    reason = refusal(pid)
    if reason:
        return reason
    if in_container() and not has_cap_sys_ptrace():
        return "ptrace was refused: this container has no CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE)"
    return "ptrace was refused (EPERM): a seccomp or security-module policy forbids it here"
