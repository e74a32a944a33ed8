"""The history store's deletes: the last exchange (/undo), one conversation, every conversation.

Each function is one step inside the write transaction HistoryStore holds, and returns the MCP
media files that no message left names (llmchat.store.media_files): the store removes them only
after the commit, so a failed delete keeps its files. Checkpointing the WAL and VACUUM, which
work on the connection rather than in a transaction, stay with the store.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from llmchat.store import media_files
from llmchat.store.queries import require_conversation, resolve, touch, trailing_exchange
from llmchat.store.search import forget_deleted


def last_exchange(db: sqlite3.Connection, conversation_id: str, media_dir: Path) -> tuple[int, list[Path]]:
    """Remove the trailing reply and the user message it answered (a trailing user message
    without a reply alone); returns the rows removed and the media files left orphaned."""
    require_conversation(db, conversation_id)
    tail = db.execute(
        "SELECT id, role FROM messages WHERE conversation_id = ? AND seq >= COALESCE((SELECT MAX(seq)"
        " FROM messages WHERE conversation_id = ? AND role = 'user'), 0) ORDER BY seq DESC",
        (conversation_id, conversation_id),
    ).fetchall()
    doomed = trailing_exchange(tail)
    named = media_files.named_in(media_files.texts_of_messages(db, doomed), media_dir)
    db.executemany("DELETE FROM messages WHERE id = ?", [(row_id,) for row_id in doomed])
    if doomed:
        touch(db, conversation_id)
        forget_deleted(db)  # the search index's copy of the words
    return len(doomed), media_files.unnamed(db, named)


def conversation(db: sqlite3.Connection, id_or_name: str, media_dir: Path) -> list[Path]:
    """Remove a conversation and its messages; returns the media files left orphaned."""
    conversation_id = resolve(db, id_or_name)
    named = media_files.named_in(media_files.texts_of_conversation(db, conversation_id), media_dir)
    db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))  # messages cascade
    forget_deleted(db)  # the search index's copy of their words
    return media_files.unnamed(db, named)  # a branch may name the same files


def everything(db: sqlite3.Connection) -> None:
    """Remove every conversation and message, and the search index's copy of their words."""
    db.execute("DELETE FROM messages")
    db.execute("DELETE FROM conversations")
    forget_deleted(db)
