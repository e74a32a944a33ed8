"""Full-text search over every conversation's messages (`llmchat history search`, /search).

The index is the FTS5 table `messages_fts` (migration m007_message_search): external content, so
it holds tokens, not a second copy of the text, and triggers keep it in step with `messages`.
A deleted message's words stay in the index's segments until they are merged, so the store calls
`forget_deleted` in the same transaction as a delete: FTS5's 'optimize' rewrites the index
without them, and `secure_delete` overwrites the pages the old segments held.

A query is FTS5's syntax ("a phrase", prefix*, AND/OR/NOT, NEAR(...)), with one kindness: a word
without any of FTS5's operator characters is matched as written, so `don't` or `e-mail` work
without quoting. A query FTS5 cannot parse (a stray quote) is a UsageError.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

from llmchat.errors import UsageError
from llmchat.store.db_errors import is_busy

# Private markers around a match in a snippet; the caller marks it its own way (`marked`).
MATCH_START, MATCH_END = "\x02", "\x03"
SNIPPET_TOKENS = 16
SQLITE_ERROR = 1  # SQLite's generic primary result code
OPERATORS = frozenset({"AND", "OR", "NOT"})
SYNTAX_CHARACTERS = re.compile(r'["*()^:{}]')

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


def search_messages(db: sqlite3.Connection, text: str, limit: int) -> list[SearchHit]:
    """The best `limit` matches of `text`, best first (FTS5's bm25 rank, then newest)."""
    query = fts_query(text)
    try:
        rows = db.execute(SEARCH_SQL, (query, limit)).fetchall()
    except sqlite3.OperationalError as err:
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
    messages); the caller holds the transaction of the delete."""
    db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('optimize')")
