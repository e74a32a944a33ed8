"""The KV cache on disk: a new process restores the longest saved prefix instead of prefilling it.

`ask -c`, `chat --resume` and `/load` re-render a conversation whose keys and values were computed
minutes ago by another process. At 250 tokens/s on a CPU, a 3,000-token conversation is 12 s of
prefill before the first token. After a turn, the sequence's state (llama.cpp's
`llama_state_seq_get_data`: the KV cells of sequence 0, about 23 KB per token for SmolLM2 in f16)
is written here; before a turn, the saved file that shares the longest token prefix with the
prompt is loaded and cut back to that prefix, and only the rest is prefilled. Measured on SmolLM2:
restoring costs about 45 µs per token against 4 ms per token of prefill
(bench/results/kv_disk_cache.md).

A file is used only by an engine with the same identity: the model file (resolved path, size,
mtime), the settings that shape the cache (n_ctx, KV type, flash attention) and the
llama-cpp-python version. Its token ids are stored with it and compared with the prompt, so a
file can never stand for other text. A file that is corrupt (bad magic, header or checksum),
truncated, saved for an older copy of the same model file, or refused by llama.cpp is skipped
with one notice and deleted, never loaded.

Layout of a `.kv` file: MAGIC, a little-endian u32 header length, the JSON header, the token ids
(int32 LE), then llama.cpp's sequence state. Files are written whole or not at all (temp file +
rename, `write_private_atomic`), 0600 in a 0700 folder: they hold a conversation. The total size
is bounded (`prompt_cache_max_bytes`, default 2 GiB) by evicting the least recently used files
(a restore refreshes a file's mtime). The folder is the caller's to choose: the engine knows no
application folders.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
import sys
import time
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from llmchat.private_files import ensure_private_dir, write_private_atomic

if TYPE_CHECKING:
    from llmchat.engine.core import Engine

MAGIC = b"LLMCHKV1"
SUFFIX = ".kv"
DEFAULT_MAX_BYTES = 2 * 1024**3
# Shorter sequences prefill in well under 0.3 s on a CPU; a file for them costs more than it saves.
MIN_SAVE_TOKENS = 64
# A restore reads the whole file (about 45 µs per token) and replaces what is in memory; it pays
# when it brings at least this many tokens more than the in-memory cache already has ...
MIN_RESTORE_GAIN = 32
# ... and at least 1/RESTORE_COST_RATIO of the file's tokens (prefill is ~90× dearer per token
# than reading; 32 keeps a wide margin for slow disks).
RESTORE_COST_RATIO = 32
_LENGTH = struct.Struct("<I")


class CorruptFile(Exception):
    """A cache file that must not be loaded; the message says why (for the one notice)."""


@dataclass(frozen=True)
class Entry:
    path: Path
    header: dict
    tokens: bytes  # the token ids, 4-byte little-endian (as in the file)
    payload_offset: int
    size: int
    mtime: float

    @property
    def conversation_id(self) -> str | None:
        return self.header.get("conversation_id")

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // 4

    def token_ids(self) -> list[int]:
        ids = array("i", self.tokens)
        if sys.byteorder == "big":
            ids.byteswap()
        return ids.tolist()


@dataclass(frozen=True)
class Restored:
    """What a turn got from disk: `tokens` of its prompt, loaded in `seconds`."""

    tokens: int
    seconds: float


def engine_identity(engine: Engine) -> dict:
    """Everything that must match for a saved state to be valid in this engine."""
    from llmchat.engine.bindings import LIBRARY_VERSION

    settings = engine.settings
    return {
        "model": _file_identity(Path(engine.model_path)),
        "n_ctx": engine.n_ctx,
        "kv_type": settings.kv_type,
        # An image's cells hold its projector's embeddings: another projector, another state.
        "mmproj": _file_identity(settings.mmproj) if settings.mmproj is not None else None,
        "flash_attn": settings.flash_attn,
        "llama_cpp": LIBRARY_VERSION,
    }


def _file_identity(path: Path) -> dict:
    resolved = path.resolve()
    stat = resolved.stat()
    return {"path": str(resolved), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as the file stores them: 4-byte little-endian integers."""
    ids = array("i", tokens)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids.tobytes()


def read_entry(path: Path) -> Entry:
    """The header and token ids of a cache file (not its state). Raises CorruptFile."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            if handle.read(len(MAGIC)) != MAGIC:
                raise CorruptFile("not an llmchat KV cache file")
            raw_length = handle.read(_LENGTH.size)
            if len(raw_length) != _LENGTH.size:
                raise CorruptFile("truncated header")
            (length,) = _LENGTH.unpack(raw_length)
            if length > 1 << 20:
                raise CorruptFile("header too large")
            try:
                header = json.loads(handle.read(length))
                n_tokens = int(header["n_tokens"])
                payload_bytes = int(header["payload_bytes"])
                int(header["payload_crc32"])
                dict(header["identity"])
            except (ValueError, KeyError, TypeError):
                raise CorruptFile("unreadable header") from None
            raw_tokens = handle.read(4 * n_tokens)
            payload_offset = len(MAGIC) + _LENGTH.size + length + 4 * n_tokens
            if len(raw_tokens) != 4 * n_tokens or stat.st_size != payload_offset + payload_bytes:
                raise CorruptFile("truncated or overlong")
    except OSError as err:
        raise CorruptFile(f"unreadable ({err.strerror or err})") from None
    return Entry(path, header, raw_tokens, payload_offset, stat.st_size, stat.st_mtime)


def _common_prefix(saved: bytes, prompt: bytes) -> int:
    """How many leading token ids two token strings (`_token_bytes`) share: a binary search whose
    every step is one C-level compare of the prefixes."""
    low, high = 0, min(len(saved), len(prompt)) // 4
    while low < high:
        middle = (low + high + 1) // 2
        if saved[: 4 * middle] == prompt[: 4 * middle]:
            low = middle
        else:
            high = middle - 1
    return low


class KVStore:
    """The cache folder as seen by one loaded engine."""

    def __init__(
        self,
        engine: Engine,
        *,
        folder: Path,
        max_bytes: int = DEFAULT_MAX_BYTES,
        warn: Callable[[str], None] = lambda message: None,
    ):
        self.engine = engine
        self.folder = folder
        self.max_bytes = max_bytes
        self.warn = warn
        self.identity = engine_identity(engine)
        self._saved_anonymous = False

    # --- files ------------------------------------------------------------------------------
    def _discard(self, path: Path, why: str) -> None:
        self.warn(f"warning: KV cache file {path.name} {why}; deleted it (the prompt is prefilled instead)")
        with contextlib.suppress(OSError):
            path.unlink()

    def _entries(self) -> list[Entry]:
        """This engine's usable files; corrupt ones and ones for an older copy of the model are
        discarded on the way."""
        entries = []
        for path in _cache_files(self.folder):
            try:
                entry = read_entry(path)
            except CorruptFile as err:
                self._discard(path, f"is damaged ({err})")
                continue
            identity = entry.header["identity"]
            if identity == self.identity:
                entries.append(entry)
            elif (
                identity.get("model", {}).get("path") == self.identity["model"]["path"]
                and identity.get("model") != self.identity["model"]
            ):
                self._discard(path, "was saved for another version of this model file")
        return entries

    # --- restore ----------------------------------------------------------------------------
    def restore(self, prompt: Sequence[int]) -> Restored | None:
        """Load the saved state sharing the longest prefix with `prompt`, when that beats the
        in-memory cache by enough to pay for reading it. At least the last prompt token is left to
        evaluate, which brings the logits the first sample needs."""
        if len(prompt) < 2:
            return None
        wanted = _token_bytes(prompt[:-1])
        in_memory = self.engine.cached_prefix(prompt)
        if len(prompt) - 1 - in_memory < MIN_RESTORE_GAIN:
            return None  # the usual chat turn: memory already holds all but the new message
        best: tuple[int, Entry] | None = None
        whole = self.engine.model.is_recurrent  # a recurrent state cannot be cut back: all of it or none
        for entry in self._entries():
            common = _common_prefix(entry.tokens, wanted)
            if whole and common < entry.n_tokens:
                continue
            if best is None or common > best[0]:
                best = (common, entry)
        if best is None:
            return None
        common, entry = best
        gain = common - in_memory
        if gain < MIN_RESTORE_GAIN or gain * RESTORE_COST_RATIO < entry.n_tokens:
            return None
        start = time.perf_counter()
        state = self._read_state(entry)
        if state is None:
            return None
        kept = self.engine.restore_sequence(entry.token_ids(), state, common)
        if kept is None:
            self._discard(entry.path, "was refused by llama.cpp")
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # recently used: evicted last
        return Restored(kept, time.perf_counter() - start)

    def _read_state(self, entry: Entry) -> bytearray | None:
        expected = int(entry.header["payload_bytes"])
        state = bytearray(expected)
        try:
            with open(entry.path, "rb") as handle:
                handle.seek(entry.payload_offset)
                got = handle.readinto(state)
        except OSError as err:
            self._discard(entry.path, f"could not be read ({err.strerror or err})")
            return None
        if got != expected:
            self._discard(entry.path, "is truncated")
            return None
        if zlib.crc32(state) != int(entry.header["payload_crc32"]):
            self._discard(entry.path, "is damaged (checksum mismatch)")
            return None
        return state

    # --- save -------------------------------------------------------------------------------
    def save(self, conversation_id: str | None) -> Path | None:
        """Write the engine's current sequence (the prompt and reply just decoded).

        A conversation keeps one file, its latest: the earlier ones hold a prefix of it. Turns that
        belong to no saved conversation (batch items) save once per process, which is enough for
        the next run's items to restore their shared system prompt."""
        if conversation_id is None and self._saved_anonymous:
            return None
        tokens = self.engine.evaluated_tokens()
        if len(tokens) < MIN_SAVE_TOKENS:
            return None
        state = self.engine.sequence_state()
        if len(state) + 4 * len(tokens) > self.max_bytes:
            return None
        path = write_entry(self.folder, self.identity, tokens, state, conversation_id)
        if conversation_id is None:
            self._saved_anonymous = True
        else:
            remove_for_conversation(conversation_id, folder=self.folder, keep=path)
        evict(self.max_bytes, folder=self.folder, keep=path)
        return path


def write_entry(
    folder: Path, identity: dict, tokens: Sequence[int], state: bytes | bytearray, conversation_id: str | None
) -> Path:
    """Write one cache file, whole or not at all; its name is the engine identity and the tokens'
    hash, so two processes saving the same sequence write the same name (the last rename wins)."""
    token_bytes = _token_bytes(tokens)
    header = {
        "identity": identity,
        "conversation_id": conversation_id,
        "n_tokens": len(tokens),
        "payload_bytes": len(state),
        "payload_crc32": zlib.crc32(state),
        "saved_at": time.time(),
    }
    raw_header = json.dumps(header).encode()
    name = f"{_digest(identity)[:16]}-{hashlib.sha256(token_bytes).hexdigest()[:32]}{SUFFIX}"
    path = folder / name
    ensure_private_dir(folder)
    write_private_atomic(path, b"".join((MAGIC, _LENGTH.pack(len(raw_header)), raw_header, token_bytes, state)))
    return path


# --- the folder as a whole (llmchat cache, history rm) ------------------------------------------
def _cache_files(folder: Path) -> list[Path]:
    """Complete cache files (a temp file being written starts with a dot and ends in .tmp)."""
    try:
        return [p for p in folder.iterdir() if p.name.endswith(SUFFIX) and not p.name.startswith(".")]
    except OSError:
        return []


def list_entries(folder: Path) -> tuple[list[Entry], list[Path]]:
    """(readable entries, damaged files), newest use first."""
    entries, damaged = [], []
    for path in _cache_files(folder):
        try:
            entries.append(read_entry(path))
        except CorruptFile:
            damaged.append(path)
    entries.sort(key=lambda e: e.mtime, reverse=True)
    return entries, damaged


def total_bytes(folder: Path) -> int:
    total = 0
    for path in _cache_files(folder):
        with contextlib.suppress(OSError):
            total += path.stat().st_size
    return total


def evict(max_bytes: int, *, folder: Path, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used files until the folder holds at most `max_bytes`."""
    files = []
    for path in _cache_files(folder):
        with contextlib.suppress(OSError):
            stat = path.stat()
            files.append((stat.st_mtime, stat.st_size, path))
    files.sort()
    total = sum(size for _, size, _ in files)
    removed = []
    for _, size, path in files:
        if total <= max_bytes:
            break
        if path == keep:
            continue
        with contextlib.suppress(OSError):
            path.unlink()
            removed.append(path)
        total -= size
    return removed


def remove_for_conversation(conversation_id: str, *, folder: Path, keep: Path | None = None) -> list[Path]:
    """Delete the saved states of one conversation (`history rm ID` calls this)."""
    removed = []
    for path in _cache_files(folder):
        if path == keep:
            continue
        try:
            entry = read_entry(path)
        except CorruptFile:
            continue
        if entry.conversation_id == conversation_id:
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
    return removed


def clear(folder: Path) -> tuple[int, int]:
    """Delete every cache file and left-over temp file: (files removed, bytes freed)."""
    count = freed = 0
    try:
        paths_ = list(folder.iterdir())
    except OSError:
        return 0, 0
    for path in paths_:
        if path.name.endswith(SUFFIX) or (path.name.startswith(".") and path.name.endswith(".tmp")):
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                count += 1
                freed += size
    return count, freed
