"""A recording: a `.dmon` file holding a gzip stream of a magic line, a `RecordingHeader`, then the same frames
as a live attach, each behind its length and the monitor's receive time (probes/wire.py), so a live attach and a
replay go through one decoder."""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from typing import Iterator

from decodemon.probes.wire import (_REC, MAGIC, MAX_FRAME_BYTES, WIRE_VERSION, Frame, RecordingHeader, WireError,
                                   decode_frame, encode)

class Truncated(WireError):
    """The file ends inside a frame (its writer was killed, or the disk filled): every frame before the cut was
    yielded; `whole_frames` says how many."""

    def __init__(self, message: str, whole_frames: int) -> None:
        super().__init__(message)
        self.whole_frames = whole_frames


class _Whole:
    """A frame's write is whole: an interrupt (Ctrl-C, or SIGTERM as the CLI maps it) that arrives inside one is
    held (`hold_interrupt`) and raised once the frame is in the file. An interrupt raised half way through the
    gzip stream's write would leave compressed bytes the file never got, and the kept recording unreadable past
    the cut."""

    writing = False
    held = False


def hold_interrupt() -> bool:
    """For a signal handler: True (and the interrupt held for later) while a frame is being written."""
    if _Whole.writing:
        _Whole.held = True
    return _Whole.writing


class RecordingWriter:
    """Append frames to a `.dmon` file; every frame is flushed so a crash leaves a readable prefix."""

    def __init__(self, path, header: RecordingHeader) -> None:
        self._raw = open(path, "wb")
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6)
        self._gz.write(MAGIC)
        self.write_payload(encode(header), 0)

    def write_payload(self, payload: bytes, rx_ns: int) -> None:
        """Store one already-encoded frame with its receive time (whole: see _Whole)."""
        _Whole.writing = True
        try:
            self._gz.write(_REC.pack(len(payload), max(int(rx_ns), 0)) + payload)
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        finally:
            _Whole.writing = False
        if _Whole.held:
            _Whole.held = False
            raise KeyboardInterrupt

    def write(self, frame, rx_ns: int) -> None:
        """Store one frame with its receive time (ns since the recording began)."""
        self.write_payload(encode(frame), rx_ns)

    def close(self) -> None:
        """Finish the gzip stream and close the file."""
        if self._gz is not None:
            self._gz.close()
            self._raw.close()
            self._gz = None


def read_recording(path) -> Iterator[tuple[int, Frame]]:
    """Yield (receive ns, frame) from a `.dmon` file; the header frame comes first.

    Raises WireError with a one-line reason for a missing, foreign, corrupt,
    truncated or too-new file. A truncated file yields every whole frame
    before the cut, then raises Truncated.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer would block a plain open
    except OSError as exc:
        raise WireError(f"cannot open recording {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise WireError(f"{path} is not a decodemon recording (not a regular file)")
    with os.fdopen(fd, "rb") as raw:
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        try:
            magic = gz.read(len(MAGIC))
        except (OSError, EOFError, zlib.error):
            raise WireError(f"{path} is not a decodemon recording (not gzip data)") from None
        if magic != MAGIC:
            raise WireError(f"{path} is not a decodemon recording (bad magic)")
        first, count = True, 0
        while True:
            try:
                head = gz.read(_REC.size)
                if not head:
                    return
                if len(head) < _REC.size:
                    raise EOFError
                n, rx_ns = _REC.unpack(head)
                if n > MAX_FRAME_BYTES:
                    raise WireError(f"{path} is corrupt: a frame claims {n} bytes")
                payload = gz.read(n)
                if len(payload) < n:
                    raise EOFError
            except EOFError:  # the stream ends inside a frame: cut short
                raise Truncated(f"{path} is truncated after the last whole frame", count) from None
            except (OSError, zlib.error, gzip.BadGzipFile):  # bytes that are not what was written
                raise WireError(f"{path} is corrupt after the last whole frame") from None
            frame = decode_frame(payload)
            if first:
                if not isinstance(frame, RecordingHeader):
                    raise WireError(f"{path} has no recording header")
                if frame.wire_version > WIRE_VERSION:
                    raise WireError(
                        f"{path} uses wire version {frame.wire_version}; this decodemon reads "
                        f"versions up to {WIRE_VERSION}: upgrade decodemon to read it"
                    )
                first = False
            count += 1
            yield rx_ns, frame


def load_recording(path) -> list[tuple[int, Frame]]:
    """Read a whole recording into memory (they are a few MB)."""
    return list(read_recording(path))


def recording_bytes(frames: list[tuple[int, object]], header: RecordingHeader) -> bytes:
    """Encode frames as a `.dmon` file in memory (for tests and tools)."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        gz.write(MAGIC)
        for rx, fr in [(0, header)] + list(frames):
            p = encode(fr)
            gz.write(_REC.pack(len(p), rx) + p)
    return buf.getvalue()
