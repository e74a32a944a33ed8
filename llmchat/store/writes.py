"""The history store's writes: a new conversation, a turn's messages, a fork, a new system prompt
or name. Each function is one step inside the write transaction HistoryStore holds (it opens,
commits and retries); nothing here does either.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Sequence

from llmchat.errors import UsageError
from llmchat.store.attachment_records import Attachment
from llmchat.store.queries import NewMessage, require_conversation, require_free_name, resolve, touch
from llmchat.store.records import to_json, tool_fields, utc_now


def insert_conversation(
    db: sqlite3.Connection,
    conversation_id: str,
    *,
    name: str | None,
    model: str,
    model_path: str,
    template: str,
    system_prompt: str | None,
    sampling: dict,
) -> None:
    """A conversation's header, with no messages yet; `name` must be free (checked here, in the
    transaction, so two processes cannot both take it)."""
    if name is not None:
        require_free_name(db, name)
    now = utc_now()
    header = (conversation_id, name, model, str(model_path), template, system_prompt, to_json(sampling or {}))
    db.execute(
        "INSERT INTO conversations (id, name, model, model_path, template, system_prompt,"
        " sampling_json, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (*header, now, now),
    )


def turn_messages(
    user: str,
    assistant: str,
    *,
    interrupted: bool,
    finish_reason: str | None,
    stats: dict | None,
    sampling: dict | None,
    reasoning: str | None,
    attachments: Sequence[Attachment],
    tool_messages: Sequence[dict[str, Any]],
    model: str | None,
) -> list[NewMessage]:
    """A turn's rows in order: the user message, a tool turn's calls and results, the reply."""
    return [
        NewMessage("user", user, attachments=tuple(attachments)),
        *(
            NewMessage(m["role"], m.get("content") or "", reasoning=m.get("reasoning_content"), tool=tool_fields(m))
            for m in tool_messages
        ),
        NewMessage("assistant", assistant, interrupted, finish_reason, stats, sampling, reasoning, model=model),
    ]


def copy_turns(db: sqlite3.Connection, id_or_name: str, at: int, new: str, name: str | None) -> None:
    """Conversation `new`: a copy of the first `at` turns of `id_or_name` (attachments included),
    with its model, template, system prompt and sampling. UsageError when `at` is out of range."""
    parent = resolve(db, id_or_name)
    users = [
        seq
        for (seq,) in db.execute(
            "SELECT seq FROM messages WHERE conversation_id = ? AND role = 'user' ORDER BY seq", (parent,)
        )
    ]
    if not 0 <= at <= len(users):
        raise UsageError(f"conversation {parent} has {len(users)} turns; the branch point must be 0..{len(users)}")
    if name is not None:
        require_free_name(db, name)
    end = users[at] if at < len(users) else None  # the first message not shared
    now = utc_now()
    db.execute(
        "INSERT INTO conversations (id, name, model, model_path, template, system_prompt, sampling_json,"
        " created_at, updated_at, parent_id, branch_at) SELECT ?, ?, model, model_path, template,"
        " system_prompt, sampling_json, ?, ?, id, ? FROM conversations WHERE id = ?",
        (new, name, now, now, at, parent),
    )
    shared = "conversation_id = ?" + ("" if end is None else " AND seq < ?")
    arguments = (parent,) if end is None else (parent, end)
    for (old_id,) in db.execute(f"SELECT id FROM messages WHERE {shared} ORDER BY seq", arguments).fetchall():
        cursor = db.execute(
            "INSERT INTO messages (conversation_id, seq, role, content, interrupted, finish_reason, stats_json,"
            " sampling_json, created_at, reasoning, tool_json, model, summarised) SELECT ?, seq, role, content,"
            " interrupted, finish_reason, stats_json, sampling_json, created_at, reasoning, tool_json, model,"
            " summarised FROM messages WHERE id = ?",
            (new, old_id),
        )
        db.execute(
            "INSERT INTO attachments (message_id, position, path, size, sha256, text)"
            " SELECT ?, position, path, size, sha256, text FROM attachments WHERE message_id = ?",
            (cursor.lastrowid, old_id),
        )


def set_system_prompt(db: sqlite3.Connection, conversation_id: str, system_prompt: str | None) -> None:
    require_conversation(db, conversation_id)
    db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))
    touch(db, conversation_id)


def set_name(db: sqlite3.Connection, conversation_id: str, name: str) -> None:
    require_conversation(db, conversation_id)
    require_free_name(db, name, other_than=conversation_id)
    db.execute("UPDATE conversations SET name = ? WHERE id = ?", (name, conversation_id))
    touch(db, conversation_id)
