"""msgpack in the standard library alone: what the agent sends and reads, in the target's own interpreter.

The agent runs in whatever CPython the engine runs (3.10-3.14) with nothing of decodemon's installed there, so it
cannot use msgspec. It packs a handful of types (None, bool, int, float, str, bytes, lists, dicts) into the
format the monitor's msgspec decoder reads, and unpacks the monitor's two small control messages. Floats go as
float64 and integers in their shortest form, as msgspec writes them.
"""

from __future__ import annotations

import struct

_B, _H, _I, _Q = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_b, _h, _i, _q = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_F64, _F32 = struct.Struct(">d"), struct.Struct(">f")


class UnpackError(ValueError):
    """Bytes that are not one whole msgpack value of the kinds the agent reads."""


def _int(out: bytearray, v: int) -> None:
    if 0 <= v < 0x80:
        out.append(v)
    elif -32 <= v < 0:
        out.append(v & 0xFF)
    elif v >= 0:
        for lim, tag, s in ((0xFF, 0xCC, _B), (0xFFFF, 0xCD, _H), (0xFFFFFFFF, 0xCE, _I), (2**64 - 1, 0xCF, _Q)):
            if v <= lim:
                out.append(tag)
                out += s.pack(v)
                return
        raise OverflowError(f"{v} does not fit msgpack's integers")
    else:
        for lim, tag, s in ((-0x80, 0xD0, _b), (-0x8000, 0xD1, _h), (-0x80000000, 0xD2, _i), (-2**63, 0xD3, _q)):
            if v >= lim:
                out.append(tag)
                out += s.pack(v)
                return
        raise OverflowError(f"{v} does not fit msgpack's integers")


def _len(out: bytearray, n: int, fix: int | None, fix_max: int, tags: tuple[int, int, int]) -> None:
    """A length header: the fix form under fix_max, else 8-bit (where the kind has one), 16-bit or 32-bit."""
    if fix is not None and n < fix_max:
        out.append(fix | n)
    elif tags[0] and n <= 0xFF:
        out.append(tags[0])
        out.append(n)
    elif n <= 0xFFFF:
        out.append(tags[1])
        out += _H.pack(n)
    else:
        out.append(tags[2])
        out += _I.pack(n)


def pack_into(out: bytearray, v) -> None:
    """Append `v` to `out`; objects with `wire_map()` are packed as the map it returns."""
    if v is None:
        out.append(0xC0)
    elif v is True:
        out.append(0xC3)
    elif v is False:
        out.append(0xC2)
    elif isinstance(v, int):
        _int(out, v)
    elif isinstance(v, float):
        out.append(0xCB)
        out += _F64.pack(v)
    elif isinstance(v, str):
        b = v.encode("utf-8", "surrogatepass")
        _len(out, len(b), 0xA0, 32, (0xD9, 0xDA, 0xDB))
        out += b
    elif isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        _len(out, len(b), None, 0, (0xC4, 0xC5, 0xC6))
        out += b
    elif isinstance(v, (list, tuple)):
        _len(out, len(v), 0x90, 16, (0, 0xDC, 0xDD))
        for x in v:
            pack_into(out, x)
    elif isinstance(v, dict):
        _len(out, len(v), 0x80, 16, (0, 0xDE, 0xDF))
        for k, x in v.items():
            pack_into(out, k)
            pack_into(out, x)
    elif hasattr(v, "wire_map"):
        pack_into(out, v.wire_map())
    else:
        raise TypeError(f"cannot pack {type(v).__name__}")


def packb(v) -> bytes:
    """`v` as msgpack bytes."""
    out = bytearray()
    pack_into(out, v)
    return bytes(out)


_SIMPLE = {0xC0: None, 0xC2: False, 0xC3: True}
_NUMS = {0xCC: _B, 0xCD: _H, 0xCE: _I, 0xCF: _Q, 0xD0: _b, 0xD1: _h, 0xD2: _i, 0xD3: _q, 0xCA: _F32, 0xCB: _F64}
# type byte: (the struct of its length, what it holds)
_SIZED = {0xD9: (_B, "text"), 0xDA: (_H, "text"), 0xDB: (_I, "text"), 0xC4: (_B, "blob"), 0xC5: (_H, "blob"),
          0xC6: (_I, "blob"), 0xDC: (_H, "array"), 0xDD: (_I, "array"), 0xDE: (_H, "map"), 0xDF: (_I, "map")}


class _Reader:
    def __init__(self, data: bytes, max_entries: int, max_depth: int) -> None:
        self.data, self.pos, self.max_entries, self.max_depth = memoryview(data), 0, max_entries, max_depth

    def take(self, n: int) -> memoryview:
        if self.pos + n > len(self.data):
            raise UnpackError("truncated")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def num(self, s: struct.Struct):
        return s.unpack(self.take(s.size))[0]

    def count(self, n: int) -> int:
        if n > self.max_entries:
            raise UnpackError(f"{n} entries, more than {self.max_entries}")
        return n

    def value(self, depth: int = 0):
        if depth > self.max_depth:
            raise UnpackError("nested too deep")
        t = self.num(_B)
        if t < 0x80:
            return t
        if t >= 0xE0:
            return t - 0x100
        if 0xA0 <= t <= 0xBF:
            return self.text(t & 0x1F)
        if 0x90 <= t <= 0x9F:
            return self.array(t & 0x0F, depth)
        if 0x80 <= t <= 0x8F:
            return self.map(t & 0x0F, depth)
        if t in _SIMPLE:
            return _SIMPLE[t]
        if t in _NUMS:
            return self.num(_NUMS[t])
        if t in _SIZED:
            size, kind = _SIZED[t]
            n = self.num(size)
            return getattr(self, kind)(n, depth) if kind in ("array", "map") else getattr(self, kind)(n)
        raise UnpackError(f"type byte 0x{t:02x} is not read here")

    def text(self, n: int) -> str:
        try:
            return str(self.take(n), "utf-8")
        except UnicodeDecodeError:
            raise UnpackError("a string that is not UTF-8") from None

    def blob(self, n: int) -> bytes:
        return bytes(self.take(n))

    def array(self, n: int, depth: int) -> list:
        return [self.value(depth + 1) for _ in range(self.count(n))]

    def map(self, n: int, depth: int) -> dict:
        out = {}
        for _ in range(self.count(n)):
            k = self.value(depth + 1)
            if not isinstance(k, str):
                raise UnpackError("a map key that is not a string")
            out[k] = self.value(depth + 1)
        return out


def unpackb(data: bytes, max_entries: int = 1 << 20, max_depth: int = 32):
    """One whole msgpack value from `data` (maps keyed by strings only); UnpackError on anything else."""
    r = _Reader(data, max_entries, max_depth)
    v = r.value()
    if r.pos != len(r.data):
        raise UnpackError("trailing bytes")
    return v
