"""Kernels panel: the hot kernels, each with its grid against the SM count (a grid smaller than the SM count leaves
SMs idle however fast the kernel is)."""

from __future__ import annotations

from rich.text import Text
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import DataTable

from decodemon.monitor.analysis.names import short_kernel_name
from decodemon.monitor.render.text import in_marks
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import bar
from decodemon.monitor.widgets.panel import SourceNamed
from decodemon.monitor.widgets.probe_words import tracing_unavailable

SORTS = {
    "time": (lambda r: -r.us_per_token, "share of kernel time"),
    "idle SMs": (lambda r: -r.idle_sm_us_per_token, "time × idle SMs"),
    "calls": (lambda r: -r.calls_per_token, "calls/token"),
}


def next_sort(sort: str) -> str:
    """The sort order after `sort`, cycling."""
    keys = list(SORTS)
    return keys[(keys.index(sort) + 1) % len(keys)]


# calls a token, µs a call, the share of all the kernels' time, the grid against the SMs, and warp occupancy (the
# warps a kernel's blocks keep resident on an SM: not the OCCUPANCY ceiling, which is the grid against the SMs)
COLUMNS = ("kernel", "calls", "µs/call", "share", "grid/SMs", "warps")
# what the five columns beside the name take with their padding ("100%" under warps, a 4-cell bar under grid/SMs),
# so an 80-column terminal shows every column whole, with no horizontal scrollbar
OTHER_COLUMNS = 48
MIN_NAME = 16
GRID_BAR = 4


def kernel_name_width(panel_width: int) -> int:
    """Characters the kernel column can have in a panel this wide (at least MIN_NAME)."""
    return max(MIN_NAME, panel_width - OTHER_COLUMNS)


def cut(name: str, width: int) -> str:
    """`name` in `width` characters, cut in its middle where it is longer: names that share a long head differ in
    their tails (a Triton kernel's fused ops, `..._where_5` and `..._where_6`), so the tail stays."""
    if len(name) <= width:
        return name
    tail = min(14, max(width - 1, 0) // 3)
    return name[: width - 1 - tail] + "…" + (name[-tail:] if tail else "")


def kernel_label(short: str, full: str, width: int, label: str = "") -> str:
    """The kernel's name in `width` characters. A row whose short name another row shares has a `label` with a tag
    (`native::elementwise_kernel<direct_copy,BFloat16>`, as --json and DIAGNOSIS name it): the tag is kept whole and
    the short name cut before it. Otherwise the full name when it fits, else the short one, cut with an ellipsis. A
    mangled full name (`_ZN2at6native…`) is not a name to read: the short one stands for it."""
    tag = label[len(short):] if label.startswith(short) else ""
    if label and not tag and label != short:  # a full name that tells it from another of its short name
        return cut(label, width)
    if tag:
        if len(label) <= width:
            return label
        room = max(width - len(tag), 2)
        return (short[: room - 1] + "…" + tag)[:width]
    if len(full) <= width and not full.startswith("_Z"):
        return full
    if short.endswith("…") and width > len(short):  # cut for a narrower column than this one: as much as fits
        short = short_kernel_name(full, width)
    return cut(short, width)


class KernelsPanel(SourceNamed, DataTable):
    """Table of the latest traced window's kernels; the app's `k` cycles `sort`."""

    DEFAULT_CSS = tcss(__file__)
    sort: reactive[str] = reactive("time", init=False)

    def __init__(self, **kw) -> None:
        super().__init__(zebra_stripes=True, cursor_type="row", **kw)
        self._last = None
        self._shown = None

    def on_mount(self) -> None:
        """Columns, and the title for the default sort."""
        self.add_columns(*COLUMNS)
        self.border_title = Content(self.title_for_sort())  # as it reads: why no window comes may quote the probe

    def title_for_sort(self) -> str:
        """The border title: what the table is sorted by, and the key that changes it."""
        if getattr(self, "_empty", ""):
            return f"hot kernels · {self._empty}"
        by = SORTS[self.sort][1]
        if self._last is not None:  # a batched engine's marks are steps
            by = in_marks(self._last, by)
        return f"hot kernels · sorted by {by} · k: sort"

    def watch_sort(self) -> None:
        """Redraw in the new order."""
        self.border_title = Content(self.title_for_sort())
        if self._last is not None:
            self.show(self._last)

    def on_resize(self, event) -> None:
        """A wider or narrower panel (maximised, or the terminal resized) shows more or less of each name."""
        self._shown = None
        if self._last is not None:
            self.show(self._last)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s
        w = s.window
        # with no window, why none comes can change (a CPU target is known as one once it reports)
        shown = (id(w), self.sort, tracing_unavailable(s) if w is None else None)
        if shown == self._shown:
            return  # the table changes only with a new traced window: re-rendering it is the app's dearest work
        self._shown = shown
        # columns only widen as rows come: they are laid out again, so a narrower panel gets narrower names
        self.clear(columns=True)
        self.add_columns(*COLUMNS)
        self._empty = "" if w is not None else (tracing_unavailable(s) or "no traced window yet")
        self.border_title = Content(self.title_for_sort())  # an empty table says why in its title
        if w is None:
            return
        sms = max(s.sm_count, 1)
        width = kernel_name_width(self.size.width)
        for r in sorted(w.kernels, key=SORTS[self.sort][0])[:12]:
            frac = min(r.grid_blocks, sms) / sms
            style = "red" if r.grid_coverage_pct < 25 else "yellow" if r.grid_coverage_pct < 100 else "green"
            grid = Text(f"{r.grid_blocks:>4}/{sms} {bar(frac, GRID_BAR)}", style=style)
            # the name as Text, as it reads: a str cell is read as Textual markup, and C++ names hold brackets
            # ("[lambda()#1]"), as may a target's own
            name = Text(kernel_label(r.short_name, r.name, width, r.label), no_wrap=True, end="")
            self.add_row(name, f"{r.calls_per_token:.0f}", f"{r.us_mean:.1f}", f"{r.share_pct:.0f}%", grid,
                         f"{r.occupancy_pct:.0f}%")
