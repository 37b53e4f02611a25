"""Sources of frames: a live agent over its Unix socket, or a `.dmon` recording.

Both yield `(rx_ns, payload, frame)` so everything downstream (recording,
analysis, the app) reads one stream shape.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import msgspec
from typing import Iterator

from decodemon.probes import wire, wire_file

HOW_TO_ATTACH = ("start it with `decodemon run -- CMD ...`, or set DECODEMON_AGENT=1 and call "
                 "decodemon.probes.agent.start_from_env(), or add `import decodemon.probes.autostart`")


DETACH_WAIT_S = 5.0


class SourceError(RuntimeError):
    """A source that cannot be read; str() is one line for the user."""


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
    from decodemon.monitor import agent_socket

    owner = agent_socket.target_uid(pid)
    if owner is None:
        raise SourceError(f"no process with pid {pid}")
    if owner != os.getuid() and os.geteuid() != 0:
        raise SourceError(f"pid {pid} belongs to uid {owner}; decodemon attaches only to your own processes "
                          "(or, as root, to any)")
    from decodemon.monitor import outside

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
        from decodemon.monitor.inject import InjectError, inject as load_agent

        try:
            return load_agent(pid)
        except InjectError as exc:
            if not _looks_python(pid):
                exc = f"{exc}, and {outside.gpu_of(pid)[1]}"
            raise SourceError(f"pid {pid} has no decodemon agent listening and it cannot be loaded ({exc}); "
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


def live_frames(pid: int, settings: wire.Attach | None = None, seconds: float | None = None,
                stop=None, inject: bool = True) -> Iterator[tuple[int, bytes, object]]:
    """Attach to `pid`, yield frames until `seconds` pass, `stop()` is true, or the target ends; then detach.
    `inject`: load the agent into a Python target that has none (else SourceError says it has none).

    llama-server, and any CUDA program with no Python, are watched from outside (monitor/outside.py)."""
    path = check_pid(pid, inject=inject)
    if path is None:
        from decodemon.monitor import outside

        yield from outside.frames(pid, seconds, stop, settings)
        return
    from decodemon.monitor import agent_socket

    try:
        sock = agent_socket.connect(pid, path)
    except agent_socket.Refused as exc:
        raise SourceError(str(exc)) from None
    except OSError as exc:
        raise SourceError(f"cannot connect to the agent of pid {pid}: {exc.strerror or exc}") from None
    t0 = time.monotonic_ns()
    deadline = None if seconds is None else time.monotonic() + seconds
    reader = wire.StreamReader()
    detached = None  # when the detach was sent
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
                detached = _detach(sock, heart)
            if sidecar is not None:
                for payload, frame in sidecar.take():
                    yield time.monotonic_ns() - t0, payload, frame
                if sidecar.ended:
                    sidecar.close()
                    lost, sidecar = sidecar.lost(), None
                    yield time.monotonic_ns() - t0, b"", lost
            try:
                data = sock.recv(1 << 20)
            except socket.timeout:
                if detached is not None and time.monotonic() - detached > DETACH_WAIT_S:
                    # a target that holds its GIL (or is stopped) cannot answer; do not wait with it
                    yield (time.monotonic_ns() - t0, b"",
                           wire.Bye(reason=f"pid {pid} did not answer the detach within {DETACH_WAIT_S:g} s"))
                    return
                continue
            if not data:
                if detached is None:
                    yield time.monotonic_ns() - t0, b"", wire.Bye(reason=_closed(pid, answered))
                return
            rx = time.monotonic_ns() - t0
            for payload in reader.feed(data):
                answered = True
                heart.beat()  # between frames too: a consumer may take a while over each
                frame = wire.decode_frame(payload)
                if isinstance(frame, wire.Hello):
                    heart.start(frame)
                    frame, payload = _with_monitors_facts(frame, payload, pid)
                elif library_error and isinstance(frame, wire.ProbeStatus) and frame.trace_reason == "no_library":
                    frame = msgspec.structs.replace(frame, trace_error=library_error)
                    payload = wire.encode(frame)
                yield rx, payload, frame
                if isinstance(frame, wire.Bye):
                    return
                if isinstance(frame, wire.Hello) and sidecar is None and detached is None:
                    sidecar, status = _start_sidecar(frame, pid, settings)
                    if status is not None:
                        yield rx, wire.encode(status), status
    except (ConnectionResetError, BrokenPipeError):
        yield time.monotonic_ns() - t0, b"", wire.Bye(reason=_closed(pid, answered))
    finally:
        sock.close()
        if sidecar is not None:
            sidecar.close()


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


def with_copy_gbs(gpu: wire.GpuInfo) -> wire.GpuInfo:
    """`gpu` with decodemon's measured copy bandwidth from the cache, where one was measured for this device and
    driver: every live source's hello carries it, so the app, the exporter, `attach --json`, `record` and the sweep
    price one floor."""
    import msgspec

    from decodemon.monitor.counters.bandwidth import measured_copy_gbs

    if gpu.copy_gbs:
        return gpu
    gbs = measured_copy_gbs(gpu)
    return msgspec.structs.replace(gpu, copy_gbs=float(gbs)) if gbs else gpu


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


def recording_frames(path) -> Iterator[tuple[int, bytes, object]]:
    """Yield the frames of a recording (header included), as a live source would. A recording cut short (its
    writer killed, its disk full) plays the whole frames before the cut, then ends as a live source that went
    away does: with a Bye that says so."""
    rx = 0
    try:
        for rx, frame in wire.read_recording(path):
            yield rx, b"", frame
    except wire_file.Truncated as exc:
        if exc.whole_frames < 2:  # the header alone, or not even that: nothing to play
            raise SourceError(str(exc) if str(path) in str(exc) else f"{path}: {exc}") from None
        yield rx, b"", wire.Bye(reason=f"the recording is cut short after {exc.whole_frames - 1} whole frames")
    except wire.WireError as exc:
        text = str(exc)
        raise SourceError(text if str(path) in text else f"{path}: {text}") from None
