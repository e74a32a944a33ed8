"""The MCP media files a conversation holds, so that they go when it goes.

An image, audio clip or blob an MCP server returns is saved once in the media folder
(`paths.mcp_media_dir()`, by llmchat.tools.mcp.results) and named by its full path in the text
the conversation keeps: the tool result the model got (`[image image/png, N bytes, saved to
PATH]`), a prompt's message, a reply that repeats it. That text is the record of which files
belong to which conversation: a branch copies it with the turns it shares, two conversations may
name the same file (it is named by its content's hash), and a conversation saved before this
module existed names its files the same way. So when messages are deleted (`history rm`, /undo),
each file their text named that no message left names is removed, in the same transaction's
view of the database; `history rm --all` removes the whole folder (`clear`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
from pathlib import Path

# The names results.save_media gives: STEM-HASH.EXT, from these characters only.
FILE_NAME = r"[A-Za-z0-9_.-]+"

NAMED_ANYWHERE_SQL = (
    "SELECT 1 FROM messages WHERE instr(content, ?1) OR instr(coalesce(reasoning, ''), ?1)"
    " OR instr(coalesce(tool_json, ''), ?1) LIMIT 1",
    "SELECT 1 FROM attachments WHERE instr(text, ?1) LIMIT 1",
)


def named_in(texts: list[str], folder: Path) -> set[Path]:
    """The files of `folder` that these texts name by their full path."""
    pattern = re.compile(re.escape(str(folder) + os.sep) + f"({FILE_NAME})")
    # A name is followed by `]` or `,` in a placeholder; a sentence's full stop is not part of it.
    return {folder / match.group(1).rstrip(".") for text in texts if text for match in pattern.finditer(text)}


def texts_of_conversation(db: sqlite3.Connection, conversation_id: str) -> list[str]:
    """Every text one conversation holds: its messages' and their attachments'."""
    ids = [row[0] for row in db.execute("SELECT id FROM messages WHERE conversation_id = ?", (conversation_id,))]
    return texts_of_messages(db, ids)


def texts_of_messages(db: sqlite3.Connection, ids: list[int]) -> list[str]:
    """Every text of these messages: content, reasoning, tool details, attachments."""
    texts: list[str] = []
    for message_id in ids:
        row = db.execute("SELECT content, reasoning, tool_json FROM messages WHERE id = ?", (message_id,)).fetchone()
        texts.extend(value for value in row or () if isinstance(value, str))
        texts.extend(text for (text,) in db.execute("SELECT text FROM attachments WHERE message_id = ?", (message_id,)))
    return texts


def unnamed(db: sqlite3.Connection, files: set[Path]) -> list[Path]:
    """Those of `files` that no message (or attachment) left in the database names."""
    return sorted(
        path for path in files if not any(db.execute(sql, (str(path),)).fetchone() for sql in NAMED_ANYWHERE_SQL)
    )


def remove(files: list[Path]) -> None:
    """Remove the files a delete left unnamed. One that is gone already, or that cannot be removed,
    is left: the conversation itself is deleted by now."""
    for path in files:
        with contextlib.suppress(OSError):
            path.unlink()


def clear(folder: Path) -> None:
    """Remove the media folder and everything in it (`history rm --all`: what `llmchat mcp call`
    saved outside any conversation too)."""
    shutil.rmtree(folder, ignore_errors=True)
