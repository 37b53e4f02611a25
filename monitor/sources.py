"""Read a source into a `Session`: a live pid for some seconds, or a recording to its end.

The CLI, the public API (`decodemon.monitor.api`) and the tests all read sources through `collect`, so a
live attach, a recording being written and a replay take one path. Nothing here imports textual.

A recording is written to a hidden temporary file beside its target and renamed into place only once at
least one token was measured: a failed `record` (no agent, a target that went away, an unwritable path)
leaves no file behind, and a reader never sees a half-written target.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

from decodemon.monitor.client import SourceError, live_frames, recording_frames
from decodemon.probes import wire

VERSION = "0.1.0"


class NothingMeasured(SourceError):
    """The source ended (or the time ran out) before a single token was measured."""


def source_of(spec) -> tuple[str, object]:
    """("pid", int) for digits, ("file", path) for an existing path; SourceError otherwise."""
    spec = str(spec)
    if spec.isascii() and (spec.isdigit() or (spec.startswith("-") and spec[1:].isdigit())):
        return ("pid", int(spec))
    if not Path(spec).exists():
        raise SourceError(f"{spec}: no such recording file")
    return ("file", spec)


_STREAMS = ("/dev/stdout", "/dev/stderr")  # and /dev/fd/N, /proc/*/fd/N: an open descriptor of this process


def writes_into(path) -> bool:
    """Is `path` written into rather than replaced: a stream of this process (/dev/stdout, /dev/fd/N, whatever
    they point at: a pipe, a terminal, a file the shell opened), a character device or a FIFO."""
    text = str(path)
    if text in _STREAMS or text.startswith("/dev/fd/") or (text.startswith("/proc/") and "/fd/" in text):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _own_descriptor(text: str) -> int | None:
    """The descriptor number of /dev/stdout, /dev/stderr, /dev/fd/N or /proc/self/fd/N (this process's), else
    None."""
    if text in _STREAMS:
        return _STREAMS.index(text) + 1
    for prefix in ("/dev/fd/", "/proc/self/fd/", f"/proc/{os.getpid()}/fd/"):
        if text.startswith(prefix) and text[len(prefix):].isascii() and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    return None


def check_output(path, inputs=()) -> Path:
    """The output path, or SourceError saying in one line why nothing can be written there.

    "-" is standard output. A stream, a character device or a FIFO (writes_into) is written into, never
    replaced; a symlink is followed (its target is written, the link stays); any other path that is not a
    regular file (a block device, a socket, a symlink loop) is refused; an output that is one of the `inputs` is
    refused (writing it would destroy what is being read)."""
    if not str(path).strip():
        raise SourceError("cannot write to an empty path: give a file name")
    if str(path) == "-":  # the usual spelling of standard output
        path = "/dev/stdout"
    if writes_into(path):
        if not os.access(path, os.W_OK):
            raise SourceError(f"cannot write {path}: not writable")
        return Path(path)  # written into (write_bytes_whole), never renamed over
    p = Path(path)
    if p.is_symlink():
        p = Path(os.path.realpath(p))
        if p.is_symlink() or (p.exists() and not p.is_file() and not p.is_dir()):
            raise SourceError(f"cannot write {path}: a symlink to what is not a file")
    for src in inputs:
        try:
            if src is not None and p.exists() and os.path.samefile(p, src):
                raise SourceError(f"cannot write {path}: it is the input {src} (give another name)")
        except OSError:
            continue
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise SourceError(f"cannot write {path}: it is a directory (give a file name)")
    if p.exists() and not p.is_file():
        raise SourceError(f"cannot write {path}: not a regular file, a character device or a FIFO")
    if not parent.exists():
        raise SourceError(f"cannot write {path}: no directory {parent}")
    if not parent.is_dir():
        raise SourceError(f"cannot write {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SourceError(f"cannot write {path}: {parent} is not writable")
    _temp_beside(p).unlink()  # what access() cannot tell (root, read-only mounts, /proc): try it
    return p


def check_recording_output(path) -> Path:
    """check_output for a recording, which is made whole and then moved into place: a regular file only."""
    p = check_output(path)  # which refuses every other path that is not a regular file
    if writes_into(p):
        raise SourceError(f"cannot record to {path}: not a regular file (a recording is made whole, then moved "
                          "into place)")
    return p


def _clean_stale_parts(path: Path) -> None:
    """Remove the hidden partial files an earlier writer of `path` left when it was killed (SIGKILL gives it no
    chance): ours, regular, and named for a writer pid that is gone."""
    d = path.parent if str(path.parent) else Path(".")
    try:
        names = os.listdir(d)
    except OSError:
        return
    head = f".{path.name}."
    for n in names:
        if not (n.startswith(head) and n.endswith(".part")):
            continue
        pid = n[len(head):].split(".", 1)[0]
        if not (pid.isascii() and pid.isdigit()) or Path(f"/proc/{pid}").exists():
            continue
        try:
            st = os.lstat(d / n)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid():
                os.unlink(d / n)
        except OSError:
            pass


def _temp_beside(path: Path) -> Path:
    """A new hidden file in `path`'s directory (so the final rename stays on one filesystem), named for this
    process, so that a later writer can tell a killed writer's leftovers (_clean_stale_parts)."""
    _clean_stale_parts(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=f".{path.name}.{os.getpid()}.",
                                   suffix=".part")
    except OSError as exc:
        raise SourceError(f"cannot write {path}: {exc.strerror or exc}") from None
    os.close(fd)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)  # mkstemp makes it 0600; what the user writes is read like any file they write
    return Path(tmp)


def write_bytes_whole(path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it, so a failure (or an interrupt) leaves no
    partial file; a device or FIFO (check_output) is written into directly."""
    target = check_output(path)
    if writes_into(target):
        try:
            fd = _own_descriptor(str(target))
            if fd is not None:  # this process's open stream: written as it is (a shell's `>>` keeps appending)
                if fd in (1, 2):
                    (sys.stdout if fd == 1 else sys.stderr).flush()
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            else:
                with open(target, "wb") as f:
                    f.write(data)
        except BrokenPipeError:
            raise  # a reader that closed the pipe (`| head`): as for any stdout
        except OSError as exc:
            raise SourceError(f"cannot write {path}: {exc.strerror or exc}") from None
        return
    tmp = _temp_beside(target)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SourceError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_whole(path, text: str) -> None:
    """Write `text` to `path` whole (write_bytes_whole)."""
    write_bytes_whole(path, text.encode())


class _Recorder:
    """Frames of a live source into a temporary file, renamed to the target by `keep()`."""

    def __init__(self, target, pid: int) -> None:
        self.target = check_recording_output(target)
        self.pid = pid
        self.tmp: Path | None = None
        self.writer = None
        self.note = ""  # the header's note: the copy bandwidth measured for this device (monitor.bandwidth)

    def write(self, rx: int, payload: bytes, frame) -> None:
        """Store one frame (the file is made at the first one, so a source that never answered leaves none)."""
        if isinstance(frame, wire.RecordingHeader):
            return
        if self.writer is None:
            self.tmp = _temp_beside(self.target)
            header = wire.RecordingHeader(wire_version=wire.WIRE_VERSION, created_unix_s=time.time(),
                                          decodemon_version=VERSION, source=f"pid {self.pid}", note=self.note)
            try:
                self.writer = wire.RecordingWriter(self.tmp, header)
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
                os.replace(self.tmp, self.target)
                self.tmp = None
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
            self.tmp.unlink(missing_ok=True)
            self.tmp = None


def _feed(sess, frames, on_frame=None, recorder: _Recorder | None = None, live: bool = False):
    for rx, payload, frame in frames:
        if live and isinstance(frame, wire.Hello) and frame.gpu is not None and sess.copy_gbs is None:
            from decodemon.monitor.bandwidth import header_note, measured_copy_gbs

            sess.copy_gbs = measured_copy_gbs(frame.gpu)
            if recorder is not None:
                recorder.note = header_note(sess.copy_gbs)
        if recorder is not None:
            recorder.write(rx, payload, frame)
        sess.add(rx, frame)
        if on_frame:
            on_frame(rx, frame)
    return sess


def collect_recording(path, on_frame=None):
    """Read a recording to its end into a Session."""
    from decodemon.monitor.session import Session

    return _feed(Session(label=str(path)), recording_frames(str(path)), on_frame)


def measured_anything(snap) -> bool:
    """Tokens marked by the engine, or GPU steps read in a traced window (a loop that marks nothing); watched from
    outside, a rate over whole intervals of the server's steps."""
    if snap.probe.get("token_clock") == "server_metrics":
        return snap.tokens is not None
    return bool(snap.tokens_total) or snap.tokens is not None


def collect_pid(pid: int, settings: wire.Attach | None = None, seconds: float | None = None, record_to=None,
                on_frame=None):
    """Attach to `pid` for `seconds` into a Session; with `record_to`, also write what arrived as a recording.

    A recording is kept only if a token was measured; otherwise NothingMeasured says why and no file is left.
    Ctrl-C ends the attach early and keeps what was recorded, then re-raises."""
    from decodemon.monitor.session import Session

    sess = Session(label=str(pid))
    recorder = _Recorder(record_to, pid) if record_to else None
    interrupted = False
    try:
        _feed(sess, live_frames(pid, settings, seconds), on_frame, recorder, live=True)
    except KeyboardInterrupt:
        if recorder is None:
            raise
        interrupted = True
    except BaseException:
        if recorder is not None:
            recorder.discard()
        raise
    if recorder is not None:
        snap = sess.snapshot()
        if not measured_anything(snap):
            recorder.discard()
            why = snap.ended or (f"pid {pid} decoded no token in {seconds:g} s" if seconds else
                                 f"pid {pid} decoded no token")
            raise NothingMeasured(f"{why}; no token was measured, nothing written to {record_to}")
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
