"""Edits and branches: /edit and /branch N in the chat, `history fork ID --at N`, and the tree that
`history show` and `history list` draw.

A branch is a conversation of its own in the history, holding a copy of the turns it shares with
its parent (`HistoryStore.fork`), plus where it came from (parent, branch point). That keeps every
other command unchanged: a branch is read, continued (`ask -c --cid ID`, `chat --resume ID`,
`/load`), exported and deleted like any conversation.

It also costs no prefill: the shared turns render to the same tokens as in the parent, so the
first turn of a branch reuses them from the KV cache in memory (the engine keeps the longest
common prefix) or, in a new process, from the parent's KV file on disk (the store restores the
longest saved prefix, whichever conversation saved it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from llmchat.store.history import HistoryStore
    from llmchat.store.records import ConversationSummary
    from llmchat.turn.conversation import Conversation


def turn_starts(conversation: Conversation) -> list[int]:
    """The index of each turn's user message."""
    return [i for i, message in enumerate(conversation.messages) if message["role"] == "user"]


def fork_point(conversation_id: str | None, fork_from: tuple[str, int] | None, turns: int) -> tuple[str, int] | None:
    """Where the next saved turn forks once a conversation is cut to its first `turns` turns:
    the stored conversation at that turn; a branch not saved yet, cut further, forks earlier; an
    unsaved conversation (history off, or no reply yet) forks nothing."""
    if conversation_id is not None:
        return conversation_id, turns
    if fork_from is not None:
        return fork_from[0], min(fork_from[1], turns)
    return None


class StoredTurns(Protocol):
    """What the last user turn is read from (a chat session): its conversation, where it is stored
    or forks from, and the history that holds a loaded message's files."""

    @property
    def conversation(self) -> Conversation: ...

    @property
    def conversation_id(self) -> str | None: ...

    @property
    def fork_from(self) -> tuple[str, int] | None: ...

    @property
    def history(self) -> HistoryStore | None: ...


def last_user_turn(session: StoredTurns) -> tuple[str, tuple[Any, ...]] | None:
    """The last user message as typed, and the files it carried (None: no message yet). A message
    loaded from the history (/load, --resume) has its files looked up there."""
    conversation = session.conversation
    starts = turn_starts(conversation)
    if not starts:
        return None
    message = conversation.messages[starts[-1]]
    files = tuple(message.get("attachments") or ())
    stored_in = session.conversation_id or (session.fork_from or (None,))[0]
    if not files and stored_in is not None and session.history is not None and message["content"].startswith("<file"):
        files = tuple(session.history.turn_attachments(stored_in, len(starts) - 1))
    if files:
        from llmchat.store.attachment_records import typed_part

        return typed_part(message["content"], files), files
    return message["content"], ()


# --------------------------------------------------------------------------- the tree


def draw_tree(family: list[ConversationSummary], current: str | None = None) -> list[str]:
    """The conversations of one tree as text lines, each branch under its parent with its branch
    point: `└─ 01abc… · 3 turns · from turn 2 · "first message"`. `current` is marked."""
    ids = {member.id for member in family}
    children: dict[str | None, list[ConversationSummary]] = {}
    for member in family:
        parent = member.parent_id if member.parent_id in ids else None
        children.setdefault(parent, []).append(member)
    lines: list[str] = []

    def describe(member: ConversationSummary) -> str:
        turns = member.n_turns
        parts = [member.id + (f" ({member.name})" if member.name else ""), f"{turns} turn{'s' if turns != 1 else ''}"]
        if member.branch_at is not None and member.parent_id in ids:
            parts.append(f"branch at turn {member.branch_at}")
        parts.append(repr(member.preview) if member.preview else "(empty)")
        return " · ".join(parts) + ("   <- this one" if member.id == current else "")

    def walk(member: ConversationSummary, indent: str, last: bool, top: bool) -> None:
        lines.append((indent + ("└─ " if last else "├─ ") if not top else "") + describe(member))
        kids = children.get(member.id, [])
        below = indent + ("   " if last else "│  ") if not top else ""
        for index, kid in enumerate(kids):
            walk(kid, below, index == len(kids) - 1, False)

    for root in children.get(None, []):
        walk(root, "", True, True)
    return lines
