"""A `.dmon` recording as the stream of frames a live source yields."""

from __future__ import annotations

from typing import Iterator

from decodemon.monitor.sources.errors import CUT_SHORT, SourceError
from decodemon.probes import wire, wire_file


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
        yield rx, b"", wire.Bye(reason=f"{CUT_SHORT} after {exc.whole_frames - 1} whole frames")
    except wire.WireError as exc:
        text = str(exc)
        raise SourceError(text if str(path) in text else f"{path}: {text}") from None
