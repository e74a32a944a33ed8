"""The SQL behind the history store: each function does one step inside a transaction the store
holds, and turns rows into the records of llmchat.store.records.

Kept apart from HistoryStore so the store reads as its operations (open, retry, write, read) and
this module as the statements they run; nothing here opens, commits or retries.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from llmchat.errors import HistoryError, UsageError
from llmchat.store.attachment_records import Attachment, prefix, typed_part
from llmchat.store.records import (
    ConversationSummary,
    StoredConversation,
    StoredMessage,
    from_json,
    to_json,
    utc_now,
)

ROLES = ("system", "user", "assistant", "tool", "summary")  # summary: a compaction's (m008)
PREVIEW_CHARS = 60

HEADER_COLUMNS = (
    "id, name, model, model_path, template, system_prompt, sampling_json, created_at, updated_at, parent_id, branch_at"
)
MESSAGE_COLUMNS = (
    "id, seq, role, content, interrupted, finish_reason, stats_json, sampling_json, created_at, reasoning, tool_json,"
    " model, summarised"
)

SUMMARY_SQL = """
SELECT c.id, c.name, c.model, c.created_at, c.updated_at,
       (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id),
       (SELECT m.content FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user'
        ORDER BY m.seq LIMIT 1),
       c.parent_id, c.branch_at,
       (SELECT COUNT(*) FROM conversations k WHERE k.parent_id = c.id),
       (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user')
FROM conversations c {where}
"""
LIST_SQL = SUMMARY_SQL.format(where="") + " ORDER BY c.updated_at DESC, c.id DESC LIMIT ?"


@dataclass
class NewMessage:
    role: str
    content: str
    interrupted: bool = False
    finish_reason: str | None = None
    stats: dict | None = None
    sampling: dict | None = None
    reasoning: str | None = None
    attachments: tuple[Attachment, ...] = ()
    tool: dict | None = None
    model: str | None = None  # the model that wrote a reply
    summarised: int | None = None  # a summary: how many of the conversation's messages it stands for


def append_messages(db: sqlite3.Connection, conversation_id: str, messages: list[NewMessage]) -> list[int]:
    require_conversation(db, conversation_id)
    # Safe across processes: the IMMEDIATE transaction holds the write lock while we count.
    (seq,) = db.execute(
        "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    now = utc_now()
    row_ids = [
        insert_message(db, conversation_id, seq + offset, message, now) for offset, message in enumerate(messages)
    ]
    touch(db, conversation_id, now)
    return row_ids


def insert_message(db: sqlite3.Connection, conversation_id: str, seq: int, message: NewMessage, now: str) -> int:
    if message.role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {message.role!r}")
    content = typed_part(message.content, message.attachments)
    cursor = db.execute(
        "INSERT INTO messages (conversation_id, seq, role, content, interrupted, finish_reason,"
        " stats_json, sampling_json, created_at, reasoning, tool_json, model, summarised)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            conversation_id,
            seq,
            message.role,
            content,
            int(bool(message.interrupted)),
            message.finish_reason,
            to_json(message.stats),
            to_json(message.sampling),
            now,
            message.reasoning,
            to_json(message.tool),
            message.model,
            message.summarised,
        ),
    )
    assert cursor.lastrowid is not None  # an INSERT always sets it
    db.executemany(
        "INSERT INTO attachments (message_id, position, path, size, sha256, text) VALUES (?, ?, ?, ?, ?, ?)",
        [(cursor.lastrowid, i, a.path, a.size, a.sha256, a.text) for i, a in enumerate(message.attachments)],
    )
    return cursor.lastrowid


def touch(db: sqlite3.Connection, conversation_id: str, now: str | None = None) -> None:
    db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now or utc_now(), conversation_id))


def trailing_exchange(tail: list[tuple[int, str]]) -> list[int]:
    """Row ids of the last exchange, given the messages from the last user message on, newest
    first: the reply, a tool turn's calls and results, and the user message they answer. A summary
    written after that message (a compaction: llmchat.turn.compaction) goes with it, as the
    conversation in memory drops it (`Conversation.drop_last_exchange`)."""
    summaries = [row_id for row_id, role in tail if role == "summary"]
    tail = [(row_id, role) for row_id, role in tail if role != "summary"]
    if not tail:
        return []
    if tail[0][1] == "assistant" and tail[-1][1] == "user":
        return [row_id for row_id, _ in tail] + summaries
    return [tail[0][0]] + summaries


def require_conversation(db: sqlite3.Connection, conversation_id: str) -> None:
    if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
        raise HistoryError(f"no conversation with id {conversation_id} in the history database")


def check_name(name: str) -> None:
    if not name.strip():
        raise UsageError("a conversation name cannot be empty")
    if name == "last":  # `get("last")` means the latest conversation; this name could never be reached
        raise UsageError("'last' is reserved for the latest conversation; choose another name")


def require_free_name(db: sqlite3.Connection, name: str, other_than: str | None = None) -> None:
    row = db.execute("SELECT id FROM conversations WHERE name = ?", (name,)).fetchone()
    if row is not None and row[0] != other_than:
        raise UsageError(f"the name {name!r} is already used by conversation {row[0]}; choose another")


def _latest_id(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT id FROM conversations ORDER BY updated_at DESC, id DESC LIMIT 1").fetchone()
    return None if row is None else row[0]


def resolve(db: sqlite3.Connection, id_or_name: str) -> str:
    """Full id, then name, then unique id prefix; "last" means the latest updated conversation."""
    ref = id_or_name.strip()
    if not ref:
        raise UsageError("give a conversation id, id prefix, name, or 'last'")
    if ref == "last":
        return _last_or_fail(db)
    # Ids are lower case, so an id typed in capitals still matches; names match exactly.
    row = db.execute("SELECT id FROM conversations WHERE id = ?", (ref.lower(),)).fetchone()
    if row is None:
        row = db.execute("SELECT id FROM conversations WHERE name = ?", (ref,)).fetchone()
    return row[0] if row is not None else _unique_prefix(db, ref)


def _last_or_fail(db: sqlite3.Connection) -> str:
    conversation_id = _latest_id(db)
    if conversation_id is None:
        raise UsageError("there are no conversations in the history yet")
    return conversation_id


def _unique_prefix(db: sqlite3.Connection, ref: str) -> str:
    # substr() rather than LIKE: no wildcard characters to escape in what the user typed.
    matches = [
        row[0]
        for row in db.execute(
            "SELECT id FROM conversations WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT 4", (len(ref), ref.lower())
        )
    ]
    if not matches:
        raise UsageError(f"no conversation matches {ref!r}; see `llmchat history list`")
    if len(matches) > 1:
        shown = ", ".join(matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise UsageError(f"{ref!r} matches several conversations ({shown}); type more of the id")
    return matches[0]


def summary_from_row(row: tuple) -> ConversationSummary:
    conversation_id, name, model, created_at, updated_at, n_messages, first_user, parent, at, children, turns = row
    return ConversationSummary(
        conversation_id,
        name,
        model,
        created_at,
        updated_at,
        n_messages,
        _preview(first_user),
        parent,
        at,
        children,
        turns,
    )


def _preview(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def conversation_from_rows(header: tuple, message_rows: list[tuple]) -> StoredConversation:
    cid, name, model, model_path, template, system_prompt, sampling_json, created_at, updated_at = header[:9]
    parent_id, branch_at = header[9:11]
    return StoredConversation(
        id=cid,
        name=name,
        model=model,
        model_path=model_path,
        template=template,
        system_prompt=system_prompt,
        sampling=from_json(sampling_json) or {},
        created_at=created_at,
        updated_at=updated_at,
        messages=[message_from_row(row) for row in message_rows],
        parent_id=parent_id,
        branch_at=branch_at,
    )


def attach_files(db: sqlite3.Connection, conversation: StoredConversation) -> None:
    """Give each message its attachments and rebuild the text the model saw (typed words kept apart)."""
    rows = db.execute(
        "SELECT a.message_id, a.path, a.size, a.sha256, a.text FROM attachments a"
        " JOIN messages m ON m.id = a.message_id WHERE m.conversation_id = ? ORDER BY a.message_id, a.position",
        (conversation.id,),
    ).fetchall()
    if not rows:
        return
    by_message: dict[int, list[Attachment]] = {}
    for message_id, path, size, sha256, text in rows:
        by_message.setdefault(message_id, []).append(Attachment(path, size, sha256, text))
    for message in conversation.messages:
        files = by_message.get(message.id)
        if files:
            message.typed = message.content
            message.content = prefix(files) + message.content
            message.attachments = [a.describe() for a in files]


def message_from_row(row: tuple) -> StoredMessage:
    (
        row_id,
        seq,
        role,
        content,
        interrupted,
        finish_reason,
        stats_json,
        sampling_json,
        created_at,
        reasoning,
        tool,
        model,
        summarised,
    ) = row
    return StoredMessage(
        id=row_id,
        seq=seq,
        role=role,
        content=content,
        interrupted=bool(interrupted),
        finish_reason=finish_reason,
        stats=from_json(stats_json) or {},
        sampling=from_json(sampling_json),
        created_at=created_at,
        reasoning=reasoning,
        tool=from_json(tool),
        model=model,
        summarised=summarised,
    )


def family_of(db: sqlite3.Connection, id_or_name: str) -> list[ConversationSummary]:
    """Every conversation in the tree `id_or_name` belongs to (from its root down), oldest first."""
    root = resolve(db, id_or_name)
    seen = {root}
    while True:  # up to the root; `seen` guards against a cycle in a hand-edited database
        row = db.execute("SELECT parent_id FROM conversations WHERE id = ?", (root,)).fetchone()
        if row is None or row[0] is None or row[0] in seen:
            break
        root = row[0]
        seen.add(root)
    members, frontier = [root], [root]
    while frontier:
        marks = ",".join("?" * len(frontier))
        found = [
            r[0]
            for r in db.execute(f"SELECT id FROM conversations WHERE parent_id IN ({marks})", frontier)
            if r[0] not in members
        ]
        members += found
        frontier = found
    marks = ",".join("?" * len(members))
    rows = db.execute(
        SUMMARY_SQL.format(where=f"WHERE c.id IN ({marks})") + " ORDER BY c.created_at, c.id", members
    ).fetchall()
    return [summary_from_row(row) for row in rows]
