"""The live attach's transport: the per-user socket each agent listens on, and frames behind a 4-byte length
(probes/wire.py holds the frames themselves)."""

from __future__ import annotations

import os

from decodemon.probes.wire import _LEN, MAX_FRAME_BYTES, WireError, encode


def socket_dir():
    """Per-user directory for agent sockets: $XDG_RUNTIME_DIR/decodemon or /tmp/decodemon-<uid>."""
    from pathlib import Path

    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "decodemon"
    return Path(f"/tmp/decodemon-{os.getuid()}")


def socket_path(pid: int):
    """Where the agent of process `pid` listens."""
    return socket_dir() / f"{pid}.sock"


def pack(obj) -> bytes:
    """One frame with its 4-byte length prefix, ready for a socket."""
    payload = encode(obj)
    return _LEN.pack(len(payload)) + payload


class StreamReader:
    """Incremental reader of length-prefixed payloads from a byte stream."""

    def __init__(self, max_frame: int = MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        """Add bytes; return every complete payload now available."""
        self._buf += data
        out = []
        while len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > self._max:
                raise WireError(f"frame of {n} bytes exceeds the {self._max}-byte limit")
            if len(self._buf) < 4 + n:
                break
            out.append(bytes(self._buf[4 : 4 + n]))
            del self._buf[: 4 + n]
        return out
