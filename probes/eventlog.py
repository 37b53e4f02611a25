"""What the agent thread did and when, for attributing slow tokens to it: a diagnostic, on only when
DECODEMON_AGENT_EVENTS names a file prefix."""

from __future__ import annotations

import os
import time


class EventLog:
    """Rows of (unix ns, what, values...); each attach writes PREFIX.<unix s>.json when it ends."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.rows = prefix, []

    @classmethod
    def from_env(cls) -> "EventLog | None":
        """The log DECODEMON_AGENT_EVENTS asks for, or None."""
        p = os.environ.get("DECODEMON_AGENT_EVENTS")
        return cls(p) if p else None

    def add(self, what: str, *vals: int) -> None:
        """An event that ended now."""
        self.add_at(time.time_ns(), what, *vals)

    def add_at(self, t_ns: int, what: str, *vals: int) -> None:
        """An event that ended at t_ns (wall clock), e.g. a PM arm made before the log existed."""
        if len(self.rows) < 200_000:
            self.rows.append((t_ns, what, *vals))

    def write(self) -> None:
        """Write the rows as JSON (a file that cannot be written is skipped)."""
        import json

        try:
            with open(f"{self.prefix}.{int(time.time())}.json", "w") as fh:
                json.dump(self.rows, fh)
        except OSError:
            pass
