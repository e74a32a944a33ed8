"""Copies of a real GGUF with metadata keys added, for tests that need a model's own settings.

`with_recommended_sampling(source, target, temp=0.3, top_k=20)` writes `target`: the model in
`source` (its tensors and metadata byte for byte) with `general.sampling.temp` and the others
given added, as recent converters write them (llama.cpp's LLM_KV_GENERAL_SAMPLING_*: float32,
top_k int32). The new entries go first in the key-value section, padded to a multiple of the
file's alignment, so every offset after them moves by whole alignment units and the tensor data
needs no rewriting (llama.cpp and llmchat's reader load the copy as they load the original).
"""

from __future__ import annotations

import struct
from pathlib import Path

FLOAT32, INT32, STRING = 6, 5, 8  # GGUF value types
KV_COUNT_AT = 16  # magic (4), version (4), tensor count (8), then the key-value count (8)
INT_KEYS = {"top_k"}


def _key(name: str) -> bytes:
    raw = name.encode()
    return struct.pack("<Q", len(raw)) + raw


def _entry(name: str, value: float | int) -> bytes:
    if name.rsplit(".", 1)[-1] in INT_KEYS:
        return _key(name) + struct.pack("<Ii", INT32, int(value))
    return _key(name) + struct.pack("<If", FLOAT32, float(value))


def _padding(length: int) -> bytes:
    return _key("test.padding") + struct.pack("<IQ", STRING, length) + b"x" * length


def with_recommended_sampling(source: Path, target: Path, **values: float | int) -> Path:
    from llmchat.gguf.reader import read_metadata

    alignment = read_metadata(source).alignment
    data = source.read_bytes()
    assert data[:4] == b"GGUF"
    added = b"".join(_entry(f"general.sampling.{name}", value) for name, value in values.items())
    added += _padding((-(len(added) + len(_padding(0)))) % alignment)
    assert len(added) % alignment == 0
    (count,) = struct.unpack_from("<Q", data, KV_COUNT_AT)
    start = KV_COUNT_AT + 8
    target.write_bytes(data[:KV_COUNT_AT] + struct.pack("<Q", count + len(values) + 1) + added + data[start:])
    return target
