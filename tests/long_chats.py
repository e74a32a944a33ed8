"""Long conversations for the tests of what happens when the context fills up (compaction, the
room for files): messages long enough that the exchanges summarised outweigh any summary of them,
and a session's window filled with exchanges written, not generated (no reply's words matter)."""

from __future__ import annotations

# About 90 tokens: long enough that the exchanges summarised outweigh any summary of them.
FILLER = (
    "The harbour town keeps its old lighthouse, a stone tower painted white and red, and every evening "
    "the keeper climbs ninety steps to light the lamp for the fishing boats that come home late. "
    "In winter the storms break over the pier, the market moves indoors, and the bakery sells bread "
    "to the sailors before dawn while the gulls wait on the roofs."
)


def message(i: int) -> str:
    return f"Note {i}: {FILLER} Reply with one word."


def fill(session, until: int) -> None:
    """Add plain exchanges to the session's conversation until its prompt takes `until` tokens."""
    i = len(session.conversation.messages) // 2
    while session.context_used() < until:
        session.conversation.add_exchange(message(i), f"Noted {i}.")
        i += 1
