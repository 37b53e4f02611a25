"""Watching a decode process with no Python in it (llama-server) from outside.

No agent can be loaded there, so the monitor makes the frames itself, as an agent would have sent them:

    llama-server --metrics ──/metrics──> ServerCounts (each scrape: decode steps, tokens, requests) ─┐
    PM sidecar (device-wide counters, NVML) ────────────────────────────── PmSamples, NvmlSamples ───┼─> Session
    /proc/PID (alive?) ──────────────────────────────────────────────────────────────────── Bye ─────┘

The token clock is the server's own decode-step counter: a step makes one token for each request in it, the
same per-step figures a traced loop gets. What stays out of reach from outside is the traced window (launches,
grids, gaps): it needs CUPTI inside the process from its start (`CUDA_INJECTION64_PATH`).

Scraping llama-server's /metrics also restarts the averaging of its two throughput gauges (they average over
the time between two scrapes, whoever scrapes); its counters are not touched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

from decodemon.monitor.client import SourceError
from decodemon.probes import wire

SCRAPE_S = 0.25
# llama-server's names: the step counter is the clock; tokens and requests in progress come with it
LLAMA_CPP = {"steps": "llamacpp:n_decode_total", "tokens": "llamacpp:tokens_predicted_total",
             "busy": "llamacpp:requests_processing"}


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


def servers() -> list[int]:
    """This user's llama-server processes that serve their metrics (what `decodemon exporter` watches besides the
    processes with an agent)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if d.stat().st_uid != os.getuid() or not is_llama_server(int(d.name)):
                continue
            endpoint_of(int(d.name))
        except (OSError, SourceError):
            continue
        out.append(int(d.name))
    return sorted(out)


def endpoint_of(pid: int) -> str:
    """llama-server's metrics URL from its command line and environment (its LLAMA_ARG_* variables), or raise
    SourceError saying why there is none."""
    argv, env = _cmdline(pid), _environ(pid)
    metrics = "--metrics" in argv or env.get("LLAMA_ARG_ENDPOINT_METRICS", "").lower() in ("1", "true", "on")
    if not metrics:
        raise SourceError(f"pid {pid} is llama-server without its metrics endpoint, the token clock decodemon "
                          "reads from outside: start it with --metrics (or LLAMA_ARG_ENDPOINT_METRICS=1)")
    host = _option(argv, "--host") or env.get("LLAMA_ARG_HOST") or "127.0.0.1"
    port = _option(argv, "--port") or env.get("LLAMA_ARG_PORT") or "8080"
    if host.endswith(".sock"):
        raise SourceError(f"pid {pid} serves on the Unix socket {host}; decodemon reads metrics over TCP only")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition → {name: value} for unlabelled samples (comments and labelled series
    skipped)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        parts = line.split()
        if len(parts) >= 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                continue
    return out


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, float]:
    """One read of a metrics endpoint, or SourceError with the reason in one line."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - a URL made from the target's own
            return parse_metrics(r.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        raise SourceError(f"{url} answered HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SourceError(f"cannot read {url}: {getattr(reason, 'strerror', None) or reason}") from None


class _Sidecar:
    """The PM and NVML sidecar, started by the monitor itself; its frames arrive on a queue."""

    def __init__(self, device: int) -> None:
        self.frames: list[tuple[bytes, object]] = []
        self._lock = threading.Lock()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "decodemon.probes.sidecar", "--device", str(device)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None
            return
        threading.Thread(target=self._read, daemon=True, name="dm-outside-sidecar").start()

    def _read(self) -> None:
        reader = wire.StreamReader()
        while True:
            data = self.proc.stdout.read1(1 << 16)
            if not data:
                return
            for payload in reader.feed(data):
                with self._lock:
                    self.frames.append((payload, wire.decode_frame(payload)))

    def take(self) -> list[tuple[bytes, object]]:
        """The frames that arrived since the last take."""
        with self._lock:
            out, self.frames = self.frames, []
        return out

    def close(self) -> None:
        """Close its lifeline; it exits."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


def _hello(pid: int, device: int) -> wire.Hello:
    gpu, why = None, ""
    try:
        from decodemon.probes.device import Unavailable, gpu_info

        try:
            gpu = gpu_info(device)
        except Unavailable as exc:
            why = str(exc)
    except Exception as exc:  # noqa: BLE001 - no driver here: the watch goes on without the device
        why = str(exc)
    return wire.Hello(wire_version=wire.WIRE_VERSION, pid=pid, argv=_cmdline(pid), python="",
                      hostname=socket.gethostname(), gpu=gpu, gpu_unavailable=why)


def _counts(url: str, t_ns: int, m: dict[str, float]) -> wire.ServerCounts:
    col = lambda k: wire.Column.of([m.get(LLAMA_CPP[k], float("nan"))], "<f8")  # noqa: E731
    return wire.ServerCounts(url=url, t_ns=wire.Column.of([t_ns]), steps=col("steps"), tokens=col("tokens"),
                             busy=col("busy"), server="llama.cpp")


def frames(pid: int, seconds: float | None = None, stop=None, device: int = 0,
           pm: bool = True) -> Iterator[tuple[int, bytes, object]]:
    """Watch llama-server `pid` from outside: yield (rx ns, payload, frame) as `client.live_frames` does, until
    `seconds` pass, `stop()` is true, or the process ends."""
    url = endpoint_of(pid)
    first = scrape(url)
    if LLAMA_CPP["steps"] not in first:
        raise SourceError(f"{url} has no {LLAMA_CPP['steps']}: not a llama-server metrics endpoint decodemon reads")
    t0 = time.monotonic_ns()
    deadline = None if seconds is None else time.monotonic() + seconds

    def out(frame):
        payload = wire.encode(frame)
        return time.monotonic_ns() - t0, payload, frame

    hello = _hello(pid, device)
    yield out(hello)
    if hello.gpu:
        status = wire.ProbeStatus(token_clock="server_metrics", gpu="ok", trace="unavailable", trace_reason="no_python")
    else:
        status = wire.ProbeStatus(token_clock="server_metrics", gpu="unavailable", gpu_error=hello.gpu_unavailable,
                                  trace="unavailable", trace_reason="no_python", pm="unavailable", pm_reason="no_gpu",
                                  nvml="unavailable", nvml_reason="no_gpu")
    yield out(status)
    yield out(_counts(url, time.monotonic_ns(), first))
    sidecar = _Sidecar(device) if (pm and hello.gpu) else None
    try:
        while True:
            time.sleep(SCRAPE_S)
            for payload, frame in (sidecar.take() if sidecar else ()):
                yield time.monotonic_ns() - t0, payload, frame
            if not Path(f"/proc/{pid}").exists():
                yield out(wire.Bye(reason=f"pid {pid} went away"))
                return
            try:
                yield out(_counts(url, time.monotonic_ns(), scrape(url)))
            except SourceError as exc:
                if not Path(f"/proc/{pid}").exists():
                    continue  # it ended between the two checks: said on the next turn
                yield out(wire.ProbeStatus(recent_errors=[str(exc)], errors=1))
            if (deadline is not None and time.monotonic() >= deadline) or (stop and stop()):
                yield out(wire.Bye(reason="detached"))
                return
    finally:
        if sidecar:
            sidecar.close()
