"""The agent thread's periodic work as a table of named tasks, each with its period and next due time.

The agent wakes at its ticks (`Attach.agent_tick_s`) and runs what is due. A task due every k ticks is run at the
k-th tick however late the tick before it woke: each due time is set half a tick early (`slack_s`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Periodic:
    """One named task: due at `next_at`, then every `period_s` after it ran."""

    name: str
    period_s: float
    next_at: float


@dataclass
class Schedule:
    """Named periodic tasks on one monotonic clock; the caller runs the due ones and says when each ran."""

    slack_s: float = 0.0
    tasks: dict[str, Periodic] = field(default_factory=dict)

    def add(self, name: str, period_s: float, first_at: float) -> None:
        """A task due first at `first_at` (less the slack), then every `period_s` after each run."""
        self.tasks[name] = Periodic(name, period_s, first_at - self.slack_s)

    def due(self, name: str, now: float) -> bool:
        """Is `name` due at `now`?"""
        return now >= self.tasks[name].next_at

    def ran(self, name: str, now: float) -> None:
        """`name` ran at `now`: due again a period later (less the slack)."""
        t = self.tasks[name]
        t.next_at = now + t.period_s - self.slack_s

    def due_at(self, name: str, at: float) -> None:
        """Make `name` due at `at` (sooner or later than its period says)."""
        self.tasks[name].next_at = at

    def next_at(self, name: str) -> float:
        """When `name` is due next."""
        return self.tasks[name].next_at
