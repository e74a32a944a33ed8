"""The durable conversation store: one SQLite database shared by every llmchat process.

Why it is built this way:
- WAL mode lets readers go on while one process writes, and every write is a short
  `BEGIN IMMEDIATE` transaction, so several chats can save turns into the same file at once.
- A busy timeout plus a retry loop turns "database is locked" into a wait; only after the
  timeout does the caller get a HistoryError naming the file and the way out.
- Each turn is committed as soon as it is known, so a crash loses at most the reply in flight.
- The schema evolves through an append-only list of migrations (llmchat.store.migrations): the
  `_migrations` table records which ones ran, and pending ones run in one transaction.
- Private by default: the database is created 0600 in a 0700 folder whatever the umask, and
  SQLite gives its `-wal` and `-shm` files the database's mode. `secure_delete` overwrites
  deleted text, and each delete checkpoints the WAL (TRUNCATE), whose old frames would otherwise
  keep the text until overwritten. The MCP images a deleted message named go with it, once no
  message left names them (llmchat.store.media_files).

HistoryStore is the one owner of the connection: it opens it, holds every transaction and
retries a busy one. What runs inside a transaction lives by role: llmchat.store.writes,
llmchat.store.reads, llmchat.store.deletes, and the media files in llmchat.store.media_files.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from llmchat import interrupts, paths
from llmchat.errors import HistoryError
from llmchat.private_files import ensure_private_dir, private_umask, tighten, tightened_notice
from llmchat.store import deletes, media_files, migrations, reads, writes
from llmchat.store.attachment_records import Attachment
from llmchat.store.db_errors import HistoryUnavailable, is_busy, translate, unavailable
from llmchat.store.queries import NewMessage, append_messages, check_name, family_of
from llmchat.store.records import ConversationSummary, StoredConversation, new_id
from llmchat.store.search import SearchHit, keep_index, search_messages

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 10.0
# SQLite's own busy wait runs in C, where Ctrl-C is not seen until it returns; waiting in short
# slices and looping in Python keeps the whole DEFAULT_TIMEOUT_S wait interruptible.
SQLITE_BUSY_SLICE_S = 0.5


class HistoryStore:
    def __init__(self, db: sqlite3.Connection, path: Path, timeout: float):
        self._db = db
        self.path = path
        self._timeout = timeout
        # Where the MCP images its conversations name are (llmchat.store.media_files).
        self.media_dir = paths.mcp_media_dir()
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
                pending = migrations.pending_migrations(db)
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
        raise translate(path, last, timeout) from last

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
            raise unavailable(path, err.strerror or err) from err
        except sqlite3.Error as err:
            raise translate(path, err, timeout) from err

    def _prepare(self) -> None:
        # The first statement that reads the file is what finds a corrupt one.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        # Deleted text is overwritten, not left in free pages (on in Debian's SQLite, not in every build).
        self._db.execute("PRAGMA secure_delete=ON")
        self._in_transaction(_migrate_and_index)

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
                    if not (is_busy(err) and time.monotonic() < deadline):
                        raise translate(self.path, err, self._timeout) from err
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

    # ---- writing (llmchat.store.writes)

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
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
            check_name(name)
        conversation_id = new_id()
        self._write(
            lambda db: writes.insert_conversation(
                db,
                conversation_id,
                name=name,
                model=model,
                model_path=model_path,
                template=template,
                system_prompt=system_prompt,
                sampling=sampling,
            )
        )
        return conversation_id

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
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
        model: str | None = None,
        summarised: int | None = None,
    ) -> int:
        """Append one message; returns its row id (a summary's `summarised`: llmchat.turn.compaction)."""
        message = NewMessage(
            role, content, interrupted, finish_reason, stats, sampling, model=model, summarised=summarised
        )
        return self._write(lambda db: append_messages(db, conversation_id, [message])[0])

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
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
        model: str | None = None,
    ) -> None:
        """Append a user message and its reply in one transaction: never half a turn. `user` is the
        message as the model saw it; with `attachments`, the files it carries are stored apart.
        `tool_messages`: a tool turn's calls and results, between the two (each with its `tool`
        details: see StoredMessage.tool). `model`: the model that wrote the reply."""
        messages = writes.turn_messages(
            user,
            assistant,
            interrupted=interrupted,
            finish_reason=finish_reason,
            stats=stats,
            sampling=sampling,
            reasoning=reasoning,
            attachments=attachments,
            tool_messages=tool_messages,
            model=model,
        )
        self._write(lambda db: append_messages(db, conversation_id, messages))
        media_files.keep_attached(self.media_dir, attachments)  # after the commit: no file without its turn

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
    def fork(self, id_or_name: str, at: int, *, name: str | None = None) -> str:
        """A new conversation that shares the first `at` turns (user messages with their replies)
        of `id_or_name`: a copy of them, attachments included, with the same model, template,
        system prompt and sampling. Returns its id. UsageError when `at` is out of range."""
        if name is not None:
            check_name(name)
        new = new_id()
        self._write(lambda db: writes.copy_turns(db, id_or_name, at, new, name))
        return new

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
    def update_system_prompt(self, conversation_id: str, system_prompt: str | None) -> None:
        self._write(lambda db: writes.set_system_prompt(db, conversation_id, system_prompt))

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
    def rename(self, conversation_id: str, name: str) -> None:
        check_name(name)
        self._write(lambda db: writes.set_name(db, conversation_id, name))

    # ---- deleting (llmchat.store.deletes)

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
    def delete_last_exchange(self, conversation_id: str) -> int:
        """For /undo: remove the trailing reply and the user message it answered; returns rows removed.

        A trailing user message without a reply is removed alone.
        """
        removed, orphans = self._write(lambda db: deletes.last_exchange(db, conversation_id, self.media_dir))
        media_files.remove(orphans)  # after the commit: a failed delete keeps its files
        return removed

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
    def delete(self, id_or_name: str) -> bool:
        """Delete a conversation; True when no copy of its text is left in the WAL either (False:
        another process is reading, and the WAL keeps old frames until it lets go)."""
        orphans = self._write(lambda db: deletes.conversation(db, id_or_name, self.media_dir))
        media_files.remove(orphans)  # after the commit: a failed delete keeps its files
        return self._truncate_wal()

    @interrupts.changes_state  # a chat command's write is made whole (llmchat.interrupts)
    def delete_all(self) -> bool:
        """Empty the store, then checkpoint and VACUUM, so no deleted text is left in the database
        file or the WAL. True when that succeeded (False: another process holds the WAL)."""
        self._write(deletes.everything)
        cleared = self._truncate_wal()
        # VACUUM rebuilds the file without free pages; in WAL mode it writes through the WAL,
        # hence the second checkpoint.
        self._retrying(lambda: self._db.execute("VACUUM"))
        return self._truncate_wal() and cleared

    def _truncate_wal(self) -> bool:
        """Copy the WAL into the database and cut it to zero bytes: its old frames hold deleted text."""
        busy, _, _ = self._retrying(lambda: self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
        return busy == 0

    # ---- reading (llmchat.store.reads)

    def list_conversations(self, limit: int = 50) -> list[ConversationSummary]:
        """The most recently updated conversations first."""
        return self._read(lambda db: reads.latest_summaries(db, limit))

    def get(self, id_or_name: str) -> StoredConversation:
        """Accepts a full id, a unique id prefix, a name, or "last" (the latest updated)."""
        return self._read(lambda db: reads.load_conversation(db, id_or_name))

    def turn_attachments(self, conversation_id: str, turn: int) -> list[Attachment]:
        """The files (text included) of the user message of turn `turn` (0-based), for /edit."""
        return self._read(lambda db: reads.turn_attachments(db, conversation_id, turn))

    def family(self, id_or_name: str) -> list[ConversationSummary]:
        """Every conversation in the tree `id_or_name` belongs to (from its root down), oldest first."""
        return self._read(lambda db: family_of(db, id_or_name))

    def search(self, text: str, limit: int = 20) -> list[SearchHit]:
        """Messages matching `text` (llmchat.store.search), best first; UsageError for a bad query,
        SearchUnavailable where this SQLite lacks FTS5."""
        return self._read(lambda db: search_messages(db, text, limit))


def _migrate_and_index(db: sqlite3.Connection) -> None:
    """The schema brought up to date, then the search index where this SQLite has FTS5."""
    migrations.migrate(db)
    keep_index(db)


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
