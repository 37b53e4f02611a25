"""The agent's socket server and the attach lifecycle: accept, check the peer, hello, arm, serve, disarm.

The socket lives in a per-user 0700 directory held by fd (probes/wire_socket.socket_home). One daemon thread,
the door, accepts and reads each newcomer's Attach without blocking on any of them: a connection that has not
sent its Attach whole within HANDSHAKE_S is dropped (told so), and past MAX_PENDING at once the oldest is. The
monitor slot is apart from that queue: a whole Attach is served on a thread of its own, one monitor at a time;
anyone else is refused or told who is attached.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import sys
import threading
import time

from decodemon.probes import frames, held, hooks
from decodemon.probes.attach_loop import AttachLoop
from decodemon.probes.device import Unavailable, cuda_device_index, cupti_version, gpu_info
from decodemon.probes.eventlog import EventLog
from decodemon.probes.facts import PROCESS
from decodemon.probes.session import ACTIVE, Closer, Session
from decodemon.probes.wire_socket import (  # noqa: F401 - ensure_dir, clean_stale_sockets: the agent's API
    StreamReader, clean_stale_sockets, ensure_dir, open_own_dir, socket_home)

HANDSHAKE_S = 2.0  # a newcomer's whole Attach within this, or it is dropped (a monitor sends it on connecting)
MAX_PENDING = 64  # newcomers still sending their Attach, at once; past it the oldest is dropped
def hello(settings: dict, nvml: bool = False, lease_s: float = 0.0) -> frames.Hello:
    """The agent's first frame: the process, the device (read once per process and device), the model, and how
    long the monitor may stay silent. The device's NVML facts (peak bandwidth, driver version) are the monitor's
    to add (device.nvml_facts), unless `nvml`: this process then loads NVML itself."""
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
    return frames.Hello(
        wire_version=frames.WIRE_VERSION, pid=os.getpid(), argv=list(sys.argv),
        python=sys.version.split()[0], hostname=socket.gethostname(), gpu=gpu,
        gpu_unavailable=why, cupti_version=cupti_version(), model=PROCESS.model, settings=settings, lease_s=lease_s,
        tokens_shipped=PROCESS.tokens_shipped, marked_s=PROCESS.marked_ns / 1e9,
        attaches_marked=PROCESS.attaches_marked,
    )


class _Newcomer:
    """A connection whose Attach is still being read by the door."""

    __slots__ = ("conn", "peer_pid", "reader", "deadline")

    def __init__(self, conn: socket.socket, peer_pid: int) -> None:
        self.conn, self.peer_pid = conn, peer_pid
        self.reader = StreamReader(max_frame=frames.MAX_CONTROL_BYTES)
        self.deadline = time.monotonic() + HANDSHAKE_S


class Agent:
    """The listening socket and its door thread; `serve` runs one attach."""

    def __init__(self) -> None:
        self.home = socket_home()
        self.sock, self.path = self.home.sock, self.home.path
        self.busy_with: int | None = None
        self.claimed_at = 0.0  # when busy_with took the slot: its last word until its attach's loop runs
        self.yields = False  # the attached monitor steps aside for one that does not (Attach.yields)
        self.loop: AttachLoop | None = None
        self._claim_lock = threading.Lock()
        self._claimers = threading.BoundedSemaphore(2)  # newcomers waiting for a yielding monitor to step aside
        self.thread = threading.Thread(target=self._door, name="decodemon-agent", daemon=True)
        self.thread.start()

    def shutdown(self) -> None:
        """At exit: disarm the session (its next boundary leaves CUPTI) and remove the socket. A window already
        closed whose CUPTI waits for the agent's finalize (or for a boundary that will not come) is finalized here,
        on the exiting thread, once any finalize under way has ended."""
        s = ACTIVE.session
        ACTIVE.session = None
        if s is not None:
            s.closing = True
            for tr in {id(t): t for t in (getattr(s, "tracer", None), getattr(s, "pending_detach", None))
                       if t is not None}.values():
                if getattr(tr, "initialised", False) and not getattr(tr, "active", False):
                    try:
                        tr.detach()  # under the tracer's lock: after the agent's, never beside it
                    except Exception:
                        pass
        self.home.close()

    def _door(self) -> None:
        """Accept newcomers and read their Attach, none of them able to hold up the others or the slot."""
        held.name_this_thread("dm-agent")
        sel = selectors.DefaultSelector()
        pending: dict[int, _Newcomer] = {}  # by fd, oldest first
        try:
            self.sock.setblocking(False)
            sel.register(self.sock, selectors.EVENT_READ)
        except (OSError, ValueError):
            return
        try:
            while True:
                now = time.monotonic()
                for fd, n in list(pending.items()):
                    if n.deadline <= now:
                        self._drop(sel, pending, fd, f"dropped: no whole Attach within {HANDSHAKE_S:g} s")
                wait = min((n.deadline for n in pending.values()), default=now + 60.0) - now
                try:
                    events = sel.select(max(wait, 0.0))
                except (OSError, ValueError):
                    return
                for key, _ in events:
                    if key.fileobj is self.sock:
                        if not self._accept_all(sel, pending):
                            return
                    else:
                        self._read(sel, pending, key.fd)
        finally:
            for fd in list(pending):
                self._drop(sel, pending, fd, None)
            sel.close()

    def _accept_all(self, sel, pending: dict[int, _Newcomer]) -> bool:
        """Take every connection waiting; False once the listening socket is closed."""
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return True
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:
                    continue
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.1)  # out of fds or memory: the queue waits, rather than a busy loop on it
                    return True
                return False
            try:
                cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
                peer_pid, peer_uid, _ = struct.unpack("3i", cred)
                conn.setblocking(False)
            except OSError:
                conn.close()
                continue
            if peer_uid not in (os.getuid(), 0):  # this process's user, or root (who may watch any process)
                conn.close()
                continue
            if len(pending) >= MAX_PENDING:  # a flood: the oldest goes, so a monitor that just came is read
                self._drop(sel, pending, next(iter(pending)), "dropped: too many connections at once")
            fd = conn.fileno()
            pending[fd] = _Newcomer(conn, peer_pid)
            sel.register(conn, selectors.EVENT_READ)
            self._read(sel, pending, fd)  # a monitor's Attach is usually there already

    def _read(self, sel, pending: dict[int, _Newcomer], fd: int) -> None:
        n = pending.get(fd)
        if n is None:
            return
        try:
            data = n.conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        try:
            msgs = n.reader.feed(data) if data else None
        except frames.WireError as exc:
            self._drop(sel, pending, fd, f"refused: {exc}")
            return
        if msgs is None:  # it left before a whole Attach
            self._drop(sel, pending, fd, None)
            return
        if not msgs:
            return
        sel.unregister(n.conn)
        del pending[fd]
        try:
            first = frames.decode_control(msgs[0])
        except frames.WireError:
            n.conn.close()
            return
        self._admit(n, first)

    @staticmethod
    def _drop(sel, pending: dict[int, _Newcomer], fd: int, reason: str | None) -> None:
        n = pending.pop(fd)
        try:
            sel.unregister(n.conn)
        except (KeyError, ValueError):
            pass
        if reason is not None:
            Agent._bye(n.conn, reason)
        else:
            n.conn.close()

    def _admit(self, n: _Newcomer, first) -> None:
        """A whole first frame: refused, told the slot is taken, or served on a thread of its own."""
        if not isinstance(first, frames.Attach):
            n.conn.close()
            return
        why = frames.attach_problem(first)
        if why is not None:  # nothing armed: the loop runs on as it was
            self._bye(n.conn, f"refused: {why}")
            return
        with self._claim_lock:
            free = self.busy_with is None
            if free:
                self.busy_with, self.yields, self.claimed_at = n.peer_pid, first.yields, time.monotonic()
            waits = not free and self.yields and not first.yields
            busy = "" if free else self._busy()  # under the lock: the holder it names is the one found
        if waits and not self._claimers.acquire(blocking=False):
            waits = False
        if not free and not waits:
            self._bye(n.conn, busy)
            return
        try:
            n.conn.setblocking(True)
            n.conn.settimeout(5.0)
            threading.Thread(target=self.serve, args=(n.conn, n.peer_pid, n.reader, first, not free),
                             name="decodemon-session", daemon=True).start()
        except (OSError, RuntimeError) as exc:  # no thread to be had: the slot is given back, and the monitor told
            if free:
                self.busy_with = None
            else:
                self._claimers.release()
            self._bye(n.conn, f"refused: the agent cannot serve a monitor now ({type(exc).__name__}: {exc})")

    def _claim(self, peer_pid: int, settings: frames.Attach) -> bool:
        """Make `peer_pid` the attached monitor. A monitor that yields (the exporter) steps aside for one that
        does not: its loop ends with a Bye that says so, and the newcomer is served once it has left (≤ 3 s)."""
        deadline = time.monotonic() + 3.0
        while True:
            with self._claim_lock:
                if self.busy_with is None:
                    self.busy_with, self.yields, self.claimed_at = peer_pid, settings.yields, time.monotonic()
                    return True
                if not self.yields or settings.yields:
                    return False
                if self.loop is not None:
                    self.loop.step_aside = f"stepped aside for monitor pid {peer_pid}"
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def _busy(self) -> str:
        """Who holds the slot, and how long since it was last heard from (the lease drops one silent too long)."""
        holder, loop = self.busy_with, self.loop
        heard = loop.heard if loop is not None else self.claimed_at
        return (f"busy: monitor pid {holder} is attached (last heard {max(0.0, time.monotonic() - heard):.1f} s ago); "
                "one monitor at a time")

    @staticmethod
    def _bye(conn: socket.socket, reason: str) -> None:
        """Say why, and close (for a monitor that was never served). Never waits long on a peer that reads
        nothing: a Bye fits in the socket's buffer, and a full one is closed unanswered."""
        try:
            conn.settimeout(0.2)
            conn.sendall(frames.pack(frames.Bye(reason=reason)))
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            conn.close()

    def serve(self, conn: socket.socket, peer_pid: int, reader, first: frames.Attach, claim: bool = False) -> None:
        """One attach, from the monitor's Attach (read by the door) to our Bye; `claim`: the slot is to be
        waited for (a yielding monitor is stepping aside)."""
        if claim:
            try:
                claimed = self._claim(peer_pid, first)
            finally:
                self._claimers.release()
            if not claimed:
                self._bye(conn, self._busy())
                return
        self._serve_claimed(conn, reader, first)

    def _serve_claimed(self, conn: socket.socket, reader, first: frames.Attach) -> None:
        res: dict = {"session": None}
        reason = "detached"
        held.name_this_thread("dm-session")  # the attach's thread: ticks, pumps, window collects
        try:
            ev = EventLog.from_env()
            with held.GilPolite():
                status = self.set_up(conn, first, res, ev)
            conn.sendall(frames.pack(frames.ProbeStatus(**status)))
            try:
                self.loop = AttachLoop(conn, reader, res["session"], status, ev, hello_frame=res.get("hello"))
                reason = self.loop.run()
            finally:
                if ev is not None:
                    ev.write()
        except (OSError, frames.WireError) as exc:
            reason = f"connection lost ({type(exc).__name__})"
        finally:
            self.loop = None
            self.tear_down(conn, res["session"], reason)

    def set_up(self, conn: socket.socket, settings: frames.Attach, res: dict, ev=None) -> dict:
        """Hello and tracer for one attach, then arm the session; the status fields
        to send first. `ev` (the agent's event log, when one is kept) gets each step's ns."""
        t0 = time.time_ns()
        hooks.attach()  # engine adapters first: the model facts they report travel in the hello
        h = hello({k: float(getattr(settings, k)) for k in
                   ("window_period_s", "window_tokens", "pm_interval_us", "nvml_hz")},
                  lease_s=frames.lease_s(settings.agent_tick_s))
        conn.sendall(frames.pack(h))
        res["hello"] = h
        if ev is not None:
            ev.add("hello", time.time_ns() - t0)
        held.ENABLED = settings.hold_gil  # before the loop's first call (an A/B run's attaches set it both ways)
        status: dict = {"token_clock": "armed"}
        if settings.token_range:
            status["token_range"] = settings.token_range
        tracer = None
        if h.gpu is None:
            status.update(gpu="unavailable", gpu_error=h.gpu_unavailable, trace="unavailable", trace_reason="no_gpu",
                          pm="unavailable", pm_reason="no_gpu", nvml="unavailable", nvml_reason="no_gpu")
        else:
            status["gpu"] = "ok"
            t0 = time.time_ns()
            tracer = self._arm_trace(settings, status)
            if ev is not None:
                ev.add("tracer", time.time_ns() - t0)
            # NVML and PM are read by the monitor's sidecar, in decodemon's own process (monitor/counters/sidecar.py):
            # this process starts no child and loads no counter library
        session = res["session"] = Session(settings, tracer)
        with ACTIVE.lock:
            prev, ACTIVE.session = ACTIVE.session, session
        if isinstance(prev, Closer) and prev.tracer is not None:
            session.pending_detach, prev.tracer = prev.tracer, None
        return status

    @staticmethod
    def _arm_trace(settings: frames.Attach, status: dict):
        """The tracer of this attach: decodemon's CUPTI library, from the Attach's bytes, loaded with the GIL given
        up (native_tracer.load); None, with the reason in `status`, where there is none."""
        if not settings.trace:
            status["trace"] = "off"
            return None
        if not settings.cupti_library:
            status.update(trace="unavailable", trace_reason="no_library",
                          trace_error="the monitor sent no CUPTI library")
            return None
        from decodemon.probes import native_tracer  # noqa: PLC0415 - ctypes only when a monitor asks for windows

        try:
            tracer = native_tracer.NativeTracer(native_tracer.load(settings.cupti_library))
        except native_tracer.LibraryError as exc:  # its libcupti not found from this process, say
            status.update(trace="unavailable", trace_reason="library", trace_error=str(exc))
            return None
        except Exception as exc:
            status.update(trace="unavailable", trace_reason="error", trace_error=f"{type(exc).__name__}: {exc}")
            return None
        # its first window keeps a guard token (policy.guard_for_window)
        status.update(trace="armed", window_tokens=int(settings.window_tokens),
                      window_period_s=float(settings.window_period_s))
        return tracer

    def tear_down(self, conn: socket.socket, session, reason: str) -> None:
        """Disarm: CUPTI left at the decode thread's next boundary, and the monitor told why."""
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
        self.busy_with = None  # free before the Bye: a monitor that attaches again once it hears it is served
        held.send_all(conn, frames.pack(frames.Bye(reason=reason)), 1.0)  # the socket may be non-blocking by now
        conn.close()
