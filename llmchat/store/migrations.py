"""The history database's schema, as an append-only list of migrations (the simonw/llm pattern).

Each migration is a function registered in order; the `_migrations` table records which ones
ran, and the store runs the pending ones in one transaction when it opens the database, so a
failing migration leaves the file as it was. A released migration is never edited or reordered:
a change to the schema is a new function at the end.
"""

from __future__ import annotations

import sqlite3
from typing import Callable

from llmchat.store.records import utc_now

Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: list[Migration] = []


def migration(fn: Migration) -> Migration:
    """Register a schema change. Never edit or reorder a released one: append a new one."""
    MIGRATIONS.append(fn)
    return fn


@migration
def m001_conversations_and_messages(db: sqlite3.Connection) -> None:
    db.execute(
        """
        CREATE TABLE conversations (
            id TEXT PRIMARY KEY,
            name TEXT,
            model TEXT NOT NULL,
            model_path TEXT NOT NULL,
            template TEXT NOT NULL,
            system_prompt TEXT,
            sampling_json TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )
        """
    )
    db.execute(
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY,
            conversation_id TEXT NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            interrupted INTEGER NOT NULL DEFAULT 0,
            finish_reason TEXT,
            stats_json TEXT,
            sampling_json TEXT,
            created_at TEXT NOT NULL
        )
        """
    )


@migration
def m002_indexes_and_unique_names(db: sqlite3.Connection) -> None:
    # The unique (conversation, seq) pair is what keeps concurrent writers from interleaving
    # two turns under the same position; names are optional but must not be ambiguous.
    db.execute("CREATE UNIQUE INDEX messages_conversation_seq ON messages(conversation_id, seq)")
    db.execute("CREATE INDEX conversations_updated_at ON conversations(updated_at)")
    db.execute("CREATE UNIQUE INDEX conversations_name ON conversations(name) WHERE name IS NOT NULL")


@migration
def m003_message_reasoning(db: sqlite3.Connection) -> None:
    # A reasoning model's thinking, apart from the reply in `content`: shown and exported, marked
    # as reasoning, but never sent back to the model with the conversation.
    db.execute("ALTER TABLE messages ADD COLUMN reasoning TEXT")


@migration
def m004_attachments(db: sqlite3.Connection) -> None:
    # Files attached to a user message (llmchat.turn.attachments): the message's `content` keeps the
    # typed words; each file's text is kept here once, with what identifies it, and the message
    # the model saw is rebuilt from both. Deleting the message (or its conversation) deletes them.
    db.execute(
        """
        CREATE TABLE attachments (
            id INTEGER PRIMARY KEY,
            message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            path TEXT NOT NULL,
            size INTEGER NOT NULL,
            sha256 TEXT NOT NULL,
            text TEXT NOT NULL
        )
        """
    )
    db.execute("CREATE UNIQUE INDEX attachments_message_position ON attachments(message_id, position)")


@migration
def m005_branches(db: sqlite3.Connection) -> None:
    # A branch (/branch N, /edit, `history fork ID --at N`) is a conversation of its own, holding a
    # copy of the turns it shares, so it reads, continues and deletes like any other; these two
    # columns only remember where it came from. Deleting the parent leaves its branches whole.
    db.execute("ALTER TABLE conversations ADD COLUMN parent_id TEXT REFERENCES conversations(id) ON DELETE SET NULL")
    db.execute("ALTER TABLE conversations ADD COLUMN branch_at INTEGER")
    db.execute("CREATE INDEX conversations_parent ON conversations(parent_id)")


@migration
def m006_tool_messages(db: sqlite3.Connection) -> None:
    # A tool turn is stored as it was sent: the user's message, an assistant message with its
    # calls, a `tool` message per result, ..., then the reply. This column holds what a tool
    # message carries besides its text (JSON): the calls, or the call id and tool name with how
    # the call went. Old rows have none.
    db.execute("ALTER TABLE messages ADD COLUMN tool_json TEXT")


@migration
def m007_message_search(db: sqlite3.Connection) -> None:
    # `history search` and /search: an FTS5 index over every message's text (external content:
    # tokens only, the text stays in `messages`), kept in step by triggers. This migration made
    # it, and failed, with the whole history, on a SQLite built without FTS5. The index is now
    # llmchat.store.search.keep_index's, run on every open after the migrations: it builds the
    # same table and triggers where FTS5 is there (an older database has them already), and the
    # history goes on without search where it is not. The name stays: databases record it as run.
    return None


@migration
def m009_message_model(db: sqlite3.Connection) -> None:
    # The model that wrote each reply (`/model NAME` switches it mid-conversation). Old rows stay
    # NULL, unknown: the conversation's own `model` is the one it started with, and `ask -c` or
    # `chat --resume` with another -m wrote replies under it too, so it cannot stand in for them.
    db.execute("ALTER TABLE messages ADD COLUMN model TEXT")


@migration
def m008_summary_messages(db: sqlite3.Connection) -> None:
    # A compaction's summary (/compact, --compact auto: llmchat.turn.compaction) is a message of
    # role `summary`, stored after the messages it stands for, which all stay. This column says
    # how many of the conversation's messages (summaries not counted) it stands for: the first N.
    # A resumed conversation starts from its latest summary and the messages after those N. It is
    # appended after m009 (which landed first); the names only have to be unique.
    db.execute("ALTER TABLE messages ADD COLUMN summarised INTEGER")


def applied_migrations(db: sqlite3.Connection) -> set[str]:
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    return {row[0] for row in db.execute("SELECT name FROM _migrations")}


def pending_migrations(db: sqlite3.Connection) -> list[str]:
    """The migrations not yet applied, found without creating anything (for read-only connections)."""
    exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'").fetchone()
    applied = {row[0] for row in db.execute("SELECT name FROM _migrations")} if exists else set()
    return [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in applied]


def migrate(db: sqlite3.Connection, migrations: list[Migration] | None = None) -> list[str]:
    """Apply the pending migrations in order; returns their names. Caller holds a transaction."""
    done = applied_migrations(db)
    ran = []
    for fn in MIGRATIONS if migrations is None else migrations:
        if fn.__name__ in done:
            continue
        fn(db)
        db.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (fn.__name__, utc_now()))
        ran.append(fn.__name__)
    return ran
