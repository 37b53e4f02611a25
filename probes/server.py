"""The agent's socket server and the attach lifecycle: accept, check the peer, hello, arm, serve, disarm.

One daemon thread blocks in `accept()` on a Unix socket in a per-user 0700 directory. A monitor of the same uid
is served on a thread of its own, one monitor at a time; anyone else is refused or told who is attached.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

from decodemon.probes import hooks, held, wire
from decodemon.probes.attach_loop import AttachLoop
from decodemon.probes.device import Unavailable, cuda_device_index, cupti_version, gpu_info
from decodemon.probes.eventlog import EventLog
from decodemon.probes.facts import PROCESS
from decodemon.probes.pm_arm import arm_pm, release_pm
from decodemon.probes.session import ACTIVE, Closer, Session
from decodemon.probes.wire import socket_dir, socket_path


def ensure_dir(d: Path) -> None:
    """Make the socket directory ours and private (0700), or refuse one that belongs to someone else."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(f"{d} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)


def clean_stale_sockets(d: Path | None = None) -> list[int]:
    """Remove sockets whose process is gone; return their pids."""
    d = d or socket_dir()
    gone = []
    if not d.is_dir():
        return gone
    for p in d.glob("*.sock"):
        try:
            pid = int(p.stem)
        except ValueError:
            continue
        if not Path(f"/proc/{pid}").exists():
            try:
                p.unlink()
                gone.append(pid)
            except OSError:
                pass
    return gone


def hello(settings: dict) -> wire.Hello:
    """The agent's first frame: the process, the device (read once per process and device) and the model."""
    gpu, why = None, ""
    try:
        # the device's facts do not change, and reading them (cuInit, the device queries, pynvml's import and
        # nvmlInit) would otherwise be agent-thread work at every attach's start
        idx = cuda_device_index()
        gpu = PROCESS.gpu.get(idx) or PROCESS.gpu.setdefault(idx, gpu_info(idx))
    except Unavailable as exc:
        why = str(exc)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
    return wire.Hello(
        wire_version=wire.WIRE_VERSION, pid=os.getpid(), argv=list(sys.argv),
        python=sys.version.split()[0], hostname=socket.gethostname(), gpu=gpu,
        gpu_unavailable=why, cupti_version=cupti_version(), model=PROCESS.model, settings=settings,
    )


class Agent:
    """The listening socket and its accept thread; `serve` runs one attach."""

    def __init__(self) -> None:
        clean_stale_sockets()
        ensure_dir(socket_dir())
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
        if peer_uid != os.getuid():
            conn.close()
            return
        if self.busy_with is not None:
            # read the newcomer's attach first, so closing does not reset the connection under our answer
            conn.settimeout(1.0)
            try:
                conn.recv(4096)
            except OSError:
                pass
            conn.sendall(wire.pack(wire.Bye(
                reason=f"busy: monitor pid {self.busy_with} is attached; one monitor at a time")))
            conn.shutdown(socket.SHUT_WR)
            conn.close()
            return
        self.busy_with = peer_pid
        threading.Thread(target=self.serve, args=(conn,), name="decodemon-session", daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        """One attach, from the monitor's Attach to our Bye."""
        res: dict = {"session": None, "sidecar": None}
        reason = "detached"
        held.name_this_thread("dm-session")  # the attach's thread: ticks, pumps, window collects
        try:
            conn.settimeout(5.0)
            reader = wire.StreamReader(max_frame=64 * 1024)
            msgs: list = []
            while not msgs:
                data = conn.recv(4096)
                if not data:
                    return
                msgs = reader.feed(data)
            first = wire.decode_control(msgs[0])
            if not isinstance(first, wire.Attach):
                return
            with held.GilPolite():
                status = self.set_up(conn, first, res)
            conn.sendall(wire.pack(wire.ProbeStatus(**status)))
            ev = EventLog.from_env()
            try:
                reason = AttachLoop(conn, reader, res["session"], res["sidecar"], status, ev,
                                    hello_frame=res.get("hello")).run()
            finally:
                if ev is not None:
                    ev.write()
        except (OSError, wire.WireError) as exc:
            reason = f"connection lost ({type(exc).__name__})"
        finally:
            self.tear_down(conn, res["session"], res["sidecar"], reason)

    def set_up(self, conn: socket.socket, settings: wire.Attach, res: dict) -> dict:
        """Hello, tracer, PM and sidecar for one attach, then arm the session; the status fields to send first."""
        hooks.attach()  # engine adapters first: the model facts they report travel in the hello
        h = hello({k: float(getattr(settings, k)) for k in
                   ("window_period_s", "window_tokens", "pm_interval_us", "nvml_hz")})
        conn.sendall(wire.pack(h))
        res["hello"] = h
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
            tracer = self._arm_trace(settings, status)
            pm_mode = os.environ.get("DECODEMON_PM", "inproc")
            if not settings.pm:
                status["pm"] = "off"
            elif pm_mode == "inproc":
                pm = arm_pm(settings, status)
            elif pm_mode == "sidecar":
                status["pm_where"] = "sidecar"  # the sidecar's own status says armed or why not
            else:
                status.update(pm="off", pm_reason="env", pm_error=f"DECODEMON_PM={pm_mode}")
            res["sidecar"] = self._start_sidecar(settings, status, pm_mode)
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

    @staticmethod
    def _start_sidecar(settings: wire.Attach, status: dict, pm_mode: str):
        cmd = [sys.executable, "-m", "decodemon.probes.sidecar", "--device", str(cuda_device_index()),
               "--pm-interval-us", str(settings.pm_interval_us), "--nvml-hz", str(settings.nvml_hz)]
        if not settings.pm or pm_mode != "sidecar":
            cmd.append("--no-pm")
        env = {k: v for k, v in os.environ.items() if k != "DECODEMON_AGENT"}
        try:
            return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    close_fds=True, env=env)
        except OSError as exc:
            status.update(nvml="unavailable", nvml_reason="error", nvml_error=f"sidecar: {exc}")
            if pm_mode == "sidecar":
                status.update(pm="unavailable", pm_reason="error", pm_error=f"sidecar: {exc}")
            return None

    def tear_down(self, conn: socket.socket, session, sidecar, reason: str) -> None:
        """Disarm: PM released first, then CUPTI left at the decode thread's next boundary, the sidecar stopped,
        and the monitor told why."""
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
        if sidecar is not None:
            try:
                sidecar.stdin.close()
                sidecar.wait(timeout=3)
            except Exception:
                sidecar.kill()
        held.send_all(conn, wire.pack(wire.Bye(reason=reason)), 1.0)  # the socket may be non-blocking by now
        conn.close()
        self.busy_with = None
