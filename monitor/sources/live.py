"""A live agent over its Unix socket: the Attach sent (with decodemon's CUPTI library in it), the frames read back
with the monitor's own facts added to the hello, heartbeats, the device-wide counters' sidecar started once the
hello names the GPU, and the detach."""

from __future__ import annotations

import socket
import time
from typing import Iterator

import msgspec

from decodemon.monitor.sources import agent_socket
from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.sources.pids import _closed, check_pid
from decodemon.probes import wire


DETACH_WAIT_S = 5.0


def live_frames(pid: int, settings: wire.Attach | None = None, seconds: float | None = None,
                stop=None, inject: bool = True) -> Iterator[tuple[int, bytes, object]]:
    """Attach to `pid`, yield frames until `seconds` pass, `stop()` is true, or the target ends; then detach.
    `inject`: load the agent into a Python target that has none (else SourceError says it has none).

    llama-server, and any CUDA program with no Python, are watched from outside (monitor/outside.py)."""
    path = check_pid(pid, inject=inject)
    if path is None:
        from decodemon.monitor.sources import outside

        yield from outside.frames(pid, seconds, stop, settings)
        return
    sock = _connect(pid, path)
    t0 = time.monotonic_ns()
    deadline = None if seconds is None else time.monotonic() + seconds
    reader = wire.StreamReader()
    detached = None  # when the detach was sent
    # what arrives after the detach (the marks the agent still held, its Bye) tells of the seconds before it: its
    # receive time is the detach's, so an attach of `seconds` covers that many, not the agent's wait for a boundary
    detach_rx = None

    def now_rx() -> int:
        n = time.monotonic_ns() - t0
        return n if detach_rx is None else min(n, detach_rx)
    settings, library_error = _with_library(settings or wire.Attach())
    sidecar = None  # the device-wide counters' process (monitor/counters/sidecar.py), started once the hello names the GPU
    answered = False
    heart = agent_socket.Heartbeat(sock)  # the agent drops a monitor silent past its lease (Hello.lease_s)
    try:
        sock.sendall(wire.pack(settings))  # under connect's timeout
        sock.settimeout(0.1)
        while True:
            heart.beat()
            if detached is None and ((deadline is not None and time.monotonic() >= deadline) or (stop and stop())):
                detach_rx = time.monotonic_ns() - t0
                detached = _detach(sock, heart)
            if sidecar is not None:
                for payload, frame in sidecar.take():
                    yield now_rx(), payload, frame
                if sidecar.ended:
                    sidecar.close()
                    lost, sidecar = sidecar.lost(), None
                    yield now_rx(), b"", lost
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                if detached is not None and time.monotonic() - detached > DETACH_WAIT_S:
                    # a target that holds its GIL (or is stopped) cannot answer; do not wait with it
                    yield (now_rx(), b"",
                           wire.Bye(reason=f"pid {pid} did not answer the detach within {DETACH_WAIT_S:g} s"))
                    return
                continue
            if not data:
                if detached is None:
                    yield now_rx(), b"", wire.Bye(reason=_closed(pid, answered))
                return
            rx = now_rx()
            for payload in reader.feed(data):
                answered = True
                heart.beat()  # between frames too: a consumer may take a while over each
                frame, payload = _as_read(payload, pid, library_error)
                if isinstance(frame, wire.Hello):
                    heart.start(frame)
                yield rx, payload, frame
                if isinstance(frame, wire.Bye):
                    return
                if isinstance(frame, wire.Hello) and sidecar is None and detached is None:
                    sidecar, status = _start_sidecar(frame, pid, settings)
                    if status is not None:
                        yield rx, wire.encode(status), status
    except (ConnectionResetError, BrokenPipeError):
        yield now_rx(), b"", wire.Bye(reason=_closed(pid, answered))
    finally:
        sock.close()
        if sidecar is not None:
            sidecar.close()


def _connect(pid: int, path):
    """The agent's socket, connected and its peer checked; SourceError in one line otherwise."""
    try:
        return agent_socket.connect(pid, path)
    except agent_socket.Refused as exc:
        raise SourceError(str(exc)) from None
    except OSError as exc:
        raise SourceError(f"cannot connect to the agent of pid {pid}: {exc.strerror or exc}") from None


def _as_read(payload: bytes, pid: int, library_error: str) -> tuple[object, bytes]:
    """One frame from the agent, and its payload, with what this process adds: its own facts in the hello, and
    why it sent no CUPTI library in a status that says the agent had none."""
    frame = wire.decode_frame(payload)
    if isinstance(frame, wire.Hello):
        frame, payload = _with_monitors_facts(frame, payload, pid)
    elif library_error and isinstance(frame, wire.ProbeStatus) and frame.trace_reason == "no_library":
        frame = msgspec.structs.replace(frame, trace_error=library_error)
        payload = wire.encode(frame)
    return frame, payload


def _with_library(settings: wire.Attach) -> tuple[wire.Attach, str]:
    """The Attach with decodemon's CUPTI library in it where windows are asked for (the agent traces with it and
    loads nothing of the target's), and why it is not there ("" when it is or none is asked for)."""
    if not settings.trace or settings.cupti_library:
        return settings, ""
    from decodemon.monitor.inject import cupti_lib

    image, why = cupti_lib.image()
    if not image:
        return settings, f"decodemon could not build its CUPTI library: {why}"
    return msgspec.structs.replace(settings, cupti_library=image), ""


def _detach(sock: socket.socket, heart) -> float:
    """Send the Detach, and no more heartbeats; when it was sent (a target that reads nothing gets 2 s of it)."""
    heart.stop()
    sock.settimeout(2.0)
    try:
        sock.sendall(wire.pack(wire.Detach()))
    except socket.timeout:
        pass
    sock.settimeout(0.5)
    return time.monotonic()


def _with_monitors_facts(hello: wire.Hello, payload: bytes, pid: int) -> tuple[wire.Hello, bytes]:
    """The agent's hello with what this process reads itself (the target loads none of it), re-encoded: the NVML
    facts of its GPU, and a llama.cpp model's bytes a token reads, from the GGUF file the target maps."""
    import msgspec

    from decodemon.monitor import gguf
    from decodemon.monitor.counters.bandwidth import with_copy_gbs
    from decodemon.probes.device import nvml_facts

    changes = {}
    if hello.gpu is not None:
        changes["gpu"] = with_copy_gbs(nvml_facts(hello.gpu) if not hello.gpu.mem_bandwidth_gbs else hello.gpu)
    if hello.model is not None and not hello.model.weight_bytes_total:
        model = gguf.model_facts(pid, hello.model)
        if model is not None:
            changes["model"] = model
    if not changes or all(getattr(hello, k) == v for k, v in changes.items()):
        return hello, payload
    hello = msgspec.structs.replace(hello, **changes)
    return hello, wire.encode(hello)


def _start_sidecar(hello: wire.Hello, pid: int, settings: wire.Attach):
    """The device-wide counters' sidecar for an agent's hello (None where there is no GPU): NVML always, PM too
    unless PM is off; and the status to add, or None."""
    if hello.gpu is None:
        return None, None
    from decodemon.monitor.counters.sidecar import Sidecar

    pm_here = settings.pm
    if not pm_here and not settings.nvml_hz:  # nothing asked of it (a sweep's point: the token clock only)
        return None, (wire.ProbeStatus(pm="off") if not settings.pm else None)
    try:
        side = Sidecar(hello.gpu, pid, settings, pm=pm_here)
    except OSError as exc:
        return None, wire.ProbeStatus(nvml="unavailable", nvml_reason="error", nvml_error=f"sidecar: {exc}",
                                      **({} if not pm_here else dict(pm="unavailable", pm_reason="error",
                                                                       pm_error=f"sidecar: {exc}")))
    return side, (wire.ProbeStatus(pm="off") if not settings.pm else None)
