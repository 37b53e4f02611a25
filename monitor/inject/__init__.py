"""Attach without restart: load the agent into a running CPython.

On 3.10–3.13 a helper process (helper.py) stops the target's main thread with ptrace for well under a
millisecond and queues the bootstrap as a pending call (`Py_AddPendingCall`), which the interpreter runs on its main
thread between two bytecodes; the bootstrap only starts a thread, and that thread imports and starts the agent.
On 3.14 and later the interpreter's own `sys.remote_exec` (PEP 768) does the same (remote_exec.py). Either way the
agent then behaves as one started by `decodemon run`: dormant between attaches, reused by the next attach, never
unloaded. When loading cannot work, `why_not` gives the one-line reason and the caller adds the two ways to make a
process attachable.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from decodemon.monitor.inject import access, elf
from decodemon.monitor.inject.remote_exec import disabled_reason, remote_exec, remove
from decodemon.monitor.safe_text import visible
from decodemon.probes.wire import socket_path

BOOTSTRAP = '''\
# written by decodemon: start the probe agent in this process
import sys as _sys
import threading as _threading
import time as _time
_note_at = {note_at!r}  # where the monitor looks for why the agent did not start ("": nowhere)


def _note(text):
    """Written only into a real directory of this uid, as a new file, never through a link."""
    if _note_at:
        try:
            import os as _os
            import stat as _stat
            _d = _os.path.dirname(_note_at)
            try:
                _os.mkdir(_d, 0o700)
            except FileExistsError:
                pass
            _st = _os.lstat(_d)
            if not _stat.S_ISDIR(_st.st_mode) or _st.st_uid != _os.getuid():
                return
            _fd = _os.open(_note_at, _os.O_WRONLY | _os.O_CREAT | _os.O_EXCL | _os.O_NOFOLLOW, 0o600)
            with _os.fdopen(_fd, "w") as _f:
                _f.write(text)
        except OSError:
            pass


class _GilBetweenImports:
    """A finder that finds nothing: before each module this thread imports it sleeps {ratio!r} times the CPU time
    the thread spent since the last one (at least {pause_s!r} s), so the loop's thread has the GIL between modules,
    waits for at most one module's import at a time, and loses at most ~{duty_pct!r}% of it while the agent
    loads."""

    def __init__(self):
        self.ident = _threading.get_ident()
        self.since = _time.thread_time()

    def find_spec(self, name, path=None, target=None):
        if _threading.get_ident() == self.ident:
            _time.sleep(max({pause_s!r}, {ratio!r} * (_time.thread_time() - self.since)))
            self.since = _time.thread_time()
        return None


_polite = _GilBetweenImports()
_sys.meta_path.insert(0, _polite)
try:
    import importlib.util as _util
    if _util.find_spec("decodemon") is None:  # not in the target's environment: map decodemon's own folder in
        # (the agent imports the standard library alone; nothing else of decodemon's environment is put on the
        # target's sys.path)
        import types as _types
        _pkg = _types.ModuleType("decodemon")
        _pkg.__path__ = [{pkg_root!r}]
        _sys.modules["decodemon"] = _pkg
    try:  # the engine adapters' attach hooks, registered before the agent can take an attach
        import decodemon.engine_adapter.auto  # noqa: F401
    except Exception as _exc:
        print("decodemon: engine adapters not loaded:", _exc, file=_sys.stderr)
    from decodemon.probes.agent import start as _start
    if _start() is None:
        _note("the agent could not open its socket")
except Exception as _exc:
    print("decodemon: agent not started:", _exc, file=_sys.stderr)
    _note(f"{{type(_exc).__name__}}: {{_exc}}")
finally:
    if _polite in _sys.meta_path:
        _sys.meta_path.remove(_polite)
'''
IMPORT_PAUSE_S = 0.001  # the bootstrap thread's shortest sleep before each module it imports (_GilBetweenImports)
# ... and its sleep per second of its work since the previous module: the GIL the bootstrap takes from an eager
# loop's thread (which holds it nearly all the time) stays ~1/(1 + ratio) of it while the agent loads. With a bare
# 1 ms sleep, an injected eager generate() on an H200 had six tokens 1.3-2.9x its median during the 0.34 s load.
IMPORT_SLEEP_RATIO = 9.0

# What the main thread runs at its safe point: start a thread and return, so the imports do not stall the loop.
# It binds no name in __main__ and never raises (a pending call that fails without an exception breaks the target).
PENDING_CALL = '''\
try:
    __import__("threading").Thread(target=exec, args=({source!r}, {{"__name__": "__decodemon_bootstrap__"}}),
                                   name="decodemon-bootstrap", daemon=True).start()
except BaseException:
    pass
'''

API_SYMBOLS = ["Py_AddPendingCall", "PyRun_SimpleString"]
HELPER_TIMEOUT_S = 15.0


class InjectError(RuntimeError):
    """Why the agent could not be loaded into a running process; one line. `fix`, when set, is the one way to
    make it loadable (else the ways to start a process with the agent)."""

    def __init__(self, text: str, fix: str = "") -> None:
        super().__init__(text)
        self.fix = fix


class InjectTimeout(InjectError):
    """The target did not run the agent in time: its main thread reached no safe point (held in C code, stopped)."""


@dataclass(frozen=True)
class Target:
    """What loading the agent into a process needs to know about it."""

    pid: int
    exe: str
    version: tuple[int, int] | None
    interpreter: str  # the file that exports the C API: the executable or a libpython


def note_path(pid: int) -> Path:
    """Where the bootstrap in `pid` writes why its agent did not start."""
    return socket_path(pid).with_suffix(".failed")


def _note_dir(pid: int, uid: int | None) -> int | None:
    """A descriptor of the note's directory when it is a real directory (not a link) of the target's uid that no
    other user can write; None otherwise: a note is read and removed only there, by name under that descriptor."""
    if uid is None:
        return None
    try:
        dfd = os.open(note_path(pid).parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(dfd)
    if st.st_uid != uid or st.st_mode & 0o022:
        os.close(dfd)
        return None
    return dfd


def _remove_note(pid: int, uid: int | None) -> None:
    """Remove a note an earlier attempt left (only in _note_dir; unlinking a name never follows a link)."""
    dfd = _note_dir(pid, uid)
    if dfd is None:
        return
    try:
        os.unlink(note_path(pid).name, dir_fd=dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def take_note(pid: int, uid: int | None) -> str | None:
    """The first line of the agent's failure note, escaped for a terminal (the target wrote it), and the note
    removed; None when there is none. Read only in _note_dir, a regular file of the target's uid opened without
    following a link."""
    dfd = _note_dir(pid, uid)
    if dfd is None:
        return None
    name = note_path(pid).name
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                return None
            text = os.read(fd, 4096).decode(errors="replace")
        finally:
            os.close(fd)
        try:
            os.unlink(name, dir_fd=dfd)
        except OSError:
            pass
    finally:
        os.close(dfd)
    return visible((text.strip().splitlines() or ["no reason given"])[0][:300])


def bootstrap_source(pid: int | None = None) -> str:
    """The bootstrap the target executes: decodemon's folder mapped in as the package where the target has none,
    then start the agent (with `pid`, a failure is written where `_wait_for_socket` reads it)."""
    import decodemon.probes.wire as w
    from decodemon.monitor.sources import agent_socket

    pkg_root = Path(w.__file__).resolve().parent.parent  # the folder that holds `probes` (or decodemon/)
    # a note only where this user's own sockets live, and only from a target of this uid: another uid's target
    # would make (and own) this user's socket directory by writing it
    mine = pid is not None and agent_socket.target_uid(pid) == os.geteuid()
    return BOOTSTRAP.format(pkg_root=str(pkg_root), pause_s=IMPORT_PAUSE_S, ratio=IMPORT_SLEEP_RATIO,
                            note_at=str(note_path(pid)) if mine else "",
                            duty_pct=round(100 / (1 + IMPORT_SLEEP_RATIO)))


def pending_call_source(source: str | None = None, pid: int | None = None) -> str:
    """The source queued as a pending call: run `source` (default: the bootstrap for `pid`) in a new daemon
    thread."""
    return PENDING_CALL.format(source=bootstrap_source(pid) if source is None else source)


def untrusted_program(exe: str) -> str | None:
    """Why running the target's interpreter `exe` from this process would run code another user could have
    written (the file, or a directory above it, another user's or writable by others), or None where only root or
    this user could have: decodemon, often root, runs no program a neighbour could have swapped."""
    from decodemon.probes import own_files

    d, name = os.path.split(os.path.realpath(exe))
    try:
        dfd, real = own_files.open_dir(d)
        try:
            os.close(own_files.open_file(dfd, name, real))
        finally:
            os.close(dfd)
    except OSError as exc:
        return str(exc)
    return None


def _version_by_running(exe: str) -> tuple[int, int] | None:
    if untrusted_program(exe):  # the version stays unknown rather than running another user's program
        return None
    try:
        # isolated, in "/": the target's interpreter reads nothing from root's environment or directory
        out = subprocess.run([exe, "-I", "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                             text=True, timeout=10, cwd="/").stdout.split()
        return int(out[0]), int(out[1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def examine(pid: int) -> Target:
    """The target's interpreter and version; InjectError with the reason when it is not an attachable CPython."""
    if not Path(f"/proc/{pid}").exists():
        raise InjectError(f"no process with pid {pid}")
    refused = access.refusal(pid)
    if refused:
        raise InjectError(refused)
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        interp = elf.find_interpreter(pid, API_SYMBOLS)
        maps = elf.read_maps(pid) if interp is None else []
    except OSError as exc:
        raise InjectError(f"cannot read /proc/{pid} ({exc.strerror or exc})") from None
    if interp is None:
        looks_python = "python" in Path(exe).name or any(elf.LIBPYTHON.search(Path(m.path).name) for m in maps)
        if not looks_python:
            raise InjectError(f"pid {pid} is not a Python process ({exe})")
        raise InjectError(f"the CPython API symbols (Py_AddPendingCall) of pid {pid} cannot be found in {exe} "
                          "or a libpython: a static or stripped interpreter")
    version = interp.version or ("python" in Path(exe).name and _version_by_running(exe)) or None
    if version is not None and version < (3, 10):
        raise InjectError(f"pid {pid} runs Python {version[0]}.{version[1]}; decodemon's agent needs 3.10 or newer")
    return Target(pid, exe, version, interp.path)


def why_not(pid: int) -> tuple[str, str]:
    """(interpreter, '') when injection can be tried, else ('', the reason)."""
    try:
        t = examine(pid)
    except InjectError as exc:
        return "", str(exc)
    if t.version is not None and t.version >= (3, 14):
        reason = disabled_reason(pid)
        if reason:
            return "", reason
    return t.interpreter, ""


def _describe_failure(pid: int, result: dict) -> str:
    """One line for a helper result that did not queue the source."""
    why, err = result.get("why"), result.get("error", "unknown error")
    if why == "ptrace" and result.get("errno") == errno.EPERM:
        return access.explain_eperm(pid)
    if why == "ptrace" and result.get("errno") == errno.ESRCH:
        return f"pid {pid} ended or cannot be stopped"
    if why == "timeout":
        return f"the main thread of pid {pid} could not be stopped and resumed in time ({err}); it was left running"
    return f"loading the agent into pid {pid} failed: {err}"


def queue_source(pid: int, source: str) -> dict:
    """Queue `source` as a pending call in `pid` through the ptrace helper; return the helper's report.

    The report holds `ok`, `stop_us` (how long the main thread was stopped) and, when not ok, `why` and `error`."""
    from decodemon.probes import children

    cmd = children.python_argv("decodemon.monitor.inject.helper", str(pid))
    try:
        r = subprocess.run(cmd, input=source.encode(), capture_output=True, timeout=HELPER_TIMEOUT_S,
                           cwd=children.CWD,
                           start_new_session=True)  # a monitor killed now leaves the helper to finish and detach
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise InjectError(f"the ptrace helper did not run ({exc})") from None
    try:
        return json.loads(r.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        if r.returncode < 0:  # the target never depends on the helper: it runs on whatever step this came at
            raise InjectError(f"the ptrace helper was killed ({signal.Signals(-r.returncode).name}) before it "
                              f"finished; pid {pid} runs on unharmed; attach again") from None
        last = (r.stderr.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise InjectError(f"the ptrace helper failed: {last}") from None


def _wait_for_socket(pid: int, timeout_s: float) -> Path:
    from decodemon.monitor.sources import agent_socket

    uid = agent_socket.target_uid(pid)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:  # the target runs the bootstrap at its next safe point
        sock = agent_socket.find(pid)
        if sock is not None:
            return sock
        why = take_note(pid, uid)
        if why is not None:
            raise InjectError(f"the agent did not start in pid {pid}: {why}")
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            raise InjectError(f"pid {pid} ended before its agent started") from None
        time.sleep(0.02)
    raise InjectTimeout(f"pid {pid} did not start the agent within {timeout_s:g} s: its main thread has not reached "
                      "a safe point (blocked in C code?) or is still loading it; the agent listens once it has")


def inject(pid: int, timeout_s: float = 5.0) -> Path:
    """Load the agent into `pid`; return its socket path or raise InjectError. A running agent is reused."""
    from decodemon.monitor.sources import agent_socket

    sock = agent_socket.find(pid)
    if sock is not None:
        return sock
    t = examine(pid)
    script = None
    if t.version is not None and t.version >= (3, 14):
        reason = disabled_reason(pid)
        why = untrusted_program(t.exe) if reason is None else None
        if why:
            reason = (f"sys.remote_exec would run pid {pid}'s interpreter, and {why}: decodemon runs no program "
                      "another user could have written")
        if reason is None:  # the same source as the pending call: the main thread only starts a thread
            reason, script = remote_exec(pid, t.exe, pending_call_source(pid=pid))
        if reason:
            raise InjectError(reason)
    else:
        from decodemon.monitor.sources.agent_socket import target_uid

        _remove_note(pid, target_uid(pid))  # a note from an earlier attempt is not this one's
        result = queue_source(pid, pending_call_source(pid=pid))
        if not result.get("ok"):
            raise InjectError(_describe_failure(pid, result))
    try:
        return _wait_for_socket(pid, timeout_s)
    finally:
        remove(script)
