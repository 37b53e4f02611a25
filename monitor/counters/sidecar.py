"""The device-wide counters' process: NVML, and PM sampling, started by the monitor beside whatever it watches.

PM counters and NVML cover the whole GPU, so they are read from a process of decodemon's own
(`python -m decodemon.monitor.counters.sampler`), never from the decode process: there every millisecond of Python the
agent runs is taken from the loop's GIL. The monitor starts it on the target's GPU once the hello names the
device (by UUID, so the target's and the monitor's CUDA_VISIBLE_DEVICES need not agree), reads its frames on a
thread of its own, and ends it when the watch ends. Its frames join the agent's in one stream.
"""

from __future__ import annotations

import os
import subprocess
import threading

from decodemon.probes import wire


class Sidecar:
    """One sidecar process on one GPU; `take()` hands over the frames it sent since the last take."""

    def __init__(self, gpu: wire.GpuInfo, target: int, settings: wire.Attach, pm: bool | None = None) -> None:
        self.frames: list[tuple[bytes, object]] = []
        self._lock = threading.Lock()
        self.ended = False
        from decodemon.probes import children

        argv = children.python_argv("decodemon.monitor.counters.sampler", "--device", str(int(gpu.index)),
                                    "--target-pid", str(int(target)), "--pm-interval-us",
                                    str(int(settings.pm_interval_us)), "--nvml-hz", str(float(settings.nvml_hz or 4.0)))
        env = {k: v for k, v in os.environ.items() if not k.startswith("DECODEMON_AGENT")}
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's device numbers as NVML's
        env.pop("CUDA_VISIBLE_DEVICES", None)
        uuid = children.gpu_uuid(gpu.uuid)  # the target's text: on the command line (`ps`) only as NVML spells one
        if uuid:
            argv += ["--uuid", uuid]
        log = os.environ.get("DECODEMON_SIDECAR_LOG")  # its stderr, for a run that must see why it failed
        err = open(log, "a") if log else subprocess.DEVNULL
        try:
            self.pm = settings.pm if pm is None else pm
            self.proc = subprocess.Popen(argv + ([] if self.pm else ["--no-pm"]), stdin=subprocess.PIPE, env=env,
                                         stdout=subprocess.PIPE, stderr=err, close_fds=True, cwd=children.CWD)
        finally:
            if log:
                err.close()
        threading.Thread(target=self._read, daemon=True, name="dm-sidecar-reader").start()

    def _read(self) -> None:
        reader = wire.StreamReader()
        try:
            while data := self.proc.stdout.read1(1 << 16):
                for payload in reader.feed(data):
                    frame = wire.decode_frame(payload)
                    with self._lock:
                        self.frames.append((payload, frame))
        except (OSError, ValueError, wire.WireError):
            pass
        self.ended = True

    def take(self) -> list[tuple[bytes, object]]:
        """The frames that arrived since the last take."""
        with self._lock:
            out, self.frames = self.frames, []
        return out

    def close(self) -> None:
        """Close its lifeline; it exits (killed, and reaped, if it does not)."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=3)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()

    def lost(self) -> wire.ProbeStatus:
        """What this sidecar took with it when it exited: NVML, and PM where it read PM."""
        pm = dict(pm="lost", pm_reason="sidecar_exited") if self.pm else {}
        return wire.ProbeStatus(nvml="lost", nvml_reason="sidecar_exited", **pm)
