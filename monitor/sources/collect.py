"""Read a source into a `Session`: a live pid for some seconds, or a recording to its end.

The CLI, the public API (`decodemon.monitor.api`) and the tests all read sources through `collect`, so a
live attach, a recording being written and a replay take one path. Nothing here imports textual.

A recording is written to a hidden temporary file beside its target and renamed into place only once at
least one token was measured: a failed `record` (no agent, a target that went away, an unwritable path)
leaves no file behind, and a reader never sees a half-written target.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from decodemon.monitor import safe_write
from decodemon.monitor.sources.errors import NothingMeasured, SourceError
from decodemon.monitor.sources.recording import recording_frames
from decodemon.probes import wire


VERSION = "0.1.0"


def source_of(spec) -> tuple[str, object]:
    """("pid", int) for digits, ("file", path) for an existing path; SourceError otherwise."""
    spec = str(spec)
    if spec.isascii() and (spec.isdigit() or (spec.startswith("-") and spec[1:].isdigit())):
        return ("pid", int(spec))
    if not Path(spec).exists():
        raise SourceError(f"{spec}: no such recording file")
    return ("file", spec)


class _Recorder:
    """Frames of a live source into a temporary file, renamed to the target by `keep()`."""

    def __init__(self, target, pid: int) -> None:
        self.target = safe_write.check_recording_output(target)
        self.pid = pid
        self.tmp: safe_write.Pending | None = None
        self.writer = None
        self.note = ""  # the header's note: the copy bandwidth measured for this device (monitor.bandwidth)

    def write(self, rx: int, payload: bytes, frame, origin_unix_s: float | None = None) -> None:
        """Store one frame (the file is made at the first one, so a source that never answered leaves none). The
        header's time is the live session's origin (receive time 0 in unix seconds), so a replay of the file puts
        its spans at the unix times the live summary gave them."""
        if isinstance(frame, wire.RecordingHeader):
            return
        if self.writer is None:
            self.tmp = safe_write.temp_beside(self.target)
            origin = origin_unix_s if origin_unix_s is not None else time.time() - rx / 1e9
            header = wire.RecordingHeader(wire_version=wire.WIRE_VERSION, created_unix_s=origin,
                                          decodemon_version=VERSION, source=f"pid {self.pid}", note=self.note)
            try:  # written through the descriptor made in the checked directory, never reopened by path
                self.writer = wire.RecordingWriter(self.tmp.take_fd(), header)
            except OSError as exc:
                self.discard()
                raise SourceError(f"cannot write {self.target}: {exc.strerror or exc}") from None
        if payload:
            self.writer.write_payload(payload, rx)
        else:
            self.writer.write(frame, rx)

    def keep(self) -> None:
        """Close the file and move it into place (on failure, delete it and say why)."""
        try:
            if self.writer is not None:
                self.writer.close()
                self.writer = None
            if self.tmp is not None:
                self.tmp.commit()
                self.tmp = None
        except SourceError:
            self.discard()
            raise
        except OSError as exc:
            self.discard()
            raise SourceError(f"cannot write {self.target}: {exc.strerror or exc}") from None

    def discard(self) -> None:
        """Close and delete the temporary file, if any."""
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError:
                pass
            self.writer = None
        if self.tmp is not None:
            self.tmp.discard()
            self.tmp = None


def _feed(sess, frames, on_frame=None, recorder: _Recorder | None = None):
    for rx, payload, frame in frames:
        sess.add(rx, frame)
        if recorder is not None:
            recorder.write(rx, payload, frame, sess.clock_origin_unix_s)
        if on_frame:
            on_frame(rx, frame)
    return sess


def collect_recording(path, on_frame=None):
    """Read a recording to its end into a Session."""
    from decodemon.monitor.session import Session

    return _feed(Session(label=str(path)), recording_frames(str(path)), on_frame)


def _server_reads(sess, snap) -> str:
    """For a server watched from outside that measured nothing: what its reads saw, in words ("" otherwise)."""
    if snap.probe.get("token_clock") != "server_metrics":
        return ""
    import numpy as np

    from decodemon.monitor.analysis.tokens import counter_intervals

    c = sess.feed.counts_since(0)
    n = len(c["t_ns"])
    kept = int(counter_intervals(c).sum()) if n > 1 else 0
    decoding = int((np.asarray(c["busy"]) > 0).sum()) if n else 0
    errors = sess.feed.status.errors
    return (f" (the server's /slots read {n} times, {decoding} of them with a request decoding; {kept} intervals "
            f"between reads held decoding at both ends and no request's end" + (f"; {errors} reads failed" if errors
                                                                                 else "") + ")")


INTERRUPTED = "stopped by an interrupt (Ctrl-C or SIGTERM); what arrived before it is kept"


def collect_pid(pid: int, settings: wire.Attach | None = None, seconds: float | None = None, record_to=None,
                on_frame=None):
    """Attach to `pid` for `seconds` into a Session; with `record_to`, also write what arrived as a recording.

    A recording is kept only if a token was measured; otherwise NothingMeasured says why and no file is left.
    Ctrl-C ends the attach early and keeps what was recorded, then re-raises."""
    from decodemon.monitor.session import Session
    from decodemon.monitor.sources.live import live_frames  # a replay never imports the live socket

    sess = Session(label=str(pid))
    recorder = _Recorder(record_to, pid) if record_to else None
    interrupted = False
    try:
        _feed(sess, live_frames(pid, settings, seconds), on_frame, recorder)
    except KeyboardInterrupt:
        if recorder is None:
            raise
        interrupted = True
        # said in the recording as a detach is, so a replay of it tells how it ended
        bye = wire.Bye(reason=INTERRUPTED)
        sess.add(sess.feed.last_rx_ns, bye)
        recorder.write(sess.feed.last_rx_ns, b"", bye, sess.clock_origin_unix_s)
    except BaseException:
        if recorder is not None:
            recorder.discard()
        raise
    if recorder is not None:
        snap = sess.snapshot()
        if not snap.measured_anything:
            recorder.discard()
            why = snap.ended or (f"pid {pid} decoded no token in {seconds:g} s" if seconds else
                                 f"pid {pid} decoded no token")
            raise NothingMeasured(f"{why}; no token was measured{_server_reads(sess, snap)}, nothing written to "
                                  f"{record_to}")
        recorder.keep()
    if interrupted:
        raise KeyboardInterrupt
    return sess


def collect(spec, settings=None, seconds=None, record_to=None, on_frame=None):
    """Read a source to its end (a recording) or for `seconds` (a pid) into a Session; optionally record it."""
    kind, val = source_of(spec)
    if kind == "pid":
        return collect_pid(val, settings, seconds, record_to, on_frame)
    return collect_recording(val, on_frame)


def staggered(settings: wire.Attach, ranks: int) -> list[wire.Attach]:
    """One rank traced at a time: rank r's first window r/N of a period after rank 0's."""
    import msgspec

    return [msgspec.structs.replace(settings, first_window_s=0.5 + r * settings.window_period_s / ranks)
            for r in range(ranks)]


def collect_many(specs, settings, seconds, collect_one=None) -> list:
    """Read several sources at once (one thread each); a source that fails gives its exception in its place.

    `settings` is one Attach for all, or a list with one per source."""
    collect_one = collect_one or collect
    each = settings if isinstance(settings, list) else [settings] * len(specs)
    out: dict[int, object] = {}

    def one(i, spec, st):
        try:
            out[i] = collect_one(spec, st, seconds)
        except (SourceError, wire.WireError) as exc:
            out[i] = exc
        except Exception as exc:  # noqa: BLE001 - a recording that decodes but holds nonsense: the verb's one line
            out[i] = SourceError(f"{spec}: cannot be read ({type(exc).__name__}: {exc})"[:300])

    threads = [threading.Thread(target=one, args=(i, s, st)) for i, (s, st) in enumerate(zip(specs, each))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [out[i] for i in range(len(specs))]
