"""A Canvas rasterised to PNG bytes with the standard library only (zlib, struct): no imaging dependency.

Lines are stamped squares along a DDA walk, circles and rectangles are filled by bounds, and text uses a 5×7
bitmap font (capitals, digits, the punctuation the charts write; lower case is drawn in capitals) scaled to
the requested size. Good enough for a chart beside its SVG; the SVG is the exact one.
"""

from __future__ import annotations

import struct
import zlib

from decodemon.monitor.plots.canvas import Canvas

# each glyph: seven rows of five bits, most significant bit on the left, as 14 hex digits
_GLYPHS = {
    "0": "0E111315191 10E", "1": "040C040404040E", "2": "0E110102040 81F", "3": "1F020402011 10E",
    "4": "02060A121F0202", "5": "1F101E0101110E", "6": "0608101E11110E", "7": "1F010204080808",
    "8": "0E11110E11110E", "9": "0E11110F01020C", "A": "0E11111F111111", "B": "1E11111E11111E",
    "C": "0E111010 10110E", "D": "1C121111 11121C", "E": "1F10101E10101F", "F": "1F10101E101010",
    "G": "0E111017 11110F", "H": "1111111F111111", "I": "0E04040404040E", "J": "07020202 02120C",
    "K": "11121418141211", "L": "1010101010101F", "M": "111B1515111111", "N": "11111915131111",
    "O": "0E11111111110E", "P": "1E11111E101010", "Q": "0E111111151 20D", "R": "1E11111E141211",
    "S": "0F10100E01011E", "T": "1F040404040404", "U": "1111111111110E", "V": "11111111110A04",
    "W": "1111111515150A", "X": "11110A040A1111", "Y": "1111110A040404", "Z": "1F01020408101F",
    " ": "00000000000000", ".": "00000000000C0C", ",": "000000000C0408", "-": "0000001F000000",
    "+": "0004041F040400", "/": "00010204081000", "%": "18190204081303", ":": "000C0C000C0C00",
    "(": "02040808080402", ")": "08040202020408", "=": "00001F001F0000", "×": "00110A040A1100",
    "_": "0000000000001F", ">": "08040201020408", "<": "02040810080402", "µ": "00111111131D10",
    "→": "0004021F020400", "?": "0E110102040004", "'": "04040800000000", "÷": "0004001F000400",
    "±": "04041F0404001F", "≥": "08040204081F00", "≤": "02040804021F00",
}
GLYPHS = {k: [int(v.replace(" ", "")[i:i + 2], 16) for i in range(0, 14, 2)] for k, v in _GLYPHS.items()}


def _rgb(color: str) -> tuple[int, int, int]:
    c = color.lstrip("#")
    return int(c[0:2], 16), int(c[2:4], 16), int(c[4:6], 16)


class _Raster:
    def __init__(self, w: int, h: int) -> None:
        self.w, self.h = w, h
        self.px = bytearray(b"\xff" * (w * h * 3))

    def fill(self, x0: float, y0: float, x1: float, y1: float, rgb) -> None:
        xa, xb = max(int(round(x0)), 0), min(int(round(x1)), self.w)
        ya, yb = max(int(round(y0)), 0), min(int(round(y1)), self.h)
        if xa >= xb:
            return
        row = bytes(rgb) * (xb - xa)
        for y in range(ya, yb):
            i = (y * self.w + xa) * 3
            self.px[i:i + len(row)] = row

    def line(self, x0, y0, x1, y1, rgb, width: float, dash: bool) -> None:
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        half = max(width, 1.0) / 2
        for k in range(n + 1):
            if dash and (k // 4) % 2:
                continue
            x, y = x0 + (x1 - x0) * k / n, y0 + (y1 - y0) * k / n
            self.fill(x - half, y - half, x + half, y + half, rgb)

    def circle(self, cx, cy, r, rgb) -> None:
        for y in range(int(cy - r), int(cy + r) + 1):
            dx = (max(r * r - (y + 0.5 - cy) ** 2, 0.0)) ** 0.5
            self.fill(cx - dx, y, cx + dx, y + 1, rgb)

    def text(self, x, y, s: str, rgb, size: int, anchor: str) -> None:
        scale = max(1, round(size / 9))
        adv = 6 * scale
        s = s.upper()
        x0 = x - (len(s) * adv if anchor == "end" else len(s) * adv / 2 if anchor == "middle" else 0)
        top = y - 7 * scale
        for i, ch in enumerate(s):
            rows = GLYPHS.get(ch, GLYPHS["?"])
            for r, bits in enumerate(rows):
                for c in range(5):
                    if bits & (0x10 >> c):
                        px, py = x0 + i * adv + c * scale, top + r * scale
                        self.fill(px, py, px + scale, py + scale, rgb)


def png_bytes(canvas: Canvas) -> bytes:
    """The canvas as an RGB PNG file's bytes."""
    r = _Raster(canvas.width, canvas.height)
    for it in canvas.items:
        kind = it[0]
        if kind == "line":
            _, x0, y0, x1, y1, c, w, dash = it
            r.line(x0, y0, x1, y1, _rgb(c), w, dash)
        elif kind == "rect":
            _, x, y, w, h, c = it
            r.fill(x, y, x + w, y + h, _rgb(c))
        elif kind == "circle":
            _, x, y, rad, c = it
            r.circle(x, y, rad, _rgb(c))
        else:
            _, x, y, s, c, size, anchor = it
            r.text(x, y, s, _rgb(c), size, anchor)
    stride = canvas.width * 3
    raw = b"".join(b"\x00" + bytes(r.px[y * stride:(y + 1) * stride]) for y in range(canvas.height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", canvas.width, canvas.height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
