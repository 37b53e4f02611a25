"""decodemon as a library: attach, record and replay without the app.

    from decodemon.monitor import api
    s = api.replay("run.dmon")
    print(s.verdict, s.ms_per_token, s.kernels_per_token)

The figures cover the whole recording (or the seconds attached); `last_s=5` gives the live screen's last 5 s.

Every call returns a `Summary`: plain, frozen values (the full `Snapshot` rides along as `.snapshot`).
Nothing here imports textual, torch or CUPTI.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from decodemon.monitor.sources.errors import SourceError
from decodemon.monitor.render import summary_json
from decodemon.monitor.snapshot import Snapshot
from decodemon.monitor.sources.errors import NothingMeasured
from decodemon.monitor.span import summary_snapshot

__all__ = ["NothingMeasured", "SourceError", "Summary", "attach", "record", "replay", "summarize"]


@dataclass(frozen=True)
class Summary:
    """What one watched source came to: the verdict and the figures behind it."""

    source: str
    verdict: str  # the ceiling its candidates support now: bandwidth, occupancy, launch, comm, kernels or unknown
    ceiling: str  # the latest traced window's ceiling
    ms_per_token: float | None
    tokens_per_s: float | None
    kernels_per_token: float | None
    gpu_busy_pct: float | None
    bytes_per_token: float | None
    falsify: str
    tokens: int
    windows: int
    snapshot: Snapshot

    def as_json(self) -> dict:
        """The same dict `decodemon replay --json` prints."""
        return summary_json(self.snapshot)


def summarize(snap: Snapshot) -> Summary:
    """A Summary of one Snapshot."""
    j = summary_json(snap, kernels=0)
    return Summary(source=snap.label, verdict=j["verdict"], ceiling=j["ceiling"], ms_per_token=j["ms_per_token"],
                   tokens_per_s=j["tokens_per_s"], kernels_per_token=j["kernels_per_token"],
                   gpu_busy_pct=j["gpu_busy_pct"], bytes_per_token=j["bytes_per_token"], falsify=j["falsify"],
                   tokens=j["tokens"], windows=j["windows"], snapshot=snap)


def replay(path: str | Path, last_s: float | None = None) -> Summary:
    """Read a recording to its end: the figures over all of it (`last_s`: its last `last_s` seconds)."""
    from decodemon.monitor.sources.collect import collect_recording

    return summarize(summary_snapshot(collect_recording(str(path)), last_s))


def attach(pid: int, seconds: float = 10.0, settings=None, last_s: float | None = None) -> Summary:
    """Attach to a process with the agent for `seconds`, then detach: the figures over all of them (`last_s`:
    their last `last_s` seconds)."""
    from decodemon.monitor.sources.collect import collect_pid

    return summarize(summary_snapshot(collect_pid(int(pid), settings, seconds), last_s))


def record(pid: int, path: str | Path, seconds: float = 10.0, settings=None, last_s: float | None = None) -> Summary:
    """Attach for `seconds` and write what arrived as a recording at `path`; the figures as `attach` gives them.

    The file appears only once it is whole and holds a token; otherwise `SourceError` (`NothingMeasured` when
    the target measured no token) says why, and no file is left."""
    from decodemon.monitor.sources.collect import collect_pid

    return summarize(summary_snapshot(collect_pid(int(pid), settings, seconds, record_to=str(path)), last_s))
