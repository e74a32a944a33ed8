"""Batch output: whole JSONL lines, in input order, and what `--resume` reads back.

Each record is written with one write call of the whole line and flushed, so an interrupted run
leaves complete lines only; a trailing partial line from a crash is truncated away first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import IO, Callable, Iterable

from llmchat.batch.items import id_key
from llmchat.edges.bounded_input import ANY_TEXT, open_regular, read_line


# --- output -----------------------------------------------------------------------------------------
def read_done_ids(path: Path) -> tuple[set[str], int]:
    """Ids already answered in `path`; a trailing partial line (a crash mid-write) is cut off.

    Returns (id keys, bytes truncated)."""
    try:
        fd, _ = open_regular(path, f"output {path}", advice="write the results to a file to --resume them")
    except FileNotFoundError:
        return set(), 0
    done: set[str] = set()
    end = size = 0
    # Line by line: the records already written are not held, only their ids.
    with os.fdopen(fd, "rb") as handle:
        while raw := read_line(handle, f"a record in {path}", ANY_TEXT):
            size += len(raw)
            if not raw.endswith(b"\n"):
                break  # everything after the last newline is a partial record
            end = size
            try:
                record = json.loads(raw) if raw.strip() else None
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(record, dict) and "id" in record:
                done.add(id_key(record["id"]))
    cut = size - end
    if cut:
        with open(path, "r+b") as handle:
            handle.truncate(end)
    return done, cut


class RecordSink:
    """Writes whole lines: one write call per record, then a flush (and fsync when asked)."""

    def __init__(self, path: Path | None, *, append: bool, fsync: bool):
        self.path = path
        self.fsync = fsync and path is not None
        if path is None:
            self._fd = None
            self._stream: IO[bytes] = sys.stdout.buffer
        else:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            self._fd = os.open(path, flags, 0o644)

    def write(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        if self._fd is None:
            self._stream.write(line)
            self._stream.flush()
            return
        # A full disk or a signal mid-write must not leave half a record: cut back to where this
        # line began, so the file holds complete lines only and --resume can pick up from it.
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(line)
            while view:  # os.write may write less than asked (rare for regular files)
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(self._fd)
        except BaseException:
            os.ftruncate(self._fd, start)
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class InOrder:
    """Emits records in input order while items finish in any order."""

    def __init__(self, indices: Iterable[int], emit: Callable[[dict], None]):
        self._order = list(indices)
        self._next = 0
        self._waiting: dict[int, dict] = {}
        self._emit = emit

    def put(self, index: int, record: dict) -> None:
        self._waiting[index] = record
        while self._next < len(self._order) and self._order[self._next] in self._waiting:
            self._emit(self._waiting.pop(self._order[self._next]))
            self._next += 1

    @property
    def written(self) -> int:
        return self._next

    @property
    def buffered(self) -> int:
        return len(self._waiting)
