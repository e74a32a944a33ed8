"""SQLite's failures, turned into the one line a user can act on.

A locked database means waiting or closing the other llmchat, a corrupt one means moving it
aside, and a folder that cannot be written means going on without history: each gets its own
HistoryError naming the file and the way out (`--no-history`), never a traceback.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from llmchat.errors import HistoryError

WAY_OUT = "run with --no-history"


class HistoryUnavailable(HistoryError):
    """The database cannot be created or written at all (unwritable folder or file).

    Distinct from a corrupt or locked database: this is the one case where a chat should warn
    and go on without history rather than stop (see `llmchat.store.history.open_or_warn`).
    """


def _error_code(err: sqlite3.Error) -> int | None:
    code = getattr(err, "sqlite_errorcode", None)  # Python 3.11+
    return None if code is None else code & 0xFF  # primary code, without the extended bits


# SQLite's primary result codes (sqlite3 exposes them at run time; typeshed does not list them).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_CORRUPT, _SQLITE_NOTADB = 5, 6, 11, 26


def is_busy(err: sqlite3.Error) -> bool:
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
    return HistoryError(f"history database {path} is unreadable ({err}); move it aside or {WAY_OUT}")


def _locked(path: Path, timeout: float) -> HistoryError:
    return HistoryError(
        f"history database {path} is locked by another process (waited {timeout:g}s); "
        f"try again when the other llmchat finishes, or {WAY_OUT}"
    )


def unavailable(path: Path, reason: object) -> HistoryUnavailable:
    return HistoryUnavailable(
        f"cannot use history database {path} ({reason}); check the folder's permissions and free space, "
        f"set LLMCHAT_HOME elsewhere, or {WAY_OUT}"
    )


def translate(path: Path, err: sqlite3.Error, timeout: float) -> HistoryError:
    if is_busy(err):
        return _locked(path, timeout)
    if _is_corrupt(err):
        return _unreadable(path, err)
    if isinstance(err, sqlite3.OperationalError):  # unable to open, read-only, disk I/O, full disk
        return unavailable(path, err)
    return HistoryError(f"history database {path}: {err}; {WAY_OUT}")
