"""The durable conversation store: one SQLite database shared by every llmchat process.

Why it is built this way:
- WAL mode lets readers go on while one process writes, and every write is a short
  `BEGIN IMMEDIATE` transaction, so several chats can save turns into the same file at once.
- A busy timeout plus a retry loop turns "database is locked" into a wait; only after the
  timeout does the caller get a HistoryError naming the file and the way out.
- Each turn is committed as soon as it is known, so a crash loses at most the reply in flight.
- The schema evolves through an append-only list of migrations (the simonw/llm pattern): the
  `_migrations` table records which ones ran, and pending ones run in one transaction.
- Private by default: the database is created 0600 in a 0700 folder whatever the umask, and
  SQLite gives its `-wal` and `-shm` files the database's mode. `secure_delete` overwrites
  deleted text, and each delete checkpoints the WAL (TRUNCATE), whose old frames would otherwise
  keep the text until overwritten.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar

from llmchat import paths
from llmchat.attachments import prefix, typed_part
from llmchat.errors import HistoryError, UsageError
from llmchat.private_files import ensure_private_dir, private_umask, tighten, tightened_notice

if TYPE_CHECKING:
    from llmchat.attachments import Attachment

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
# SQLite's own busy wait runs in C, where Ctrl-C is not seen until it returns; waiting in short
# slices and looping in Python keeps the whole DEFAULT_TIMEOUT_S wait interruptible.
SQLITE_BUSY_SLICE_S = 0.5
ROLES = ("system", "user", "assistant", "tool")
PREVIEW_CHARS = 60
EXPORT_FORMAT = "llmchat-conversation"
EXPORT_VERSION = 1

_WAY_OUT = "run with --no-history"


class HistoryUnavailable(HistoryError):
    """The database cannot be created or written at all (unwritable folder or file).

    Distinct from a corrupt or locked database: this is the one case where a chat should warn
    and go on without history rather than stop (see `open_or_warn`).
    """


# --------------------------------------------------------------------------- records


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

    def chat_message(self) -> dict[str, Any]:
        """The message as the model sees it again: role and content, and a tool turn's fields."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        for key in ("tool_calls", "tool_call_id", "name"):
            if self.tool and key in self.tool:
                message[key] = self.tool[key]
        return message


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

    def chat_messages(self) -> list[dict[str, Any]]:
        """The messages to continue this chat with, system prompt first when there is one."""
        chat = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        chat.extend(m.chat_message() for m in self.messages)
        return chat


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


def _to_json(value: dict[str, Any] | None) -> str | None:
    # default=str: a stray non-JSON value in stats must not cost the user the turn.
    return None if value is None else json.dumps(value, sort_keys=True, default=str)


def _from_json(text: str | None) -> dict[str, Any] | None:
    return None if text is None else json.loads(text)


# --------------------------------------------------------------------------- migrations

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
    # Files attached to a user message (llmchat.attachments): the message's `content` keeps the
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


def applied_migrations(db: sqlite3.Connection) -> set[str]:
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)")
    return {row[0] for row in db.execute("SELECT name FROM _migrations")}


def _read_applied(db: sqlite3.Connection) -> set[str]:
    """The applied migrations, without creating anything (for read-only connections)."""
    exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'").fetchone()
    return {row[0] for row in db.execute("SELECT name FROM _migrations")} if exists else set()


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


# --------------------------------------------------------------------------- errors


def _error_code(err: sqlite3.Error) -> int | None:
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    return None if code is None else code & 0xFF  # primary code, without the extended bits


# SQLite's primary result codes (sqlite3 exposes them at run time; typeshed does not list them).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


def _is_busy(err: sqlite3.Error) -> bool:
    code = _error_code(err)
    if code is not None:
        return code in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(err).lower()
    return "locked" in text or "busy" in text


def _is_corrupt(err: sqlite3.Error) -> bool:
    code = _error_code(err)
    if code is not None:
        return code in (_SQLITE_NOTADB, _SQLITE_CORRUPT)
    text = str(err).lower()
    return "not a database" in text or "malformed" in text


def _unreadable(path: Path, err: sqlite3.Error) -> HistoryError:
    return HistoryError(f"history database {path} is unreadable ({err}); move it aside or {_WAY_OUT}")


def _locked(path: Path, timeout: float) -> HistoryError:
    return HistoryError(
        f"history database {path} is locked by another process (waited {timeout:g}s); "
        f"try again when the other llmchat finishes, or {_WAY_OUT}"
    )


def _unavailable(path: Path, reason: object) -> HistoryUnavailable:
    return HistoryUnavailable(
        f"cannot use history database {path} ({reason}); check the folder's permissions and free space, "
        f"set LLMCHAT_HOME elsewhere, or {_WAY_OUT}"
    )


def _translate(path: Path, err: sqlite3.Error, timeout: float) -> HistoryError:
    if _is_busy(err):
        return _locked(path, timeout)
    if _is_corrupt(err):
        return _unreadable(path, err)
    if isinstance(err, sqlite3.OperationalError):  # unable to open, read-only, disk I/O, full disk
        return _unavailable(path, err)
    return HistoryError(f"history database {path}: {err}; {_WAY_OUT}")


# --------------------------------------------------------------------------- the store


class HistoryStore:
    def __init__(self, db: sqlite3.Connection, path: Path, timeout: float):
        self._db = db
        self.path = path
        self._timeout = timeout
        # One connection may be shared by the UI thread and a generation thread.
        self._lock = threading.RLock()

    # ---- opening

    @classmethod
    def open(
        cls, path: Path | None = None, *, timeout: float = DEFAULT_TIMEOUT_S, warn: Callable[[str], None] | None = None
    ) -> HistoryStore:
        """Open (creating if needed) the database at `path`, default `paths.history_db()`.

        `warn` hears the one notice naming files an earlier llmchat left readable by others,
        which are tightened to 0600 here."""
        path = Path(path) if path is not None else paths.history_db()
        db = cls._connect(path, timeout)
        store = cls(db, path, timeout)
        try:
            # The umask covers SQLite's own files too, should its build not copy the database's mode.
            with private_umask():
                store._retrying(store._prepare)
        except BaseException:
            db.close()
            raise
        # After a good open: a corrupt or locked database gets its one error line, nothing more.
        tightened = tighten(_private_files_beside(path))
        if tightened and warn is not None:
            warn(tightened_notice(tightened))
        return store

    @classmethod
    def open_read_only(cls, path: Path, *, timeout: float = DEFAULT_TIMEOUT_S) -> HistoryStore:
        """Open an existing database for reading only: for `history list/show/export` where the
        data folder is read-only (a read-only mount, another user's files). Nothing is migrated;
        a database that would need it is refused with what to do."""
        path = Path(path)
        # mode=ro still needs the WAL index (-shm) beside the file; where it cannot be created,
        # immutable=1 reads the file as it is (nothing can be writing to a read-only folder).
        last: sqlite3.Error | None = None
        for flags in ("mode=ro", "immutable=1"):
            try:
                db = sqlite3.connect(
                    f"{path.resolve().as_uri()}?{flags}",
                    uri=True,
                    timeout=min(timeout, SQLITE_BUSY_SLICE_S),
                    check_same_thread=False,
                )
                pending = [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in _read_applied(db)]
            except sqlite3.Error as err:
                last = err
                continue
            if pending:
                db.close()
                raise HistoryError(
                    f"history database {path} is from an older llmchat and cannot be upgraded here (read-only); "
                    "run llmchat once where the folder is writable"
                )
            return cls(db, path, timeout)
        assert last is not None  # the loop ran at least once and only falls through after an error
        raise _translate(path, last, timeout) from last

    @staticmethod
    def _connect(path: Path, timeout: float) -> sqlite3.Connection:
        try:
            ensure_private_dir(path.parent)
            # isolation_level=None: no implicit transactions; every write states its own BEGIN.
            with private_umask():  # a new database file is created 0600
                return sqlite3.connect(
                    path, timeout=min(timeout, SQLITE_BUSY_SLICE_S), isolation_level=None, check_same_thread=False
                )
        except OSError as err:
            raise _unavailable(path, err.strerror or err) from err
        except sqlite3.Error as err:
            raise _translate(path, err, timeout) from err

    def _prepare(self) -> None:
        # The first statement that reads the file is what finds a corrupt one.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        # Deleted text is overwritten, not left in free pages (on in Debian's SQLite, not in every build).
        self._db.execute("PRAGMA secure_delete=ON")
        self._in_transaction(migrate)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ---- transactions and retries

    def _retrying(self, operation: Callable[[], T]) -> T:
        """Run `operation`, waiting out "database is locked" until the timeout, then HistoryError."""
        deadline = time.monotonic() + self._timeout
        pause = 0.01
        with self._lock:
            while True:
                try:
                    return operation()
                except sqlite3.Error as err:
                    # SQLite's busy handler has waited one slice; some BUSY results skip that
                    # handler altogether (WAL recovery, snapshot conflicts). Either way: loop.
                    if not (_is_busy(err) and time.monotonic() < deadline):
                        raise _translate(self.path, err, self._timeout) from err
                time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
                pause = min(pause * 2, 0.25)

    def _in_transaction(self, work: Callable[[sqlite3.Connection], T], *, write: bool = True) -> T:
        # IMMEDIATE takes the write lock up front, so a writer waits at BEGIN (where SQLite's
        # busy handler applies) instead of failing midway when upgrading a read lock.
        self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(self._db)
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:  # a failed COMMIT leaves the transaction open
                self._db.execute("ROLLBACK")
            raise
        return result

    def _write(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return self._retrying(lambda: self._in_transaction(work))

    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        # A read transaction gives one consistent snapshot (a header and its messages).
        return self._retrying(lambda: self._in_transaction(work, write=False))

    # ---- writing

    def new_conversation(
        self,
        *,
        model: str,
        model_path: str,
        template: str,
        system_prompt: str | None,
        sampling: dict,
        name: str | None = None,
    ) -> str:
        if name is not None:
            _check_name(name)
        conversation_id = new_id()
        now = utc_now()

        def insert(db: sqlite3.Connection) -> None:
            if name is not None:
                _require_free_name(db, name)
            db.execute(
                "INSERT INTO conversations (id, name, model, model_path, template, system_prompt,"
                " sampling_json, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    name,
                    model,
                    str(model_path),
                    template,
                    system_prompt,
                    _to_json(sampling or {}),
                    now,
                    now,
                ),
            )

        self._write(insert)
        return conversation_id

    def add_message(
        self,
        conversation_id: str,
        *,
        role: str,
        content: str,
        interrupted: bool = False,
        finish_reason: str | None = None,
        stats: dict | None = None,
        sampling: dict | None = None,
    ) -> int:
        """Append one message; returns its row id."""
        message = _NewMessage(role, content, interrupted, finish_reason, stats, sampling)
        return self._write(lambda db: _append(db, conversation_id, [message])[0])

    def add_turn(
        self,
        conversation_id: str,
        user: str,
        assistant: str,
        *,
        interrupted: bool = False,
        finish_reason: str | None = None,
        stats: dict | None = None,
        sampling: dict | None = None,
        reasoning: str | None = None,
        attachments: Sequence[Attachment] = (),
        tool_messages: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Append a user message and its reply in one transaction: never half a turn. `user` is the
        message as the model saw it; with `attachments`, the files it carries are stored apart.
        `tool_messages`: a tool turn's calls and results, between the two (each with its `tool`
        details: see StoredMessage.tool)."""
        messages = [
            _NewMessage("user", user, attachments=tuple(attachments)),
            *(
                _NewMessage(
                    m["role"], m.get("content") or "", tool={k: v for k, v in m.items() if k not in ("role", "content")}
                )
                for m in tool_messages
            ),
            _NewMessage("assistant", assistant, interrupted, finish_reason, stats, sampling, reasoning),
        ]
        self._write(lambda db: _append(db, conversation_id, messages))

    def fork(self, id_or_name: str, at: int, *, name: str | None = None) -> str:
        """A new conversation that shares the first `at` turns (user messages with their replies)
        of `id_or_name`: a copy of them, attachments included, with the same model, template,
        system prompt and sampling. Returns its id. UsageError when `at` is out of range."""
        if name is not None:
            _check_name(name)
        new = new_id()

        def copy(db: sqlite3.Connection) -> None:
            parent = _resolve(db, id_or_name)
            users = [
                seq
                for (seq,) in db.execute(
                    "SELECT seq FROM messages WHERE conversation_id = ? AND role = 'user' ORDER BY seq", (parent,)
                )
            ]
            if not 0 <= at <= len(users):
                raise UsageError(
                    f"conversation {parent} has {len(users)} turns; the branch point must be 0..{len(users)}"
                )
            if name is not None:
                _require_free_name(db, name)
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
                    "INSERT INTO messages (conversation_id, seq, role, content, interrupted, finish_reason,"
                    " stats_json, sampling_json, created_at, reasoning, tool_json) SELECT ?, seq, role, content,"
                    " interrupted, finish_reason, stats_json, sampling_json, created_at, reasoning, tool_json"
                    " FROM messages WHERE id = ?",
                    (new, old_id),
                )
                db.execute(
                    "INSERT INTO attachments (message_id, position, path, size, sha256, text)"
                    " SELECT ?, position, path, size, sha256, text FROM attachments WHERE message_id = ?",
                    (cursor.lastrowid, old_id),
                )

        self._write(copy)
        return new

    def turn_attachments(self, conversation_id: str, turn: int) -> list[Attachment]:
        """The files (text included) of the user message of turn `turn` (0-based), for /edit."""
        from llmchat.attachments import Attachment

        rows = self._read(
            lambda db: db.execute(
                "SELECT a.path, a.size, a.sha256, a.text FROM attachments a JOIN messages m ON m.id = a.message_id"
                " WHERE m.id = (SELECT id FROM messages WHERE conversation_id = ? AND role = 'user'"
                " ORDER BY seq LIMIT 1 OFFSET ?) ORDER BY a.position",
                (conversation_id, turn),
            ).fetchall()
        )
        return [Attachment(*row) for row in rows]

    def family(self, id_or_name: str) -> list[ConversationSummary]:
        """Every conversation in the tree `id_or_name` belongs to (from its root down), oldest first."""

        def load(db: sqlite3.Connection) -> list[ConversationSummary]:
            root = _resolve(db, id_or_name)
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
                _SUMMARY_SQL.format(where=f"WHERE c.id IN ({marks})") + " ORDER BY c.created_at, c.id", members
            ).fetchall()
            return [_summary(row) for row in rows]

        return self._read(load)

    def delete_last_exchange(self, conversation_id: str) -> int:
        """For /undo: remove the trailing reply and the user message it answered; returns rows removed.

        A trailing user message without a reply is removed alone.
        """

        def delete(db: sqlite3.Connection) -> int:
            _require_conversation(db, conversation_id)
            tail = db.execute(
                "SELECT id, role FROM messages WHERE conversation_id = ? AND seq >= COALESCE((SELECT MAX(seq)"
                " FROM messages WHERE conversation_id = ? AND role = 'user'), 0) ORDER BY seq DESC",
                (conversation_id, conversation_id),
            ).fetchall()
            doomed = _trailing_exchange(tail)
            db.executemany("DELETE FROM messages WHERE id = ?", [(row_id,) for row_id in doomed])
            if doomed:
                _touch(db, conversation_id)
            return len(doomed)

        return self._write(delete)

    def update_system_prompt(self, conversation_id: str, system_prompt: str | None) -> None:
        def update(db: sqlite3.Connection) -> None:
            _require_conversation(db, conversation_id)
            db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (system_prompt, conversation_id))
            _touch(db, conversation_id)

        self._write(update)

    def rename(self, conversation_id: str, name: str) -> None:
        _check_name(name)

        def update(db: sqlite3.Connection) -> None:
            _require_conversation(db, conversation_id)
            _require_free_name(db, name, other_than=conversation_id)
            db.execute("UPDATE conversations SET name = ? WHERE id = ?", (name, conversation_id))
            _touch(db, conversation_id)

        self._write(update)

    def delete(self, id_or_name: str) -> bool:
        """Delete a conversation; True when no copy of its text is left in the WAL either (False:
        another process is reading, and the WAL keeps old frames until it lets go)."""

        def delete(db: sqlite3.Connection) -> None:
            conversation_id = _resolve(db, id_or_name)
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))  # messages cascade

        self._write(delete)
        return self._truncate_wal()

    def delete_all(self) -> bool:
        """Empty the store, then checkpoint and VACUUM, so no deleted text is left in the database
        file or the WAL. True when that succeeded (False: another process holds the WAL)."""

        def delete(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM messages")
            db.execute("DELETE FROM conversations")

        self._write(delete)
        cleared = self._truncate_wal()
        # VACUUM rebuilds the file without free pages; in WAL mode it writes through the WAL,
        # hence the second checkpoint.
        self._retrying(lambda: self._db.execute("VACUUM"))
        return self._truncate_wal() and cleared

    def _truncate_wal(self) -> bool:
        """Copy the WAL into the database and cut it to zero bytes: its old frames hold deleted text."""
        busy, _, _ = self._retrying(lambda: self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
        return busy == 0

    # ---- reading

    def list_conversations(self, limit: int = 50) -> list[ConversationSummary]:
        """The most recently updated conversations first."""
        rows = self._read(lambda db: db.execute(_LIST_SQL, (limit,)).fetchall())
        return [_summary(row) for row in rows]

    def get(self, id_or_name: str) -> StoredConversation:
        """Accepts a full id, a unique id prefix, a name, or "last" (the latest updated)."""

        def load(db: sqlite3.Connection) -> StoredConversation:
            conversation_id = _resolve(db, id_or_name)
            header = db.execute(
                f"SELECT {_HEADER_COLUMNS} FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            rows = db.execute(
                f"SELECT {_MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ? ORDER BY seq", (conversation_id,)
            ).fetchall()
            conversation = _conversation(header, rows)
            conversation.children = [
                (child, at)
                for child, at in db.execute(
                    "SELECT id, branch_at FROM conversations WHERE parent_id = ? ORDER BY created_at, id",
                    (conversation_id,),
                )
            ]
            _attach_files(db, conversation)
            return conversation

        return self._read(load)

    def last_id(self) -> str | None:
        return self._read(_last_id)


# --------------------------------------------------------------------------- SQL helpers

_HEADER_COLUMNS = (
    "id, name, model, model_path, template, system_prompt, sampling_json, created_at, updated_at, parent_id, branch_at"
)
_MESSAGE_COLUMNS = (
    "id, seq, role, content, interrupted, finish_reason, stats_json, sampling_json, created_at, reasoning, tool_json"
)

_SUMMARY_SQL = """
SELECT c.id, c.name, c.model, c.created_at, c.updated_at,
       (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id),
       (SELECT m.content FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user'
        ORDER BY m.seq LIMIT 1),
       c.parent_id, c.branch_at,
       (SELECT COUNT(*) FROM conversations k WHERE k.parent_id = c.id),
       (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id AND m.role = 'user')
FROM conversations c {where}
"""
_LIST_SQL = _SUMMARY_SQL.format(where="") + " ORDER BY c.updated_at DESC, c.id DESC LIMIT ?"


@dataclass
class _NewMessage:
    role: str
    content: str
    interrupted: bool = False
    finish_reason: str | None = None
    stats: dict | None = None
    sampling: dict | None = None
    reasoning: str | None = None
    attachments: tuple[Attachment, ...] = ()
    tool: dict | None = None


def _append(db: sqlite3.Connection, conversation_id: str, messages: list[_NewMessage]) -> list[int]:
    _require_conversation(db, conversation_id)
    # Safe across processes: the IMMEDIATE transaction holds the write lock while we count.
    (seq,) = db.execute(
        "SELECT COALESCE(MAX(seq), -1) + 1 FROM messages WHERE conversation_id = ?", (conversation_id,)
    ).fetchone()
    now = utc_now()
    row_ids = [
        _insert_message(db, conversation_id, seq + offset, message, now) for offset, message in enumerate(messages)
    ]
    _touch(db, conversation_id, now)
    return row_ids


def _insert_message(db: sqlite3.Connection, conversation_id: str, seq: int, message: _NewMessage, now: str) -> int:
    if message.role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {message.role!r}")
    content = typed_part(message.content, message.attachments)
    cursor = db.execute(
        "INSERT INTO messages (conversation_id, seq, role, content, interrupted, finish_reason,"
        " stats_json, sampling_json, created_at, reasoning, tool_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            conversation_id,
            seq,
            message.role,
            content,
            int(bool(message.interrupted)),
            message.finish_reason,
            _to_json(message.stats),
            _to_json(message.sampling),
            now,
            message.reasoning,
            _to_json(message.tool),
        ),
    )
    assert cursor.lastrowid is not None  # an INSERT always sets it
    db.executemany(
        "INSERT INTO attachments (message_id, position, path, size, sha256, text) VALUES (?, ?, ?, ?, ?, ?)",
        [(cursor.lastrowid, i, a.path, a.size, a.sha256, a.text) for i, a in enumerate(message.attachments)],
    )
    return cursor.lastrowid


def _touch(db: sqlite3.Connection, conversation_id: str, now: str | None = None) -> None:
    db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (now or utc_now(), conversation_id))


def _trailing_exchange(tail: list[tuple[int, str]]) -> list[int]:
    """Row ids of the last exchange, given the messages from the last user message on, newest
    first: the reply, a tool turn's calls and results, and the user message they answer."""
    if not tail:
        return []
    if tail[0][1] == "assistant" and tail[-1][1] == "user":
        return [row_id for row_id, _ in tail]
    return [tail[0][0]]


def _require_conversation(db: sqlite3.Connection, conversation_id: str) -> None:
    if db.execute("SELECT 1 FROM conversations WHERE id = ?", (conversation_id,)).fetchone() is None:
        raise HistoryError(f"no conversation with id {conversation_id} in the history database")


def _check_name(name: str) -> None:
    if not name.strip():
        raise UsageError("a conversation name cannot be empty")
    if name == "last":  # `get("last")` means the latest conversation; this name could never be reached
        raise UsageError("'last' is reserved for the latest conversation; choose another name")


def _require_free_name(db: sqlite3.Connection, name: str, other_than: str | None = None) -> None:
    row = db.execute("SELECT id FROM conversations WHERE name = ?", (name,)).fetchone()
    if row is not None and row[0] != other_than:
        raise UsageError(f"the name {name!r} is already used by conversation {row[0]}; choose another")


def _last_id(db: sqlite3.Connection) -> str | None:
    row = db.execute("SELECT id FROM conversations ORDER BY updated_at DESC, id DESC LIMIT 1").fetchone()
    return None if row is None else row[0]


def _resolve(db: sqlite3.Connection, id_or_name: str) -> str:
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
    conversation_id = _last_id(db)
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


def _summary(row: tuple) -> ConversationSummary:
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


def _conversation(header: tuple, message_rows: list[tuple]) -> StoredConversation:
    cid, name, model, model_path, template, system_prompt, sampling_json, created_at, updated_at = header[:9]
    parent_id, branch_at = header[9:11]
    return StoredConversation(
        id=cid,
        name=name,
        model=model,
        model_path=model_path,
        template=template,
        system_prompt=system_prompt,
        sampling=_from_json(sampling_json) or {},
        created_at=created_at,
        updated_at=updated_at,
        messages=[_message(row) for row in message_rows],
        parent_id=parent_id,
        branch_at=branch_at,
    )


def _attach_files(db: sqlite3.Connection, conversation: StoredConversation) -> None:
    """Give each message its attachments and rebuild the text the model saw (typed words kept apart)."""
    from llmchat.attachments import Attachment

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


def _message(row: tuple) -> StoredMessage:
    row_id, seq, role, content, interrupted, finish_reason, stats_json, sampling_json, created_at, reasoning, tool = row
    return StoredMessage(
        id=row_id,
        seq=seq,
        role=role,
        content=content,
        interrupted=bool(interrupted),
        finish_reason=finish_reason,
        stats=_from_json(stats_json) or {},
        sampling=_from_json(sampling_json),
        created_at=created_at,
        reasoning=reasoning,
        tool=_from_json(tool),
    )


# --------------------------------------------------------------------------- for callers


def _private_files_beside(path: Path) -> list[Path]:
    """The database, its WAL files and, in llmchat's own data folder, the input history."""
    files = [path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")]
    if path == paths.history_db():
        files.append(paths.input_history_file())
    return files


def open_or_warn(path: Path | None = None, warn: Callable[[str], None] | None = None) -> HistoryStore | None:
    """Open the store, or warn once and return None when it cannot be created or written.

    A corrupt or locked database still raises: those messages tell the user the way out, and
    silently not saving a chat they expect to keep would be worse.
    """
    try:
        return HistoryStore.open(path, warn=warn)
    except HistoryUnavailable as err:
        if warn is not None:
            warn(f"{err}; going on without history")
        return None


# --------------------------------------------------------------------------- exporters


def export_json(conv: StoredConversation) -> str:
    document = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, **asdict(conv)}
    return json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n"


def export_markdown(conv: StoredConversation) -> str:
    parts = [_markdown_header(conv)]
    if conv.system_prompt:
        parts.append(f"## System prompt\n\n{conv.system_prompt}\n")
    parts.extend(_markdown_message(message) for message in conv.messages)
    return "\n".join(parts)


def _markdown_header(conv: StoredConversation) -> str:
    title = conv.name or f"Conversation {conv.id}"
    lines = [
        f"# {title}",
        "",
        f"- **ID:** `{conv.id}`",
        f"- **Model:** {conv.model} (`{conv.model_path}`)",
        f"- **Template:** {conv.template}",
        f"- **Created:** {conv.created_at}",
        f"- **Updated:** {conv.updated_at}",
    ]
    if conv.parent_id is not None:
        lines.append(f"- **Branch of:** `{conv.parent_id}` at turn {conv.branch_at} (shares turns 1..{conv.branch_at})")
    for child, at in conv.children:
        lines.append(f"- **Branch:** `{child}` at turn {at}")
    if conv.sampling:
        lines.append(f"- **Sampling:** {_key_values(conv.sampling)}")
    return "\n".join(lines) + "\n"


def _markdown_message(message: StoredMessage) -> str:
    lines = [f"## {message.role.capitalize()}", "", f"*{message.created_at}*", ""]
    if message.reasoning:
        # Marked as reasoning, quoted apart from the answer that follows.
        quoted = "\n".join(f"> {line}" if line else ">" for line in message.reasoning.splitlines())
        lines += ["### Reasoning", "", quoted, "", "### Answer", ""]
    for attached in message.attachments:  # marked, not dumped: the files' text is in `export --format json`
        lines += [
            f"> 📎 attached **{attached['path']}** ({attached['size']:,} bytes, sha256 `{attached['sha256'][:16]}…`)",
            "",
        ]
    tool = message.tool or {}
    for call in tool.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = json.dumps(function.get("arguments"), ensure_ascii=False, sort_keys=True)
        lines += [f"> 🔧 tool call `{function.get('name')}({arguments})`", ""]
    if message.role == "tool":
        how = "refused" if tool.get("approved") is False else ("error" if tool.get("error") else "result")
        lines += [f"> 🔧 {how} of `{tool.get('name')}`", ""]
    text = message.typed if message.typed is not None else message.content
    if text or not tool:
        lines += [text, ""]
    if message.interrupted:
        lines += ["> **[interrupted]** this reply was cut off before it finished.", ""]
    details = dict(message.stats)
    if message.finish_reason:
        details = {"finish_reason": message.finish_reason, **details}
    if details:
        lines += [f"<sub>{_key_values(details)}</sub>", ""]
    return "\n".join(lines)


def _key_values(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={_format_value(value)}" for key, value in values.items())


def _format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
