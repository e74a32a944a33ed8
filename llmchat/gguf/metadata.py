"""What a parsed GGUF header is: the value and tensor types of the format, and `GGUFMetadata`,
whose long arrays (the vocabulary) stay in the file until asked for.

Kept apart from the reader (llmchat.gguf.reader) so that what the header holds can be used, and
rebuilt from the header cache, without the parsing and validation code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

from llmchat.errors import ModelError

__all__ = [
    "ArrayInfo",
    "GGMLType",
    "GGML_TYPES",
    "GGUFMetadata",
    "SCALAR_FORMATS",
    "SCALAR_SIZES",
    "TensorInfo",
    "ValueType",
    "ggml_type_name",
]


class ValueType(IntEnum):
    """GGUF metadata value types (gguf.h `enum gguf_type`)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# struct format characters of the fixed-size value types (little-endian files only).
SCALAR_FORMATS: dict[int, str] = {
    ValueType.UINT8: "B",
    ValueType.INT8: "b",
    ValueType.UINT16: "H",
    ValueType.INT16: "h",
    ValueType.UINT32: "I",
    ValueType.INT32: "i",
    ValueType.FLOAT32: "f",
    ValueType.BOOL: "?",
    ValueType.UINT64: "Q",
    ValueType.INT64: "q",
    ValueType.FLOAT64: "d",
}
SCALAR_SIZES: dict[int, int] = {t: struct.calcsize("<" + f) for t, f in SCALAR_FORMATS.items()}
_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class GGMLType:
    """A ggml tensor type: `block_size` elements are stored in `type_size` bytes."""

    id: int
    name: str
    block_size: int
    type_size: int


def _ggml_types(*rows: tuple[int, str, int, int]) -> dict[int, GGMLType]:
    return {row[0]: GGMLType(*row) for row in rows}


_QK_K = 256  # super-block size of the K-quants and IQ types
# From ggml.h `enum ggml_type` and the block structs in ggml-common.h (llama.cpp as vendored by
# llama-cpp-python 0.3.36). Ids 4, 5 and 31-33, 36-38 were removed from ggml and never valid in files.
GGML_TYPES: dict[int, GGMLType] = _ggml_types(
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 2 + 16),
    (3, "Q4_1", 32, 2 + 2 + 16),
    (6, "Q5_0", 32, 2 + 4 + 16),
    (7, "Q5_1", 32, 2 + 2 + 4 + 16),
    (8, "Q8_0", 32, 2 + 32),
    (9, "Q8_1", 32, 4 + 4 + 32),
    (10, "Q2_K", _QK_K, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    (11, "Q3_K", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    (12, "Q4_K", _QK_K, 2 + 2 + _QK_K // 2 + 12),
    (13, "Q5_K", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    (14, "Q6_K", _QK_K, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    (15, "Q8_K", _QK_K, 4 + _QK_K + _QK_K // 8),
    (16, "IQ2_XXS", _QK_K, 2 + _QK_K // 4),
    (17, "IQ2_XS", _QK_K, 2 + _QK_K // 4 + _QK_K // 32),
    (18, "IQ3_XXS", _QK_K, 2 + _QK_K // 4 + _QK_K // 8),
    (19, "IQ1_S", _QK_K, 2 + _QK_K // 8 + _QK_K // 16),
    (20, "IQ4_NL", 32, 2 + 16),
    (21, "IQ3_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    (22, "IQ2_S", _QK_K, 2 + _QK_K // 4 + _QK_K // 16),
    (23, "IQ4_XS", _QK_K, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", _QK_K, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", _QK_K, 2 + 4 * 13),
    (35, "TQ2_0", _QK_K, 2 + 64),
    (39, "MXFP4", 32, 1 + 16),
    (40, "NVFP4", 64, 4 + 32),
    (41, "Q1_0", 128, 2 + 16),
    (42, "Q2_0", 64, 2 + 16),
)


def ggml_type_name(type_id: int) -> str:
    known = GGML_TYPES.get(type_id)
    return known.name if known else f"type {type_id}"


@dataclass(frozen=True)
class ArrayInfo:
    """A metadata array too long to read eagerly: where it is, so it can be read on demand."""

    key: str
    type: ValueType  # element type
    count: int
    offset: int  # absolute file offset of the first element
    nbytes: int  # bytes the elements take in the file


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    ggml_type: int
    offset: int  # relative to GGUFMetadata.data_offset
    nbytes: int

    @property
    def n_elements(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass
class GGUFMetadata:
    path: Path
    version: int
    file_size: int
    data_offset: int  # absolute file offset of the tensor data region
    alignment: int
    scalars: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, ArrayInfo] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)

    def get(self, key: str, default: Any = None) -> Any:
        return self.scalars.get(key, default)

    def __contains__(self, key: str) -> bool:
        return key in self.scalars or key in self.arrays

    @property
    def architecture(self) -> str | None:
        arch = self.scalars.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def arch_get(self, suffix: str, default: Any = None) -> Any:
        """`<arch>.<suffix>`, e.g. arch_get("block_count")."""
        arch = self.architecture
        return default if arch is None else self.scalars.get(f"{arch}.{suffix}", default)

    @property
    def tensor_data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def read_array(self, key: str) -> list[Any]:
        """An array value whether small (already in `scalars`) or large (read from the file now)."""
        if key in self.scalars and isinstance(self.scalars[key], list):
            return list(self.scalars[key])
        info = self.arrays.get(key)
        if info is None:
            raise KeyError(key)
        region = self._read_region(info)
        try:
            if info.type == ValueType.STRING:
                return _parse_string_array(region, info.count)
            return list(struct.unpack_from(f"<{info.count}{SCALAR_FORMATS[info.type]}", region))
        except (struct.error, IndexError, KeyError) as err:
            raise _changed_on_disk(self.path, err) from None

    def token_texts(self) -> list[str]:
        """The vocabulary (`tokenizer.ggml.tokens`), read lazily in one file read."""
        key = "tokenizer.ggml.tokens"
        if key not in self:
            raise ModelError(f"{self.path} has no vocabulary ({key} is missing); use a complete GGUF model file")
        return self.read_array(key)

    def _read_region(self, info: ArrayInfo) -> bytes:
        try:
            with open(self.path, "rb") as f:
                f.seek(info.offset)
                region = f.read(info.nbytes)
        except OSError as err:
            raise ModelError(f"cannot read {self.path}: {err.strerror or err}; check the file") from None
        if len(region) != info.nbytes:
            raise _changed_on_disk(self.path, "file is shorter than when it was opened")
        return region


def _changed_on_disk(path: Path, why: object) -> ModelError:
    return ModelError(f"{path} changed on disk while being read ({why}); run the command again")


def _parse_string_array(region: bytes, count: int) -> list[str]:
    """Length-prefixed UTF-8 strings, back to back. A tight loop: this is the 262k-token hot path."""
    texts: list[str] = []
    append = texts.append
    unpack_length = _U64.unpack_from
    pos = 0
    for _ in range(count):
        (length,) = unpack_length(region, pos)
        pos += 8
        end = pos + length
        if end > len(region):
            raise IndexError("string runs past the array")
        append(region[pos:end].decode("utf-8", "replace"))
        pos = end
    return texts
