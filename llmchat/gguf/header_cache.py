"""A model file's validated header, kept between runs so that a load reads it only once per file.

Before llama.cpp sees a file, llmchat reads its whole header (llmchat.gguf.reader): llama.cpp aborts
the process on some malformed files, and the header also gives the trained context, sampling
defaults and the model's kind. The read walks every vocabulary string (49k tokens and 48k merges
for SmolLM2, 262k tokens for Gemma 3): 35-110 ms on a 2-core machine, paid again by every
one-shot `ask` although the file has not changed. So the parsed header is stored in the cache
folder, keyed by the file's real path, size, modification and change times, inode and device;
any change to the file means it is read and checked again. A cache entry that cannot be read or
written is simply not used.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

from llmchat import paths
from llmchat.gguf.metadata import ArrayInfo, GGUFMetadata, TensorInfo, ValueType
from llmchat.gguf.reader import read_metadata

CACHE_VERSION = 1


def _file_key(path: Path) -> tuple[Path, list[Any]] | None:
    try:
        real = path.resolve()
        stat = real.stat()
    except (OSError, RuntimeError):
        return None
    return real, [str(real), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino, stat.st_dev]


def cached_for_file(path: Path, kind: str, compute: Callable[[], Any]) -> Any:
    """`compute()` (a JSON value), kept beside the file's header under the same key: what a
    command derives from the whole vocabulary (a 49k-262k token walk) is read once per file."""
    found = _file_key(path)
    if found is None:
        return compute()
    real, key = found
    entry = paths.cache_dir() / "headers" / f"{hashlib.sha256(str(real).encode()).hexdigest()[:32]}.{kind}.json"
    try:
        data = json.loads(entry.read_bytes())
        if data["version"] == CACHE_VERSION and data["key"] == key:
            return data["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    value = compute()
    _write(entry, {"version": CACHE_VERSION, "key": key, "value": value})
    return value


def _write(entry: Path, record: dict[str, Any]) -> None:
    try:
        from llmchat.private_files import ensure_private_dir, write_private_atomic

        ensure_private_dir(entry.parent)
        write_private_atomic(entry, json.dumps(record, separators=(",", ":")).encode())
    except (OSError, ValueError):
        pass  # a read-only cache folder costs the next run a read, nothing else


# The headers read by this process, by cache entry, path and file key (the same file, unchanged).
_read_in_this_process: dict[tuple[str, str, tuple[Any, ...]], GGUFMetadata] = {}


def read_metadata_cached(path: Path) -> GGUFMetadata:
    """`read_metadata(path)`, from the cache when the file is the one read before. Raises ModelError."""
    found = _file_key(path)
    if found is None:
        return read_metadata(path)  # it says what is wrong with the path
    real, key = found
    entry = paths.cache_dir() / "headers" / (hashlib.sha256(str(real).encode()).hexdigest()[:32] + ".json")
    remembered = _read_in_this_process.get((str(entry), str(path), tuple(key)))
    if remembered is not None:  # a one-shot asks twice: to load ahead, then to load (llmchat.startup.loading)
        return remembered
    meta = None
    try:
        data = json.loads(entry.read_bytes())
        if data["version"] == CACHE_VERSION and data["key"] == key:
            meta = _from_json(data["header"], path)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none yet, or unreadable: read the file
    if meta is None:
        meta = read_metadata(path)
        _write(entry, {"version": CACHE_VERSION, "key": key, "header": _to_json(meta)})
    _read_in_this_process[(str(entry), str(path), tuple(key))] = meta
    return meta


def _to_json(meta: GGUFMetadata) -> dict[str, Any]:
    return {
        "version": meta.version,
        "file_size": meta.file_size,
        "data_offset": meta.data_offset,
        "alignment": meta.alignment,
        "scalars": meta.scalars,
        "arrays": [[a.key, int(a.type), a.count, a.offset, a.nbytes] for a in meta.arrays.values()],
        "tensors": [[t.name, list(t.shape), t.ggml_type, t.offset, t.nbytes] for t in meta.tensors],
    }


def _from_json(data: dict[str, Any], path: Path) -> GGUFMetadata:
    arrays = [
        ArrayInfo(key, ValueType(kind), count, offset, nbytes) for key, kind, count, offset, nbytes in data["arrays"]
    ]
    return GGUFMetadata(
        path=Path(os.fspath(path)),
        version=int(data["version"]),
        file_size=int(data["file_size"]),
        data_offset=int(data["data_offset"]),
        alignment=int(data["alignment"]),
        scalars=dict(data["scalars"]),
        arrays={array.key: array for array in arrays},
        tensors=[
            TensorInfo(name, tuple(shape), ggml_type, offset, nbytes)
            for name, shape, ggml_type, offset, nbytes in data["tensors"]
        ],
    )
