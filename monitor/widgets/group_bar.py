"""Group bar: one tensor-parallel group, who the others wait for, the all-reduce's price, every rank's verdict."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from decodemon.monitor.ceilings import peer_wait_named
from decodemon.monitor.widgets import tcss
from decodemon.monitor.widgets.format import num


class GroupBar(Static):
    """The ranks of one group combined (`ranks.combine`); `group` keeps the last combination."""

    DEFAULT_CSS = tcss(__file__)
    group: dict | None = None

    def show(self, snaps) -> None:
        """Draw the group of these ranks' snapshots."""
        from decodemon.monitor.ranks import combine

        g = combine(snaps)
        self.group = g
        self._parts = group_parts(g)
        self.update(packed(self._parts, self.content_size.width))

    def on_resize(self) -> None:
        """Re-pack the parts for the new width."""
        if getattr(self, "_parts", None):
            self.update(packed(self._parts, self.content_size.width))


ARRIVAL_LAG_SHARE = 0.02  # a typical call's lag behind the last rank under 2% of the call: the ranks arrive together


def group_parts(g: dict) -> list[Text]:
    """The bar's phrases: TP degree, the all-reduce's price, who the others wait for, every rank's verdict."""
    parts = [Text(f"TP={g['tp']}", style="bold")]
    if g.get("not_one_run"):
        parts.append(Text(f"⚠ {g['not_one_run']}", style="bold yellow"))
    last = g.get("last_to_arrive_rank")
    ranks = {r["tp_rank"]: r for r in g["ranks"]}
    if last is not None and last in ranks:
        c = ranks[last]["collectives"]
        share = num(c.get('share_of_step_pct'), '.1f')
        parts.append(Text(f"all-reduce {num(g['collective_us_per_call'], '.1f')} µs/call × "
                          f"{num(c.get('calls_per_token'), '.0f')}/token = {share}% of the step", style="bold"))
        parts.append(Text(f"(a call: kernel {num(c.get('kernel_us_per_call'), '.1f')} + launch gap "
                          f"{num(c.get('launch_gap_us_per_call'), '.1f')})", style="bold"))
        lag = max((r["collectives"] or {}).get("waits_for_peers_us_per_call") or 0.0 for r in g["ranks"])
        own = c.get("kernel_us_per_call") or 0.0
        waits = [(r["tp_rank"], (r["collectives"] or {}).get("wait_ms_per_token") or 0.0) for r in g["ranks"]]
        step = max((r["ms_per_token"] or 0.0) for r in g["ranks"])
        if sum(1 for _, w in waits if peer_wait_named(w, step)) > 1:
            # each rank waits milliseconds for the other at some calls, though a typical call does not lag: the
            # ranks run late by turns (both traced in the same tokens), so no one rank holds the others back
            each = ", ".join(f"rank {k} {w:.3g}" for k, w in waits)
            parts.append(Text(f"the ranks wait for each other by turns ({each} ms/token)"))
        elif own and lag >= ARRIVAL_LAG_SHARE * own:
            parts.append(Text(f"the others wait for rank {last} ({lag:.2g} µs/call)"))
        else:  # a lag this small is the kernels' own jitter, not a late rank
            parts.append(Text(f"the ranks arrive together ({lag:.2g} µs/call apart)"))
    else:
        parts.append(Text("all-reduce: waiting for a traced window on two ranks", style="dim"))
    parts.append(Text("verdicts: " + ", ".join(f"rank {r['tp_rank']} {str(r['verdict']).upper()}" for r in g["ranks"])))
    return parts


def packed(parts: list[Text], width: int) -> Text:
    """The phrases two spaces apart, a new line before any that would not fit whole in `width` (0: one line)."""
    t, used = Text(), 0
    for p in parts:
        if used and width and used + 2 + len(p.plain) > width:
            t.append("\n")
            used = 0
        elif used:
            t.append("  ")
            used += 2
        t.append_text(p)
        used += len(p.plain)
    return t
