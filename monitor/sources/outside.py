"""Watching a decode process with no Python in it (llama-server, or any CUDA program) from outside.

No agent can be loaded there, so the monitor makes the frames itself, as an agent would have sent them:

    llama-server ──GET /slots──> StepCounts (each read: decode steps, tokens, requests in progress) ─┐
    PM sidecar on the server's GPU (device-wide counters, NVML) ──────────── PmSamples, NvmlSamples ───┼─> Session
    /proc/PID (alive? the same process?) ──────────────────────────────────────────────────── Bye ────┘

The token clock is the server's own per-slot count of generated tokens (`/slots`, on by default; exact integers,
and reading it resets nothing, unlike /metrics, whose throughput gauges average between scrapes). One decode step
adds a token to each request in it, so the steps between two reads are the largest slot's count, and the tokens
their sum: ms/token and tokens/s are per step, one sequence's rate (as llama-server's own per-request timings and
`predicted_tokens_seconds` count), the bytes a step reads are what the bandwidth floor prices, and the server's
throughput is reported beside them. What stays out of reach from outside is the traced window (launches, grids,
gaps): it needs CUPTI inside the process from its start. A server started with `decodemon run -- llama-server ...`
has decodemon's CUPTI injection library in it (CUDA_INJECTION64_PATH, probes/cupti_inject/), listening where an
agent would; its windows by time come over that socket and go into the same stream (`NativeTrace`):

    injection library in the server ──agent socket──> KernelWindow, ProbeStatus (trace) ──────────────> Session

Any other CUDA program with no Python (a C++ engine, a benchmark) has no token clock to read from outside: it gets
the device-wide view alone (GPU busy, SM active, DRAM bytes a second from PM, NVML), the same sidecar on the GPU
its compute context is on.
"""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.counters.sidecar import Sidecar
from decodemon.probes import wire

READ_S = 0.05  # an interval in which a request ends is left out of the clock: short ones lose little of it
FRAME_S = 0.25  # the reads travel in one frame this often
_TRUE = ("1", "true", "on", "yes", "enabled")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw if "=" in kv)


def _option(argv: list[str], *names: str) -> str | None:
    """The value of the last of `names` in argv (`--port 8080` or `--port=8080`), or None."""
    found = None
    for i, arg in enumerate(argv):
        for n in names:
            if arg == n and i + 1 < len(argv):
                found = argv[i + 1]
            elif arg.startswith(n + "="):
                found = arg.split("=", 1)[1]
    return found


def is_llama_server(pid: int) -> bool:
    """The process runs llama.cpp's server binary."""
    argv = _cmdline(pid)
    return bool(argv) and os.path.basename(argv[0]).startswith("llama-server")


def _start_time(pid: int) -> str:
    """The process's start time (clock ticks since boot) and state, '' if gone: a zombie, or a pid reused by
    another process, is not the server the watch began with."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat[stat.rindex(")") + 2:].split()
    return "" if fields[0] in ("Z", "X") else fields[19]


def endpoint_of(pid: int) -> tuple[str, str]:
    """llama-server's /slots URL and API key ('' if none) from its command line and environment (its LLAMA_ARG_*
    variables), or raise SourceError saying why there is none."""
    argv, env = _cmdline(pid), _environ(pid)
    if "--no-slots" in argv or env.get("LLAMA_ARG_ENDPOINT_SLOTS", "1").lower() not in _TRUE:
        raise SourceError(f"pid {pid} is llama-server with its /slots endpoint off (--no-slots), the token clock "
                          "decodemon reads from outside: start it without --no-slots")
    host = (_option(argv, "--host") or env.get("LLAMA_ARG_HOST") or "127.0.0.1").split(",")[0].strip().strip("[]")
    port = _option(argv, "--port") or env.get("LLAMA_ARG_PORT") or "8080"
    prefix = (_option(argv, "--api-prefix") or env.get("LLAMA_API_PREFIX") or "").rstrip("/")
    key = (_option(argv, "--api-key") or env.get("LLAMA_API_KEY") or "").split(",")[0]
    if host.endswith(".sock"):
        raise SourceError(f"pid {pid} serves on the Unix socket {host}; decodemon reads it over TCP only")
    if not (port.isascii() and port.isdigit()):
        raise SourceError(f"pid {pid}: llama-server's --port {port!r} is not a port decodemon can read")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}{prefix}/slots", key


def read_slots(url: str, key: str = "", timeout_s: float = 2.0) -> list[dict]:
    """One read of /slots, or SourceError with the reason in one line."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:  # noqa: S310 - a URL made from the target's own
            slots = json.loads(r.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        why = {401: ": it wants an API key decodemon did not find on its command line or in its environment",
               404: ": no /slots there (another --api-prefix?)", 501: ": its /slots endpoint is off"}.get(exc.code, "")
        raise SourceError(f"{url} answered HTTP {exc.code}{why}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"cannot read {url}: {getattr(reason, 'strerror', None) or reason}") from None
    if not isinstance(slots, list) or not all(isinstance(s, dict) and "id" in s for s in slots):
        raise SourceError(f"{url} is not llama-server's /slots (a list of slots)")
    return slots


class StepCounter:
    """Decode steps and tokens so far, from successive /slots reads: a slot's `n_decoded` counts its request's
    tokens and starts again with each request (a new task id)."""

    def __init__(self) -> None:
        self.steps = self.tokens = 0
        self._last: dict[int, tuple[int, int, int, bool]] = {}  # slot id -> (task, n_decoded, n_remain, working)
        self._recent = 0  # the largest slot's tokens in the last interval

    def read(self, slots: list[dict]) -> tuple[int, int, int, int, int]:
        """Fold one read in; (steps, tokens, requests decoding, requests that ended since the last read, the KV
        positions the decoding requests hold: their `n_prompt_tokens`, which count prompt and generated tokens).

        A request that ends between two reads made tokens after the first: the slot's count is the next
        request's by the second. If the first read's `n_remain` (its budget left) is as few tokens as an
        interval makes, it ran to its budget and those are its last tokens; otherwise (an end-of-sequence, a stop
        word) they are unknown and the steps under-counted. Either way the interval also holds the reply and the
        next request's prompt, which make no decode step, and the clock leaves it out (`counter_intervals`)."""
        deltas, busy, ended, depth = [], 0, 0, 0
        for s in slots:
            nt = (s.get("next_token") or [{}])[0]
            task, n, left = s.get("id_task", -1), int(nt.get("n_decoded", 0) or 0), int(nt.get("n_remain", -1))
            working = bool(s.get("is_processing"))
            busy += working and n > 0  # decoding: a slot still reading its prompt has no token yet
            if working and n > 0:
                depth += max(int(s.get("n_prompt_tokens", 0) or 0), 0)
            prev = self._last.get(s["id"])
            if prev is not None:
                if prev[0] == task and n >= prev[1]:
                    deltas.append(n - prev[1])
                    ended += prev[3] and not working  # its last tokens came in this interval
                elif prev[1] == 0 or 0 <= prev[2] <= 2 * self._recent + 16:
                    deltas.append(max(prev[2], 0) + n)  # ran to its budget: its last tokens, then the next's
                    ended += 1
                else:
                    deltas.append(n)
                    ended += 1
            self._last[s["id"]] = (task, n, left, working)
        self._recent = max(deltas, default=0)
        self.steps += self._recent
        self.tokens += sum(deltas)
        return self.steps, self.tokens, busy, ended, depth


def _gpus_of(pid: int) -> tuple[int | None, str]:
    """The NVML index of the GPU `pid` has a compute context on (the first, if several), or None and why."""
    try:
        import pynvml

        pynvml.nvmlInit()
        n = pynvml.nvmlDeviceGetCount()
    except Exception as exc:  # noqa: BLE001 - no driver or no NVML: nothing device-wide to read
        return None, f"NVML: {exc}"
    for i in range(n):
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
        except Exception:  # noqa: BLE001 - a device NVML cannot read: look at the others
            continue
        if pid in {p.pid for p in procs}:
            return i, ""
    return None, f"pid {pid} has no compute context on any of the {n} GPUs NVML lists (a CPU build?)"


def _hello(pid: int, nvml: int | None, why: str) -> wire.Hello:
    gpu = None
    if nvml is not None:
        try:
            from decodemon.probes.device import gpu_info

            os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA's device numbers as NVML's
            from decodemon.monitor.counters.bandwidth import with_copy_gbs

            gpu = with_copy_gbs(wire.GpuInfo(**gpu_info(nvml).given()))  # the agent's plain value, as the schema's
        except Exception as exc:  # noqa: BLE001 - no driver in this process: the watch goes on without it
            why = str(exc)
    from decodemon.monitor import gguf

    argv = _cmdline(pid)
    model = gguf.model_facts(pid, None, argv, _environ(pid))  # the GGUF it maps: what a token reads, KV in its type
    return wire.Hello(wire_version=wire.WIRE_VERSION, pid=pid, argv=argv, python="", hostname=socket.gethostname(),
                      gpu=gpu, gpu_unavailable="" if gpu else why, model=model)


def gpu_of(pid: int) -> tuple[int | None, str]:
    """The NVML index of the GPU `pid` has a compute context on, or None and why (public: the attach's check)."""
    return _gpus_of(pid)


def _status(hello: wire.Hello, pm: bool, server: bool = True) -> wire.ProbeStatus:
    common = dict(token_clock="server_metrics" if server else "none", trace="unavailable", trace_reason="no_python")
    if hello.gpu is None:
        return wire.ProbeStatus(**common, gpu="unavailable", gpu_error=hello.gpu_unavailable, pm="unavailable",
                                pm_reason="no_gpu", nvml="unavailable", nvml_reason="no_gpu")
    return wire.ProbeStatus(**common, gpu="ok", **({} if pm else {"pm": "off", "pm_reason": "settings"}))


class NativeTrace:
    """The traced windows of decodemon's CUPTI injection library in the server, when it has one: the Attach sent
    at the start, its KernelWindow and ProbeStatus frames taken between the /slots reads (its Hello and Bye are
    the outside watch's own to make), a Detach at the end. Its socket is found and its peer checked as an
    agent's (monitor/agent_socket.py). Without the library, or when it refuses, `sock` is None and `why` says
    why, for the status."""

    def __init__(self, pid: int, settings: wire.Attach) -> None:
        from decodemon.monitor.sources import agent_socket

        self.sock, self.why, self.ended, self.heart = None, "", False, None
        self.reader = wire.StreamReader()
        path = agent_socket.find(pid)
        if path is None:
            return
        try:
            sock = agent_socket.connect(pid, path)
            sock.sendall(wire.pack(settings))
        except (OSError, agent_socket.Refused) as exc:
            self.why = f"the CUPTI injection library's socket: {exc}"
            return
        sock.setblocking(False)
        self.sock = sock
        self.heart = agent_socket.Heartbeat(sock)  # the library drops a monitor silent past its lease

    def take(self) -> list[tuple[bytes, object]]:
        """What arrived since the last call: (payload, frame) of its windows and statuses."""
        out: list[tuple[bytes, object]] = []
        if self.sock is not None:
            self.heart.beat()
        while self.sock is not None:
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.close(detach=False)
                break
            try:
                payloads = self.reader.feed(data)
            except wire.WireError as exc:
                self.why = f"the CUPTI injection library: {exc}"
                self.close(detach=False)
                break
            for payload in payloads:
                try:
                    frame = wire.decode_frame(payload)
                except wire.WireError:
                    continue
                if isinstance(frame, (wire.KernelWindow, wire.ProbeStatus)):
                    out.append((payload, frame))
                elif isinstance(frame, wire.Hello):
                    self.heart.start(frame)
                elif isinstance(frame, wire.Bye):
                    self.why = f"the CUPTI injection library: {frame.reason}"
        return out

    def close(self, detach: bool = True) -> None:
        """Detach (the library goes back to waiting for a monitor) and close."""
        sock, self.sock = self.sock, None
        if sock is None:
            return
        self.heart.stop()
        try:
            if detach:
                sock.setblocking(True)
                sock.settimeout(1.0)
                sock.sendall(wire.pack(wire.Detach()))
        except OSError:
            pass
        finally:
            sock.close()


def frames(pid: int, seconds: float | None = None, stop=None, settings: wire.Attach | None = None
           ) -> Iterator[tuple[int, bytes, object]]:
    """Watch llama-server `pid` from outside: yield (rx ns, payload, frame) as `live.live_frames` does, until
    `seconds` pass, `stop()` is true, or the process ends."""
    settings = settings or wire.Attach()
    server = is_llama_server(pid)  # else a CUDA program with no clock to read: the device-wide view alone
    url, key = endpoint_of(pid) if server else ("", "")
    born = _start_time(pid)
    counter = StepCounter()
    first = read_slots(url, key) if server else None
    t0 = time.monotonic_ns()
    deadline = None if seconds is None else time.monotonic() + seconds

    def out(frame):
        return time.monotonic_ns() - t0, wire.encode(frame), frame

    rows: list[tuple] = []

    def read(slots) -> None:
        rows.append((time.monotonic_ns(), *counter.read(slots)))

    def counts():
        cols = list(zip(*rows))
        rows.clear()
        f8 = lambda i: wire.Column.of([float(v) for v in cols[i]], "<f8")  # noqa: E731
        return wire.StepCounts(url=url, t_ns=wire.Column.of(list(cols[0])), steps=f8(1), tokens=f8(2),
                                 busy=f8(3), ended=f8(4), server="llama.cpp", depth=f8(5))

    hello = _hello(pid, *_gpus_of(pid))
    yield out(hello)
    yield out(_status(hello, settings.pm, server))
    if server:
        read(first)
    sidecar = Sidecar(hello.gpu, pid, settings) if hello.gpu else None
    # the exporter (a monitor that yields) leaves the library to a user's attach: it serves one monitor at a time
    native = NativeTrace(pid, settings) if settings.trace and not settings.yields else None
    if native is not None and native.why:
        yield out(wire.ProbeStatus(trace="failed", trace_reason="error", trace_error=native.why))
    sent = time.monotonic()
    try:
        while True:
            time.sleep(READ_S)
            if _start_time(pid) != born:
                if rows:
                    yield out(counts())
                yield out(wire.Bye(reason=f"pid {pid} went away"))
                return
            try:
                if server:
                    read(read_slots(url, key))
            except SourceError as exc:
                if _start_time(pid) == born:
                    yield out(wire.ProbeStatus(recent_errors=[str(exc)], errors=1))
            done = (deadline is not None and time.monotonic() >= deadline) or (stop and stop())
            if time.monotonic() - sent < FRAME_S and not done:
                continue
            sent = time.monotonic()
            for payload, frame in (sidecar.take() if sidecar else ()):
                yield time.monotonic_ns() - t0, payload, frame
            for payload, frame in (native.take() if native else ()):
                yield time.monotonic_ns() - t0, payload, frame
            if native is not None and native.sock is None and native.why:
                yield out(wire.ProbeStatus(trace="failed", trace_reason="error", trace_error=native.why))
                native = None
            if sidecar and sidecar.ended:
                lost, sidecar = sidecar.lost(), None
                yield out(lost)
            if rows:
                yield out(counts())
            if done:
                yield out(wire.Bye(reason="detached"))
                return
    finally:
        if sidecar:
            sidecar.close()
        if native:
            native.close()


def servers() -> list[int]:
    """This user's llama-server processes that serve /slots (what `decodemon exporter` watches besides the
    processes with an agent)."""
    out = []
    for d in Path("/proc").iterdir():
        if not (d.name.isascii() and d.name.isdigit()):
            continue
        try:
            if d.stat().st_uid != os.getuid() or not is_llama_server(int(d.name)):
                continue
            endpoint_of(int(d.name))
        except (OSError, SourceError):
            continue
        out.append(int(d.name))
    return sorted(out)
