"""Kernels panel: hot kernels with their grid against the SM count (the first seed's §4)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from decodemon.monitor.widgets.format import bar

SORTS = {
    "time": (lambda r: -r.us_per_token, "µs/token"),
    "idle SMs": (lambda r: -r.idle_sm_us_per_token, "time × idle SMs"),
    "calls": (lambda r: -r.calls_per_token, "calls/token"),
}


class KernelsPanel(DataTable):
    """Sortable table of the latest traced window's kernels; `k` cycles the sort."""

    DEFAULT_CSS = """
    KernelsPanel { height: auto; max-height: 16; border: round $primary; }
    """
    BINDINGS = [("k", "cycle_sort", "sort kernels")]

    def __init__(self, **kw) -> None:
        super().__init__(zebra_stripes=True, cursor_type="row", **kw)
        self.sort = "time"
        self._last = None

    def on_mount(self) -> None:
        self.add_columns("kernel", "calls/tok", "µs mean", "share", "grid vs SMs", "occ")

    def action_cycle_sort(self) -> None:
        """Next sort order."""
        keys = list(SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]
        if self._last is not None:
            self.show(self._last)

    def show(self, s) -> None:
        """Draw one snapshot."""
        self._last = s
        w = s.window
        shown = (id(w), self.sort)
        if shown == getattr(self, "_shown", None):
            return  # the table changes only with a new traced window: re-rendering it is the app's dearest work
        self._shown = shown
        key, label = SORTS[self.sort]
        self.border_title = f"hot kernels · sorted by {label} · k: sort"
        self.clear()
        if w is None:
            return
        sms = max(s.sm_count, 1)
        for r in sorted(w.kernels, key=key)[:12]:
            frac = min(r.grid_blocks, sms) / sms
            style = "red" if r.grid_coverage_pct < 25 else "yellow" if r.grid_coverage_pct < 100 else "green"
            grid = Text(f"{r.grid_blocks:>4}/{sms} {bar(frac, 6)}", style=style)
            self.add_row(r.short_name[:30], f"{r.calls_per_token:.0f}", f"{r.us_mean:.1f}", f"{r.share_pct:.0f}%",
                         grid, f"{r.occupancy_pct:.0f}%")
