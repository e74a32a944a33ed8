"""A SQLite without FTS5, as llmchat meets one: FTS5 is a compile-time option, and a build without
it answers `CREATE VIRTUAL TABLE ... USING fts5` (and any statement that reads or writes an FTS5
table) with `sqlite3.OperationalError: no such module: fts5`.

`install()` makes every `sqlite3.connect` of this process return such a connection: a
`sqlite3.Connection` subclass (the `factory` sqlite3.connect takes) whose statements that need
FTS5 fail with that very error, before SQLite sees them; everything else is the real SQLite. What
it cannot reach is a trigger that writes into an FTS5 table: where a database that has one is
opened, llmchat must drop those triggers itself (which the tests check in the schema).

In a `python -m llmchat` run it is installed by a sitecustomize (`SITECUSTOMIZE`, with
tests/shims.py's sitecustomize_env and this folder on PYTHONPATH).
"""

from __future__ import annotations

import re
import sqlite3

NO_FTS5 = "no such module: fts5"
NEEDS_FTS5 = re.compile(r"\bUSING\s+fts5\b|\b(?:FROM|INTO|JOIN)\s+messages_fts\b", re.IGNORECASE)
_real_connect = sqlite3.connect


class WithoutFts5(sqlite3.Connection):
    def execute(self, sql: str, parameters=(), /):  # type: ignore[override]
        if NEEDS_FTS5.search(sql):
            raise sqlite3.OperationalError(NO_FTS5)
        return super().execute(sql, parameters)

    def executemany(self, sql: str, parameters, /):  # type: ignore[override]
        if NEEDS_FTS5.search(sql):
            raise sqlite3.OperationalError(NO_FTS5)
        return super().executemany(sql, parameters)


def connect_without_fts5(*args, **kwargs) -> sqlite3.Connection:
    return _real_connect(*args, **kwargs, factory=WithoutFts5)


def install(monkeypatch=None) -> None:
    """From now on (or until `monkeypatch` undoes it), every connection lacks FTS5."""
    if monkeypatch is not None:
        monkeypatch.setattr(sqlite3, "connect", connect_without_fts5)
    else:
        sqlite3.connect = connect_without_fts5  # type: ignore[assignment]


SITECUSTOMIZE = "import sqlite_without_fts5\nsqlite_without_fts5.install()\n"
