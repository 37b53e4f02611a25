"""What a source that cannot be read raises: one line for the user, and the CLI's exit status by its kind."""

from __future__ import annotations

# how a recording cut short (its writer killed, its disk full) ends: the whole frames before the cut play, then a
# Bye whose reason begins with these words; a summary of it says it covers what was read up to the cut
CUT_SHORT = "the recording is cut short"


class SourceError(RuntimeError):
    """A source that cannot be read; str() is one line for the user."""


class NothingMeasured(SourceError):
    """The source ended (or the time ran out) before a single token was measured."""


class NotAnswering(NothingMeasured):
    """The target did not answer in time (stopped, or its main thread held in C code): nothing was measured, and
    nothing the user gave was wrong."""
