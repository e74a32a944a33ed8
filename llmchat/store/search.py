"""Full-text search over every conversation's messages (`llmchat history search`, /search).

The index is the FTS5 table `messages_fts` (migration m007_message_search): external content, so
it holds tokens, not a second copy of the text, and triggers keep it in step with `messages`.
A deleted message's words stay in the index's segments until they are merged, so the store calls
`forget_deleted` in the same transaction as a delete: FTS5's 'optimize' rewrites the index
without them, and `secure_delete` overwrites the pages the old segments held.

A query is FTS5's syntax ("a phrase", prefix*, AND/OR/NOT, NEAR(...)), with one kindness: a word
without any of FTS5's operator characters is matched as written, so `don't` or `e-mail` work
without quoting. A query FTS5 cannot parse (a stray quote) is a UsageError.

Not every SQLite has FTS5 (it is a compile-time option; a build without it answers `CREATE
VIRTUAL TABLE ... USING fts5` with "no such module: fts5"). The history must not depend on it, so
the index is not a migration's to make but `keep_index`'s, on every open that may write: where
FTS5 is there and the index or its triggers are missing (the database was written where FTS5 was
not), it builds them and indexes every message kept so far; where FTS5 is missing it drops the
triggers, which would otherwise make every saved message fail. Without the triggers there is no
search: `search_messages` raises SearchUnavailable, saying why in one line, and deletes skip
the index's merge.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from llmchat.errors import HistoryError, UsageError
from llmchat.store.db_errors import is_busy

# Private markers around a match in a snippet; the caller marks it its own way (`marked`).
MATCH_START, MATCH_END = "\x02", "\x03"
SNIPPET_TOKENS = 16
SQLITE_ERROR = 1  # SQLite's generic primary result code
OPERATORS = frozenset({"AND", "OR", "NOT"})
SYNTAX_CHARACTERS = re.compile(r'["*()^:{}]')
NO_FTS5 = "no such module: fts5"  # what a build without FTS5 says to anything that needs it

INDEX_SQL = (
    "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id',"
    " tokenize='unicode61 remove_diacritics 2')"
)
# They keep the index in step with every insert and delete (a conversation's cascade included).
TRIGGERS = {
    "messages_fts_insert": "CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN"
    " INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END",
    "messages_fts_delete": "CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN"
    " INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content); END",
    "messages_fts_update": "CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN"
    " INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);"
    " INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content); END",
}


class SearchUnavailable(HistoryError):
    """The history has no usable search index (this SQLite lacks FTS5); everything else works."""


SEARCH_SQL = f"""
SELECT m.conversation_id, c.name, m.id, m.seq, m.role, m.created_at,
       (SELECT COUNT(*) FROM messages u WHERE u.conversation_id = m.conversation_id
        AND u.role = 'user' AND u.seq <= m.seq),
       snippet(messages_fts, 0, '{MATCH_START}', '{MATCH_END}', '…', {SNIPPET_TOKENS})
FROM messages_fts JOIN messages m ON m.id = messages_fts.rowid JOIN conversations c ON c.id = m.conversation_id
WHERE messages_fts MATCH ? ORDER BY messages_fts.rank, m.created_at DESC LIMIT ?
"""


@dataclass(frozen=True)
class SearchHit:
    """One message that matches: where it is (conversation, turn 1-based, role) and a snippet
    whose matches lie between MATCH_START and MATCH_END, on one line."""

    conversation_id: str
    conversation_name: str | None
    message_id: int
    seq: int
    role: str
    created_at: str
    turn: int
    snippet: str

    def marked(self, start: str, end: str) -> str:
        return self.snippet.replace(MATCH_START, start).replace(MATCH_END, end)

    def as_json(self) -> dict[str, object]:
        """The record `history search --json` prints: matches marked **like this**."""
        return {
            "conversation_id": self.conversation_id,
            "conversation_name": self.conversation_name,
            "turn": self.turn,
            "role": self.role,
            "message_id": self.message_id,
            "seq": self.seq,
            "created_at": self.created_at,
            "snippet": self.marked("**", "**"),
        }


def fts_query(text: str) -> str:
    """The FTS5 query for what was typed: plain words quoted (so punctuation in them is no
    syntax), operators and words written in FTS5's syntax passed as they are."""
    words = text.split()
    if not words:
        raise UsageError("give the text to search for")
    if any(SYNTAX_CHARACTERS.search(word) for word in words):
        return text  # the person writes FTS5's syntax: phrases, prefixes, NEAR(...)
    return " ".join(word if word in OPERATORS else f'"{word}"' for word in words)


def fts5_available(db: sqlite3.Connection) -> bool:
    """Whether this SQLite has FTS5: an index made and dropped in the connection's own temporary
    schema (nothing in the database file changes)."""
    try:
        db.execute("CREATE VIRTUAL TABLE temp.llmchat_fts5_probe USING fts5(text)")
    except sqlite3.OperationalError as err:
        if NO_FTS5 in str(err):
            return False
        raise
    db.execute("DROP TABLE temp.llmchat_fts5_probe")
    return True


def _index_parts(db: sqlite3.Connection) -> tuple[bool, set[str]]:
    """Whether the index table exists, and which of its triggers do."""
    table = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'messages_fts'").fetchone()
    triggers = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    return table is not None, triggers & set(TRIGGERS)


def index_live(db: sqlite3.Connection) -> bool:
    """Whether the index is there and kept in step (its triggers exist only where FTS5 was found)."""
    table, triggers = _index_parts(db)
    return table and triggers == set(TRIGGERS)


def keep_index(db: sqlite3.Connection) -> None:
    """Make the index whole where this SQLite has FTS5, or take its triggers out where it has not
    (see the module's docstring). The caller holds the write transaction of the open."""
    table, triggers = _index_parts(db)
    if not fts5_available(db):
        for name in sorted(triggers):
            db.execute(f"DROP TRIGGER {name}")
        return
    if table and triggers == set(TRIGGERS):
        return
    if not table:
        db.execute(INDEX_SQL)
    for name, sql in TRIGGERS.items():
        if name not in triggers:
            db.execute(sql)
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")  # every message kept so far


def unavailable_reason(db: sqlite3.Connection) -> str:
    """The one line `history search` and /search give where there is no index to search."""
    try:
        has_fts5 = fts5_available(db)
    except sqlite3.Error:  # a read-only connection that cannot even make a temporary table
        has_fts5 = False
    if has_fts5:
        return (
            "cannot search yet: the history was written where SQLite lacks FTS5, and its search index is "
            "added the next time llmchat opens it for writing (a chat, an ask)"
        )
    return (
        f"cannot search: this Python's SQLite ({sqlite3.sqlite_version}) lacks FTS5, which search needs; "
        "the history itself works, and a Python whose SQLite has FTS5 adds the index and searches it"
    )


def search_messages(db: sqlite3.Connection, text: str, limit: int) -> list[SearchHit]:
    """The best `limit` matches of `text`, best first (FTS5's bm25 rank, then newest).
    SearchUnavailable where there is no index (this SQLite lacks FTS5)."""
    query = fts_query(text)
    if not index_live(db):
        raise SearchUnavailable(unavailable_reason(db))
    try:
        rows = db.execute(SEARCH_SQL, (query, limit)).fetchall()
    except sqlite3.OperationalError as err:
        if NO_FTS5 in str(err):  # read as it is (read-only) by a SQLite without FTS5
            raise SearchUnavailable(unavailable_reason(db)) from err
        # FTS5 reports a query it cannot parse as a plain SQLITE_ERROR; a locked or unreadable
        # database has codes of its own, and stays the store's to translate.
        code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
        if is_busy(err) or (code is not None and code & 0xFF != SQLITE_ERROR):
            raise
        raise UsageError(
            f'cannot search for {text!r} ({err}); close each "phrase" with a quote, or quote words with punctuation'
        ) from err
    return [
        SearchHit(cid, name, message_id, seq, role, created_at, turn, " ".join(snippet.split()))
        for cid, name, message_id, seq, role, created_at, turn, snippet in rows
    ]


def forget_deleted(db: sqlite3.Connection) -> None:
    """Merge the index into one segment without the deleted messages' entries: until then their
    words stay in the old segments. Costs a rewrite of the index (milliseconds for thousands of
    messages); the caller holds the transaction of the delete. Nothing without an index."""
    if index_live(db):
        db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
