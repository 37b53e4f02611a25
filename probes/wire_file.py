"""A recording: a `.dmon` file holding a gzip stream of a magic line, a `RecordingHeader`, then the same frames
as a live attach, each behind its length and the monitor's receive time (probes/wire.py), so a live attach and a
replay go through one decoder."""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from collections import deque
from typing import Iterator

from decodemon.probes.wire import (_REC, MAGIC, MAX_FRAME_BYTES, WIRE_VERSION, Frame, KernelWindow, PmSamples,
                                   RecordingHeader, TokenMarks, WireError, decode_frame, encode)

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
        """`path` is a file name, or a descriptor open for writing that the writer then owns (the monitor's
        recordings: made in a directory reached by descriptor, so never opened by path)."""
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


# What a recording of S bytes may hold. Its frames, decompressed, take at most ROOM_PER_BYTE x S + ROOM_BYTES (the
# bundled H200 recordings take 3-22x their size: deflate itself could give 1,032x, so a few MB of zeros could claim
# GBs); at most FRAMES_BASE + S / BYTES_PER_FRAME frames (the bundled ones spend 210-2,700 bytes a frame); and the
# analysis they ask for (frame_cost) at most COST_BASE + S / BYTES_PER_COST units (the bundled ones spend 245 bytes
# or more a unit, a transformers generate() loop with a static cache the densest). A file past these is refused
# before the frame that crosses them is read or analysed: on the 2-core CPU machine a crafted 10 MB file at the
# limits takes about 2 s of the monitor's CPU, whatever it claims.
ROOM_PER_BYTE = 32
ROOM_BYTES = 1 << 20
BYTES_PER_FRAME = 128
FRAMES_BASE = 1024
BYTES_PER_COST = 256
COST_BASE = 4096
# receive times are ns since the recording began: past this (about 3 years) no recording ran
MAX_RX_NS = 10**17


# a traced window is analysed over the token marks received in the 5 s before it, or over every mark kept when none
# came in them (monitor/session.py's SPAN_NS, monitor/feed.py's ring of 200,000)
SPAN_NS = 5_000_000_000
MARKS_KEPT = 200_000
MARKS_PER_COST = 4096
# a window opened by time is read on the GPU's steps against every PM sample kept (20,000 regular and 4,000 of
# windows' spans, monitor/feed.py), in vectorised passes: a window's analysis took no longer beside 7,700 kept
# samples than beside 80 (12-22 ms, the 2-core CPU machine), so the samples are charged lightly. At one unit per
# 40 a ten-minute recording of a graphed loop with PM on was refused at its 292nd second
PM_KEPT = (20_000, 4_000)
PM_SAMPLES_PER_COST = 400
# and against the engine's collectives of every token-mark frame kept (20,000): ~0.1 us a frame
COLL_KEPT = 20_000
COLL_PER_COST = 256


def frame_cost(frame, marks_read: int = 0, pm_kept: int = 0, coll_kept: int = 0) -> int:
    """The analysis `frame` asks of the monitor, in units of about 35 us of its CPU: a traced window 16, one per
    kernel name it uses (each moves the verdict; its kernel table takes a row per name), one per 4,096 of the
    `marks_read` and per 256 of the `coll_kept` it is read beside and, opened by time, one per 400 of the `pm_kept`
    samples; a PM frame 4 (one may move the verdict of a loop with no window); any other frame none (the frame count
    bounds those)."""
    if isinstance(frame, KernelWindow):
        cost = 16 + marks_read // MARKS_PER_COST + min(coll_kept, COLL_KEPT) // COLL_PER_COST
        if frame.clock == "time":
            cost += pm_kept // PM_SAMPLES_PER_COST
        col = frame.kernels.get("name")
        if col is None or not len(col.data):
            return cost
        import numpy as np

        try:
            return cost + len(np.unique(col.array()))
        except WireError:
            return cost  # a column that is no array: the feed says so
    return 4 if isinstance(frame, PmSamples) else 0


class _Read:
    """What a window received now is read beside: the token marks (SPAN_NS, MARKS_KEPT), the PM samples the feed
    keeps (PM_KEPT) and its collectives' rows (COLL_KEPT)."""

    def __init__(self) -> None:
        self.recent: deque = deque()  # (rx ns, marks) of the token-mark frames of the last SPAN_NS
        self.in_span = self.total = 0
        self.pm = [0, 0]  # PM samples read: regular, of windows' spans
        self.coll = 0  # token-mark frames read that carry the engine's collectives

    def add_pm(self, frame) -> None:
        """Count a PM frame's samples."""
        try:
            self.pm[bool(frame.window_span)] += len(frame.start_ns.array())
        except WireError:
            pass

    def pm_kept(self) -> int:
        """The PM samples the feed keeps now."""
        return sum(min(n, cap) for n, cap in zip(self.pm, PM_KEPT))

    def add(self, rx_ns: int, frame) -> None:
        """Count a frame's marks."""
        try:
            n = len(frame.t_ns.array())
        except WireError:
            return
        self.recent.append((rx_ns, n))
        self.coll += frame.coll_calls is not None
        self.in_span += n
        self.total += n

    def at(self, rx_ns: int) -> int:
        """The marks a window received at `rx_ns` (non-decreasing) is read beside."""
        while self.recent and self.recent[0][0] < rx_ns - SPAN_NS:
            self.in_span -= self.recent.popleft()[1]
        return min(self.in_span or self.total, MARKS_KEPT)


class Refused(WireError):
    """A recording that claims more than a file of its size holds, or whose header or receive times are impossible;
    the frames before the refusal were yielded."""


def _open_regular(path) -> tuple[int, os.stat_result]:
    """A descriptor of `path` and its stat, or WireError: a missing file, or one that is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO with no writer would block a plain open
    except OSError as exc:
        raise WireError(f"cannot open recording {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise WireError(f"{path} is not a decodemon recording (not a regular file)")
    return fd, st


def _payloads(gz, path, size: int) -> Iterator[tuple[int, bytes]]:
    """(receive ns, payload) of each whole frame after the magic line; Refused before the bytes of a frame past
    what a `size`-byte file holds are asked for, Truncated where the stream ends inside a frame."""
    room = ROOM_PER_BYTE * size + ROOM_BYTES
    max_frames = FRAMES_BASE + size // BYTES_PER_FRAME
    count, taken = 0, len(MAGIC)
    while True:
        try:
            head = gz.read(_REC.size)
            if not head:
                return
            if len(head) < _REC.size:
                raise EOFError
            n, rx_ns = _REC.unpack(head)
            taken += _REC.size + n
            if n > MAX_FRAME_BYTES:
                raise WireError(f"{path} is corrupt: a frame claims {n} bytes")
            if taken > room:  # before the frame's bytes are asked for
                raise Refused(f"{path} is refused: frame {count + 1} claims {n} bytes, past what a "
                              f"{size}-byte recording holds ({ROOM_PER_BYTE}x its size)")
            if count >= max_frames:
                raise Refused(f"{path} is refused: it holds more than {max_frames} frames, more than a "
                              f"{size}-byte recording holds")
            payload = gz.read(n)
            if len(payload) < n:
                raise EOFError
        except EOFError:  # the stream ends inside a frame: cut short
            raise Truncated(f"{path} is truncated after the last whole frame", count) from None
        except (OSError, zlib.error, gzip.BadGzipFile):  # bytes that are not what was written
            raise WireError(f"{path} is corrupt after the last whole frame") from None
        count += 1
        yield rx_ns, payload


def _check_place(path, frame, count: int, rx_ns: int, last_rx: int, frame_problem) -> None:
    """Refused (or WireError) for a frame out of place: no header first, a header too new or impossible, a second
    header, or a receive time that runs backwards or past any recording's length."""
    if count == 0:
        if not isinstance(frame, RecordingHeader):
            raise WireError(f"{path} has no recording header")
        if frame.wire_version > WIRE_VERSION:
            raise WireError(
                f"{path} uses wire version {frame.wire_version}; this decodemon reads "
                f"versions up to {WIRE_VERSION}: upgrade decodemon to read it"
            )
        why = frame_problem(frame)
        if why:
            raise Refused(f"{path} is refused: its header's {why}")
    elif isinstance(frame, RecordingHeader):
        raise Refused(f"{path} is refused: frame {count + 1} is a second recording header (two recordings "
                      "joined, or a damaged one)")
    if rx_ns < last_rx or rx_ns > MAX_RX_NS:
        raise Refused(f"{path} is refused: frame {count + 1}'s receive time "
                      + (f"runs backwards ({rx_ns} ns after {last_rx})" if rx_ns < last_rx else
                         f"is {rx_ns} ns, past any recording's length"))


def read_recording(path) -> Iterator[tuple[int, Frame]]:
    """Yield (receive ns, frame) from a `.dmon` file; the header frame comes first.

    Raises WireError with a one-line reason for a missing, foreign, corrupt,
    truncated or too-new file, and Refused for one that claims more frames,
    bytes or analysis than a file of its size holds (the limits above), a second
    header, a header with an impossible value, or receive times that run
    backwards. A truncated file yields every whole frame before the cut, then
    raises Truncated. The impossible values inside the other frames
    (wire_check.frame_problem) are the feed's to leave out and report.
    """
    from decodemon.probes.wire_check import frame_problem  # here: wire_check imports the wire, which imports this

    fd, st = _open_regular(path)
    max_cost = COST_BASE + st.st_size // BYTES_PER_COST
    with os.fdopen(fd, "rb") as raw:
        gz = gzip.GzipFile(fileobj=raw, mode="rb")
        try:
            magic = gz.read(len(MAGIC))
        except (OSError, EOFError, zlib.error):
            raise WireError(f"{path} is not a decodemon recording (not gzip data)") from None
        if magic != MAGIC:
            raise WireError(f"{path} is not a decodemon recording (bad magic)")
        count = cost = last_rx = 0
        seen = _Read()
        for rx_ns, payload in _payloads(gz, path, st.st_size):
            try:
                frame = decode_frame(payload)
            except WireError as exc:  # bytes that frame as whole but are not what was written
                detail = str(exc).removeprefix("malformed frame: ")
                raise WireError(f"{path} is corrupt at frame {count + 1}, received {rx_ns / 1e9:.3f} s "
                                f"into the recording ({detail}); the {count} frames before it read whole") from None
            _check_place(path, frame, count, rx_ns, last_rx, frame_problem)
            last_rx = rx_ns
            if isinstance(frame, TokenMarks):
                seen.add(rx_ns, frame)
            elif isinstance(frame, PmSamples):
                seen.add_pm(frame)
            beside = (seen.at(rx_ns), seen.pm_kept(), seen.coll) if isinstance(frame, KernelWindow) else ()
            cost += frame_cost(frame, *beside)
            if cost > max_cost:
                raise Refused(f"{path} is refused: its traced windows and PM samples ask more analysis than a "
                              f"{st.st_size}-byte recording holds (frame {count + 1}: {cost} units of at most "
                              f"{max_cost})")
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
