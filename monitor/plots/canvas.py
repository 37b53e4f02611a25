"""A drawing as a list of primitives (lines, rectangles, circles, text) that renders to SVG text.

The charts build a Canvas; `svg()` writes it as SVG and `decodemon.monitor.plots.png` rasterises the same
primitives, so the picture in a browser and the PNG beside it are one drawing. Pure: no files, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax.saxutils import escape

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"


@dataclass
class Canvas:
    """A width × height drawing, white background, primitives painted in order."""

    width: int
    height: int
    items: list = field(default_factory=list)

    def line(self, x0, y0, x1, y1, color="#000000", width=1.0, dash=False) -> None:
        """A straight line."""
        self.items.append(("line", float(x0), float(y0), float(x1), float(y1), color, float(width), dash))

    def polyline(self, pts, color="#000000", width=1.0) -> None:
        """Connected segments through `pts` [(x, y), ...]."""
        for (a, b), (c, d) in zip(pts, pts[1:]):
            self.line(a, b, c, d, color, width)

    def rect(self, x, y, w, h, fill="#000000") -> None:
        """A filled rectangle."""
        self.items.append(("rect", float(x), float(y), float(w), float(h), fill))

    def circle(self, x, y, r, fill="#000000") -> None:
        """A filled circle."""
        self.items.append(("circle", float(x), float(y), float(r), fill))

    def text(self, x, y, s, color="#000000", size=11, anchor="start") -> None:
        """Text whose baseline starts (or centres, or ends: `anchor`) at (x, y)."""
        self.items.append(("text", float(x), float(y), str(s), color, int(size), anchor))

    def svg(self) -> str:
        """The drawing as SVG text (deterministic: same drawing, same bytes)."""
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
               f'viewBox="0 0 {self.width} {self.height}" font-family="{FONT}">',
               f'<rect x="0" y="0" width="{self.width}" height="{self.height}" fill="#ffffff"/>']
        for it in self.items:
            kind = it[0]
            if kind == "line":
                _, x0, y0, x1, y1, c, w, dash = it
                d = ' stroke-dasharray="4 3"' if dash else ""
                out.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="{c}" '
                           f'stroke-width="{w:g}"{d}/>')
            elif kind == "rect":
                _, x, y, w, h, c = it
                out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{c}"/>')
            elif kind == "circle":
                _, x, y, r, c = it
                out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r:g}" fill="{c}"/>')
            else:
                _, x, y, s, c, size, anchor = it
                out.append(f'<text x="{x:.1f}" y="{y:.1f}" fill="{c}" font-size="{size}" '
                           f'text-anchor="{anchor}">{escape(s)}</text>')
        out.append("</svg>")
        return "\n".join(out) + "\n"
