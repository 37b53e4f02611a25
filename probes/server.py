"""The agent's socket server and the attach lifecycle: accept, check the peer, hello, arm, serve, disarm.

One daemon thread blocks in `accept()` on a Unix socket in a per-user 0700 directory. A monitor of the same uid
is served on a thread of its own, one monitor at a time; anyone else is refused or told who is attached.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
import sys
import threading
import time
from pathlib import Path

from decodemon.probes import held, hooks, preload, wire
from decodemon.probes.attach_loop import AttachLoop
from decodemon.probes.device import Unavailable, cuda_device_index, cupti_version, gpu_info
from decodemon.probes.eventlog import EventLog
from decodemon.probes.facts import PROCESS
from decodemon.probes.pm_arm import arm_pm, release_pm
from decodemon.probes.session import ACTIVE, Closer, Session
from decodemon.probes.wire import socket_dir, socket_path


def open_own_dir(d: Path) -> int:
    """An fd on directory `d`, which must be a real directory (not a link) owned by this uid; PermissionError with
    one line otherwise. Nothing here follows a link: a directory someone else planted is never written through."""
    try:
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise PermissionError(f"{d} is a link or not a directory; remove it, or set XDG_RUNTIME_DIR to a "
                                  "directory of your own") from None
        raise
    st = os.fstat(fd)
    if st.st_uid != os.getuid():
        os.close(fd)
        raise PermissionError(f"{d} belongs to uid {st.st_uid}, not to uid {os.getuid()}; remove it, or set "
                              "XDG_RUNTIME_DIR to a directory of your own")
    return fd


def ensure_dir(d: Path) -> None:
    """Make the socket directory ours and private (0700), or refuse one that is a link or belongs to someone else.
    Its mode is set through the fd of the directory checked, never through a path."""
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    fd = open_own_dir(d)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def clean_stale_sockets(d: Path | None = None) -> list[int]:
    """Remove sockets whose process is gone; return their pids. Only in a directory of ours (open_own_dir), by
    name under its fd: a link planted in place of the directory or of a socket is never followed."""
    d = d or socket_dir()
    gone: list[int] = []
    try:
        fd = open_own_dir(d)
    except OSError:
        return gone
    try:
        for name in os.listdir(fd):
            stem, dot, ext = name.rpartition(".")
            if ext != "sock" or not stem.isascii() or not stem.isdigit():
                continue
            pid = int(stem)
            if not Path(f"/proc/{pid}").exists():
                try:
                    if stat.S_ISSOCK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=fd)
                        gone.append(pid)
                except OSError:
                    pass
    finally:
        os.close(fd)
    return gone


def hello(settings: dict, nvml: bool = False) -> wire.Hello:
    """The agent's first frame: the process, the device (read once per process and device) and the model. The
    device's NVML facts (peak bandwidth, driver version) are the monitor's to add (device.nvml_facts), unless
    `nvml`: this process then loads NVML itself."""
    gpu, why = None, ""
    try:
        # the device's facts do not change, and reading them (cuInit, the device queries) would otherwise be
        # agent-thread work at every attach's start
        idx = cuda_device_index()
        gpu = PROCESS.gpu.get((idx, nvml)) or PROCESS.gpu.setdefault((idx, nvml), gpu_info(idx, nvml=nvml))
    except Unavailable as exc:
        why = str(exc)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
    return wire.Hello(
        wire_version=wire.WIRE_VERSION, pid=os.getpid(), argv=list(sys.argv),
        python=sys.version.split()[0], hostname=socket.gethostname(), gpu=gpu,
        gpu_unavailable=why, cupti_version=cupti_version(), model=PROCESS.model, settings=settings,
    )


_PENDING = threading.BoundedSemaphore(8)  # connections whose Attach is still being read, at once


class Agent:
    """The listening socket and its accept thread; `serve` runs one attach."""

    def __init__(self) -> None:
        ensure_dir(socket_dir())
        clean_stale_sockets()
        self.path = socket_path(os.getpid())
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self.sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.sock.listen(4)
        self.busy_with: int | None = None
        self.yields = False  # the attached monitor steps aside for one that does not (Attach.yields)
        self.loop: AttachLoop | None = None
        self._claim_lock = threading.Lock()
        self.thread = threading.Thread(target=self._accept_loop, name="decodemon-agent", daemon=True)
        self.thread.start()

    def shutdown(self) -> None:
        """At exit: disarm the session (its next boundary leaves CUPTI) and remove the socket."""
        s = ACTIVE.session
        ACTIVE.session = None
        if s is not None:
            s.closing = True
        try:
            self.sock.close()
        finally:
            try:
                self.path.unlink()
            except OSError:
                pass

    def _accept_loop(self) -> None:
        held.name_this_thread("dm-agent")
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                self._admit(conn)
            except OSError:
                conn.close()

    def _admit(self, conn: socket.socket) -> None:
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        peer_pid, peer_uid, _ = struct.unpack("3i", cred)
        if peer_uid not in (os.getuid(), 0):  # this process's user, or root (who may watch any process)
            conn.close()
            return
        # each newcomer is read on a thread of its own, so one that sends nothing never holds up the accept loop;
        # past PENDING at once (a flood), closed unanswered
        if not _PENDING.acquire(blocking=False):
            conn.close()
            return
        threading.Thread(target=self.serve, args=(conn, peer_pid), name="decodemon-session", daemon=True).start()

    def _claim(self, peer_pid: int, settings: wire.Attach) -> bool:
        """Make `peer_pid` the attached monitor. A monitor that yields (the exporter) steps aside for one that
        does not: its loop ends with a Bye that says so, and the newcomer is served once it has left (≤ 3 s)."""
        deadline = time.monotonic() + 3.0
        while True:
            with self._claim_lock:
                if self.busy_with is None:
                    self.busy_with, self.yields = peer_pid, settings.yields
                    return True
                if not self.yields or settings.yields:
                    return False
                if self.loop is not None:
                    self.loop.step_aside = f"stepped aside for monitor pid {peer_pid}"
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    @staticmethod
    def _bye(conn: socket.socket, reason: str) -> None:
        """Say why, and close (for a monitor that was never served)."""
        try:
            conn.sendall(wire.pack(wire.Bye(reason=reason)))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            conn.close()

    def serve(self, conn: socket.socket, peer_pid: int = 0) -> None:
        """One attach, from the monitor's Attach to our Bye."""
        try:
            conn.settimeout(5.0)
            reader = wire.StreamReader(max_frame=64 * 1024)
            msgs: list = []
            while not msgs:
                data = conn.recv(4096)
                if not data:
                    conn.close()
                    return
                msgs = reader.feed(data)
            first = wire.decode_control(msgs[0])
        except (OSError, wire.WireError):
            conn.close()
            return
        finally:
            _PENDING.release()
        if not isinstance(first, wire.Attach):
            conn.close()
            return
        why = wire.attach_problem(first)
        if why is not None:  # nothing armed: the loop runs on as it was
            self._bye(conn, f"refused: {why}")
            return
        if not self._claim(peer_pid, first):
            self._bye(conn, f"busy: monitor pid {self.busy_with} is attached; one monitor at a time")
            return
        self._serve_claimed(conn, reader, first)

    def _serve_claimed(self, conn: socket.socket, reader, first: wire.Attach) -> None:
        res: dict = {"session": None}
        reason = "detached"
        held.name_this_thread("dm-session")  # the attach's thread: ticks, pumps, window collects
        try:
            ev = EventLog.from_env()
            with held.GilPolite():
                status = self.set_up(conn, first, res, ev)
            conn.sendall(wire.pack(wire.ProbeStatus(**status)))
            try:
                self.loop = AttachLoop(conn, reader, res["session"], status, ev, hello_frame=res.get("hello"))
                reason = self.loop.run()
            finally:
                if ev is not None:
                    ev.write()
        except (OSError, wire.WireError) as exc:
            reason = f"connection lost ({type(exc).__name__})"
        finally:
            self.loop = None
            self.tear_down(conn, res["session"], reason)

    def set_up(self, conn: socket.socket, settings: wire.Attach, res: dict, ev=None) -> dict:
        """Hello, tracer and (counters="in_process") PM for one attach, then arm the session; the status fields
        to send first. `ev` (the agent's event log, when one is kept) gets each step's ns."""
        t0 = time.time_ns()
        hooks.attach()  # engine adapters first: the model facts they report travel in the hello
        h = hello({k: float(getattr(settings, k)) for k in
                   ("window_period_s", "window_tokens", "pm_interval_us", "nvml_hz")})
        conn.sendall(wire.pack(h))
        res["hello"] = h
        if ev is not None:
            ev.add("hello", time.time_ns() - t0)
        held.ENABLED = settings.hold_gil  # before the loop's first call (an A/B run's attaches set it both ways)
        status: dict = {"token_clock": "armed"}
        if settings.token_range:
            status["token_range"] = settings.token_range
        tracer = pm = None
        if h.gpu is None:
            status.update(gpu="unavailable", gpu_error=h.gpu_unavailable, trace="unavailable", trace_reason="no_gpu",
                          pm="unavailable", pm_reason="no_gpu", nvml="unavailable", nvml_reason="no_gpu")
        else:
            status["gpu"] = "ok"
            pm_here = settings.pm and settings.counters == "in_process"
            if (settings.trace or pm_here) and "cupti.cupti" not in sys.modules:  # the process's first attach
                t0 = time.time_ns()
                preload.preload_cupti()
                if ev is not None:
                    ev.add("preload", time.time_ns() - t0)
            t0 = time.time_ns()
            tracer = self._arm_trace(settings, status)
            if ev is not None:
                ev.add("tracer", time.time_ns() - t0)
            # NVML, and PM too with counters="monitor", are read by the monitor's sidecar (monitor/sidecar.py):
            # this process starts no child. PM is armed here only where a second process cannot arm it
            if settings.counters == "in_process":
                pm = arm_pm(settings, status) if settings.pm else None
                if not settings.pm:
                    status["pm"] = "off"
        session = res["session"] = Session(settings, tracer)
        session.pm = pm
        with ACTIVE.lock:
            prev, ACTIVE.session = ACTIVE.session, session
        if isinstance(prev, Closer) and prev.tracer is not None:
            session.pending_detach, prev.tracer = prev.tracer, None
        return status

    @staticmethod
    def _arm_trace(settings: wire.Attach, status: dict):
        if not settings.trace:
            status["trace"] = "off"
            return None
        try:
            from decodemon.probes.tracer import WindowTracer  # noqa: PLC0415 - cupti only when a monitor attaches

            tracer = WindowTracer()  # its first window keeps a guard token (policy.guard_for_window)
        except Exception as exc:
            status.update(trace="unavailable", trace_reason="error", trace_error=f"{type(exc).__name__}: {exc}")
            return None
        status.update(trace="armed", window_tokens=int(settings.window_tokens),
                      window_period_s=float(settings.window_period_s))
        return tracer

    def tear_down(self, conn: socket.socket, session, reason: str) -> None:
        """Disarm: PM released first, then CUPTI left at the decode thread's next boundary, and the monitor told
        why."""
        if session is not None and session.pm is not None:
            # before the decode thread's finalize: a PM session that a CUPTI finalize takes down cannot be
            # disabled cleanly, and its counters can stay held for the next attach (pm_config.release)
            pm, session.pm = session.pm, None
            release_pm(pm)
        keep_hooks = False
        if session is not None:
            # The decode thread disarms at its next boundary (a safe point for CUPTI);
            # if the loop is stalled or gone, the agent does it after 1 s.
            session.closing = True
            if not session.done.wait(1.0):
                session.finish(at_boundary=False)
                closer = ACTIVE.session
                if isinstance(closer, Closer) and closer.token_range:
                    # its boundary is the token range's next close, which only the wrapped range calls see:
                    # the Closer takes the adapters out once it has left CUPTI
                    closer.detach_hooks = keep_hooks = True
            session.release()
        if not keep_hooks:
            hooks.detach()  # the engine's own functions back, before the monitor hears the attach is over
        held.send_all(conn, wire.pack(wire.Bye(reason=reason)), 1.0)  # the socket may be non-blocking by now
        conn.close()
        self.busy_with = None
