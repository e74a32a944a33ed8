"""What the history store hands out: a conversation, its messages and a list entry, as plain
dataclasses, with the ids, times and JSON columns they are written with.

Kept apart from the SQLite code so that the conversation, export and the UI can hold and read a
stored conversation without loading the store that wrote it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any


@dataclass
class StoredMessage:
    id: int
    seq: int
    role: str
    content: str
    interrupted: bool
    finish_reason: str | None
    stats: dict[str, Any]
    sampling: dict[str, Any] | None
    created_at: str
    reasoning: str | None = None  # a reasoning model's thinking (assistant messages)
    # Files sent with a user message: path, size, sha256 each (their text is inside `content`,
    # which is the message as the model saw it; `typed` is what the user wrote around them).
    attachments: list[dict[str, Any]] = field(default_factory=list)
    typed: str | None = None
    # A tool turn (llmchat.turn.tool_loop): an assistant message's `tool_calls`, or a tool result's
    # `tool_call_id` and `name`, with how its call went (`approved`, `duration_s`, `error`).
    tool: dict[str, Any] | None = None
    model: str | None = None  # the model that wrote a reply (`/model` switches it); None: not recorded
    # A compaction's summary (role `summary`, llmchat.turn.compaction): it stands for the first
    # `summarised` messages of the conversation (summaries not counted), which are all kept too.
    summarised: int | None = None

    def chat_message(self) -> dict[str, Any]:
        """The message as the model sees it again: role and content, and a tool turn's fields."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("tool_calls", "tool_call_id", "name"):
            if self.tool and key in self.tool:
                message[key] = self.tool[key]
        return message


def tool_fields(message: dict[str, Any]) -> dict[str, Any]:
    """What a tool turn's message keeps in its `tool` column: its calls, call id, name and how the
    call went; the role, the content and a round's thinking (its own column) are stored apart."""
    return {k: v for k, v in message.items() if k not in ("role", "content", "reasoning_content")}


@dataclass
class StoredConversation:
    id: str
    name: str | None
    model: str
    model_path: str
    template: str
    system_prompt: str | None
    sampling: dict[str, Any]
    created_at: str
    updated_at: str
    messages: list[StoredMessage] = field(default_factory=list)
    # Branches (/branch, /edit, `history fork`): the conversation this one was forked from, how
    # many turns it shares with it, and the branches forked from this one, as (id, turns shared).
    parent_id: str | None = None
    branch_at: int | None = None
    children: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class ConversationSummary:
    id: str
    name: str | None
    model: str
    created_at: str
    updated_at: str
    n_messages: int
    preview: str
    parent_id: str | None = None  # a branch: forked from this conversation ...
    branch_at: int | None = None  # ... sharing its first `branch_at` turns
    children: int = 0  # branches forked from this one
    n_turns: int = 0  # its user messages (a tool turn stores more than two messages)


# --------------------------------------------------------------------------- ids and time

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def _base32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        value, digit = divmod(value, 32)
        chars.append(_CROCKFORD[digit])
    return "".join(reversed(chars))


def new_id() -> str:
    """A short id that sorts by creation time: 10 chars of milliseconds + 8 random chars (ULID-like)."""
    millis = time.time_ns() // 1_000_000
    return _base32(millis, 10) + _base32(int.from_bytes(os.urandom(5), "big"), 8)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def to_json(value: dict[str, Any] | None) -> str | None:
    # default=str: a stray non-JSON value in stats must not cost the user the turn.
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def from_json(text: str | None) -> dict[str, Any] | None:
    return None if text is None else json.loads(text)
