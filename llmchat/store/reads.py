"""The history store's reads: the conversation list, one conversation whole (messages, branches,
attachments), a turn's attachments. Each function runs inside the read transaction HistoryStore
holds, so what it returns is one consistent snapshot; nothing here opens, commits or retries.
"""

from __future__ import annotations

import sqlite3

from llmchat.store.attachment_records import Attachment
from llmchat.store.queries import (
    HEADER_COLUMNS,
    LIST_SQL,
    MESSAGE_COLUMNS,
    attach_files,
    conversation_from_rows,
    resolve,
    summary_from_row,
)
from llmchat.store.records import ConversationSummary, StoredConversation


def latest_summaries(db: sqlite3.Connection, limit: int) -> list[ConversationSummary]:
    """The most recently updated conversations first."""
    return [summary_from_row(row) for row in db.execute(LIST_SQL, (limit,)).fetchall()]


def load_conversation(db: sqlite3.Connection, id_or_name: str) -> StoredConversation:
    """A conversation with its messages, the branches forked from it and its attachments."""
    conversation_id = resolve(db, id_or_name)
    header = db.execute(f"SELECT {HEADER_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
    rows = db.execute(
        f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
    ).fetchall()
    conversation = conversation_from_rows(header, rows)
    conversation.children = [
        (child, at)
        for child, at in db.execute(
            "SELECT id, branch_at FROM conversations WHERE parent_id = ? ORDER BY created_at, id",
            (conversation_id,),
        )
    ]
    attach_files(db, conversation)
    return conversation


def turn_attachments(db: sqlite3.Connection, conversation_id: str, turn: int) -> list[Attachment]:
    """The files (text included) of the user message of turn `turn` (0-based)."""
    rows = db.execute(
        "SELECT a.path, a.size, a.sha256, a.text FROM attachments a JOIN messages m ON m.id = a.message_id"
        " WHERE m.id = (SELECT id FROM messages WHERE conversation_id = ? AND role = 'user'"
        " ORDER BY seq LIMIT 1 OFFSET ?) ORDER BY a.position",
        (conversation_id, turn),
    ).fetchall()
    return [Attachment(*row) for row in rows]
