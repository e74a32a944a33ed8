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

An image or audio clip attached to a user message (`-f photo.png`) is kept here too, once per
content, as `attached-SHA256`: the message's marker (`<__media__ SHA256>`, llmchat.engine.
media.marks) names it, so it goes with the last message whose attachment names it, and a resumed
conversation shows the model the same image (llmchat.media.use).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Sequence

from llmchat.engine.media.marks import MARKER, marker
from llmchat.private_files import own_private_dir, write_private_atomic
from llmchat.store.attachment_records import Attachment

ATTACHED = "attached-"  # the name an attached image or audio clip is kept under, before its SHA-256
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
    named = {folder / match.group(1).rstrip(".") for text in texts if text for match in pattern.finditer(text)}
    return named | {attached_file(folder, found.group(1)) for text in texts if text for found in MARKER.finditer(text)}


def attached_file(folder: Path, sha256: str) -> Path:
    return folder / f"{ATTACHED}{sha256}"


def keep_attached(folder: Path, attachments: Sequence[Attachment]) -> None:
    """Keep each image or audio clip of a saved message, once per content, private (0600 in 0700)."""
    for attachment in attachments:
        if attachment.media and attachment.data:
            path = attached_file(own_private_dir(folder), attachment.sha256)
            if not path.exists():
                write_private_atomic(path, attachment.data)


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
        path for path in files if not any(db.execute(sql, (_name_of(path),)).fetchone() for sql in NAMED_ANYWHERE_SQL)
    )


def _name_of(path: Path) -> str:
    """How the database's text names a file: its full path, or an attached one's marker."""
    return marker(path.name[len(ATTACHED) :]) if path.name.startswith(ATTACHED) else str(path)


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
