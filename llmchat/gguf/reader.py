"""A fast, defensive GGUF reader in pure Python (struct and file reads; no numpy, no llama_cpp).

Why not llama.cpp or the `gguf` package:
- llama.cpp aborts the whole process on some malformed files, so every file is checked here first.
- `gguf.GGUFReader` parses every array element into numpy objects: about 10 s for Gemma 3's
  262k-token vocabulary. Here large arrays are skipped (only their position is kept) and read
  on demand, which keeps `read_metadata` well under a second.

What is checked mirrors llama.cpp's own loader (ggml/src/gguf.cpp and llama-model-loader.cpp):
magic, version, counts that the file could not hold, string and array lengths, duplicate keys and
tensor names, alignment, tensor dimensions and types, row sizes that are not whole blocks, tensor
offsets, and that the tensor data region fits inside the file (a truncated download).
`llmchat.gguf.loadable.check_loadable` adds the model-level checks: a known architecture and the
keys every architecture needs.

Every failure is a `ModelError` whose message is one line: what is wrong with which file and what
to do about it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

from llmchat.errors import ModelError
from llmchat.gguf.metadata import (
    GGML_TYPES,
    SCALAR_FORMATS,
    SCALAR_SIZES,
    ArrayInfo,
    GGUFMetadata,
    TensorInfo,
    ValueType,
)

__all__ = ["read_metadata", "shown_name"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# Arrays up to this many elements are read into `scalars`; longer ones are only located.
SMALL_ARRAY_MAX = 64
# llama.cpp's limits (ggml.h GGML_MAX_DIMS, GGML_MAX_NAME; gguf.cpp GGUF_MAX_*).
MAX_DIMS = 4
MAX_TENSOR_NAME = 63
MAX_STRING_LENGTH = 1 << 30
MAX_ARRAY_ELEMENTS = 1 << 30
MAX_LAYERS = 512  # llama-hparams.h LLAMA_MAX_LAYERS
INT64_MAX = (1 << 63) - 1
# How much of the header is read per file read. The whole KV section of most models fits a few.
READ_CHUNK = 4 << 20

ADVICE_REDOWNLOAD = "the download is probably incomplete or damaged: download the model again"
ADVICE_RECONVERT = "the file is damaged or was written by a broken tool: download or convert the model again"

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")  # magic, version, n_tensors, n_kv

# The smallest a key/value pair or a tensor description can be on disk, used to reject counts that
# the file could not possibly hold before looping over them.
_MIN_KV_BYTES = 8 + 1 + 4 + 1  # key length, one key byte, type, one value byte
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8  # name length, one name byte, n_dims, type, offset

# ---------------------------------------------------------------------------------------------
# Reading


class _Truncated(Exception):
    """The file ended while reading `what`."""

    def __init__(self, what: str, at: int):
        super().__init__(what)
        self.what = what
        self.at = at


class _Corrupt(Exception):
    """A structural problem; the message says what, without the path."""

    state = "is corrupt"
    advice = ADVICE_RECONVERT


class _CutShort(_Corrupt):
    """A length or count that runs past the end of the file: a cut-off download, or a corrupt length."""

    state = "is truncated or corrupt"
    advice = ADVICE_REDOWNLOAD


class _Unsupported(_Corrupt):
    state = "cannot be used"
    advice = "it may use a newer format: update llmchat and llama-cpp-python, or use another quantization of the model"


class _Cursor:
    """Sequential little-endian reads over a file through a large buffer (few syscalls)."""

    def __init__(self, f: BinaryIO, file_size: int):
        self._file = f
        self.file_size = file_size
        self._buf = b""
        self._buf_start = 0
        self.pos = 0

    @property
    def remaining(self) -> int:
        return self.file_size - self.pos

    def _window(self, n: int, what: str) -> int:
        """Make bytes [pos, pos + n) available; return their index in the buffer."""
        if n > self.remaining:
            raise _Truncated(what, self.file_size)
        rel = self.pos - self._buf_start
        if 0 <= rel and rel + n <= len(self._buf):
            return rel
        self._file.seek(self.pos)
        self._buf = self._file.read(max(n, READ_CHUNK))
        self._buf_start = self.pos
        if len(self._buf) < n:  # the file shrank since we measured it
            raise _Truncated(what, self.pos + len(self._buf))
        return 0

    def peek(self, n: int) -> bytes:
        """Up to n bytes from the current position, without moving (for error messages)."""
        rel = self._window(min(n, self.remaining), "the start of the file")
        return self._buf[rel : rel + n]

    def unpack(self, st: struct.Struct, what: str) -> tuple[Any, ...]:
        rel = self._window(st.size, what)
        self.pos += st.size
        return st.unpack_from(self._buf, rel)

    def u32(self, what: str) -> int:
        return self.unpack(_U32, what)[0]

    def u64(self, what: str) -> int:
        return self.unpack(_U64, what)[0]

    def string(self, what: str) -> str:
        length = self.u64(what)
        if length > MAX_STRING_LENGTH or length > self.remaining:
            raise _CutShort(f"{what} claims a string of {length:,} bytes but only {self.remaining:,} bytes remain")
        rel = self._window(length, what)
        self.pos += length
        return self._buf[rel : rel + length].decode("utf-8", "replace")

    def skip(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise _Truncated(what, self.file_size)
        self.pos += n

    def skip_strings(self, count: int, what: str) -> None:
        """Walk `count` length-prefixed strings without decoding them.

        The hot path of parsing (262k strings for Gemma's vocabulary), so it scans the buffer in
        local variables and only goes back to the file when a length prefix is not buffered.
        """
        unpack_length = _U64.unpack_from
        file_size = self.file_size
        left = count
        while left:
            rel = self._window(8, what)
            buf, buf_start, pos = self._buf, self._buf_start, self.pos
            limit = len(buf) - 8  # last index where a whole length prefix is buffered
            while left and rel <= limit:
                (length,) = unpack_length(buf, rel)
                pos += 8 + length
                if pos > file_size:
                    raise _CutShort(
                        f"{what} has a string of {length:,} bytes but only {file_size - (pos - length):,} bytes remain"
                    )
                rel = pos - buf_start
                left -= 1
            self.pos = pos


def read_metadata(path: str | os.PathLike[str]) -> GGUFMetadata:
    """Parse and validate a GGUF file's header, metadata and tensor table. Raises ModelError."""
    try:
        return _read_metadata(Path(path))
    except ModelError as err:
        # Names from the file (or an odd file name) must not break the one-line contract.
        raise ModelError(_one_line(str(err))) from None


def _read_metadata(path: Path) -> GGUFMetadata:
    file_size = _checked_file_size(path)
    try:
        with open(path, "rb") as f:
            return _parse(f, path, file_size)
    except ModelError:
        raise
    except _Truncated as err:
        raise ModelError(
            f"{path} is truncated: the file ends at byte {err.at:,} while reading {err.what}; {ADVICE_REDOWNLOAD}"
        ) from None
    except _Corrupt as err:
        raise ModelError(f"{path} {err.state}: {err}; {err.advice}") from None
    except PermissionError:
        raise ModelError(f"cannot read {path}: permission denied; fix the file's permissions (chmod a+r)") from None
    except OSError as err:
        raise ModelError(f"cannot read {path}: {err.strerror or err}; check the file and the disk") from None
    except (struct.error, ValueError, IndexError, KeyError, OverflowError, MemoryError) as err:
        # Should be unreachable: every read above is bounds-checked. Still one line, not a traceback.
        raise ModelError(
            f"{path} could not be parsed as GGUF ({type(err).__name__}: {err}); {ADVICE_RECONVERT}"
        ) from None


def shown_name(name: str, limit: int = 80) -> str:
    """A name from the file, quoted, cut to `limit` and with control characters escaped, so an
    error message stays one readable line whatever bytes the file holds."""
    text = name if len(name) <= limit else name[:limit] + "..."
    return "'" + "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text) + "'"


def _one_line(message: str) -> str:
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)


def _checked_file_size(path: Path) -> int:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ModelError(f"model file not found: {path}; check the path") from None
    except PermissionError:
        raise ModelError(f"cannot access {path}: permission denied; fix the permissions of its folder") from None
    except OSError as err:
        raise ModelError(f"cannot access {path}: {err.strerror or err}; check the path") from None
    if path.is_dir():
        raise ModelError(f"{path} is a directory, not a model file; pass the .gguf file inside it")
    if not path.is_file():
        raise ModelError(f"{path} is not a regular file; pass a .gguf model file")
    if st.st_size == 0:
        raise ModelError(f"{path} is empty (0 bytes); {ADVICE_REDOWNLOAD}")
    return st.st_size


def _parse(f: BinaryIO, path: Path, file_size: int) -> GGUFMetadata:
    cursor = _Cursor(f, file_size)
    version, n_tensors, n_kv = _read_header(cursor, path)
    meta = GGUFMetadata(path=path, version=version, file_size=file_size, data_offset=0, alignment=DEFAULT_ALIGNMENT)
    _read_key_values(cursor, meta, n_kv)
    meta.alignment = _alignment(meta)
    meta.tensors = _read_tensor_infos(cursor, n_tensors)
    meta.data_offset = _pad(cursor.pos, meta.alignment) if n_tensors else cursor.pos
    _check_tensor_layout(meta)
    _check_layer_count(meta)
    return meta


def _read_header(cursor: _Cursor, path: Path) -> tuple[int, int, int]:
    head = cursor.peek(64)
    if head[:4] != GGUF_MAGIC:
        raise ModelError(_not_gguf_message(path, head))
    _, version, n_tensors, n_kv = cursor.unpack(_HEADER, "the GGUF header")
    _check_version(path, version)
    if n_tensors > INT64_MAX or n_tensors * _MIN_TENSOR_INFO_BYTES > cursor.remaining:
        raise _CutShort(f"the header claims {n_tensors:,} tensors, more than a {cursor.file_size:,}-byte file can hold")
    if n_kv > INT64_MAX or n_kv * _MIN_KV_BYTES > cursor.remaining:
        raise _CutShort(
            f"the header claims {n_kv:,} metadata entries, more than a {cursor.file_size:,}-byte file can hold"
        )
    return version, n_tensors, n_kv


def _not_gguf_message(path: Path, head: bytes) -> str:
    """Name the common look-alikes, because 'bad magic' alone does not tell the user what to do."""
    lowered = head.lstrip().lower()
    if head.startswith(b"version https://git-lfs"):
        hint = (
            "it is a Git LFS pointer, not the model; run `git lfs pull` in its repository or download the file itself"
        )
    elif lowered.startswith((b"<!doctype html", b"<html")):
        hint = "it is an HTML page (a failed download?); download the .gguf file itself"
    elif head[:4] in (b"lmgg", b"fmgg", b"tjgg"):
        hint = "it is an old GGML/GGJT model, which llama.cpp no longer reads; get a GGUF version of the model"
    elif head[:4] == b"PK\x03\x04":
        hint = "it is a zip archive (a PyTorch checkpoint?); convert it to GGUF with llama.cpp's convert_hf_to_gguf.py"
    elif head[8:10] in (b'{"', b"{'"):
        hint = "it looks like a safetensors file; convert it to GGUF with llama.cpp's convert_hf_to_gguf.py"
    else:
        hint = "pass a .gguf model file"
    return f"{path} is not a GGUF file (starts with {head[:8]!r}); {hint}"


def _check_version(path: Path, version: int) -> None:
    if version in SUPPORTED_VERSIONS:
        return
    if version == 1:
        raise ModelError(
            f"{path} is GGUF version 1, which llama.cpp no longer supports; get a newer conversion of the model"
        )
    if version & 0xFFFF == 0 and (version >> 16) in range(1, 0x10000):
        # A small number byte-swapped: a big-endian GGUF, which a little-endian llama.cpp cannot read.
        raise ModelError(
            f"{path} is a big-endian GGUF file; llama.cpp on this machine needs the little-endian version of the model"
        )
    raise ModelError(
        f"{path} is GGUF version {version}, but only versions 2 and 3 are supported; "
        "update llmchat and llama-cpp-python, or use a file converted for them"
    )


def _read_key_values(cursor: _Cursor, meta: GGUFMetadata, n_kv: int) -> None:
    for index in range(n_kv):
        key = cursor.string(f"the name of metadata entry {index}")
        if not key:
            raise _Corrupt(f"metadata entry {index} has an empty name")
        if key in meta.scalars or key in meta.arrays:
            raise _Corrupt(f"metadata key {shown_name(key)} appears twice")
        value_type = _value_type(cursor.u32(f"the type of {shown_name(key)}"), key)
        if value_type == ValueType.ARRAY:
            _read_array_value(cursor, meta, key)
        else:
            meta.scalars[key] = _read_scalar(cursor, value_type, key)


def _value_type(raw: int, key: str) -> ValueType:
    try:
        return ValueType(raw)
    except ValueError:
        raise _Corrupt(f"metadata key {shown_name(key)} has an invalid value type {raw}") from None


def _read_scalar(cursor: _Cursor, value_type: ValueType, key: str) -> Any:
    what = f"the value of {shown_name(key)}"
    if value_type == ValueType.STRING:
        return cursor.string(what)
    return cursor.unpack(struct.Struct("<" + SCALAR_FORMATS[value_type]), what)[0]


def _read_array_value(cursor: _Cursor, meta: GGUFMetadata, key: str) -> None:
    shown = shown_name(key)
    what = f"the array {shown}"
    element_type = _value_type(cursor.u32(f"the element type of {shown}"), key)
    if element_type == ValueType.ARRAY:
        raise _Corrupt(f"metadata key {shown} is an array of arrays, which llama.cpp does not support")
    count = cursor.u64(f"the length of {shown}")
    min_element_size = 8 if element_type == ValueType.STRING else SCALAR_SIZES[element_type]
    if count > MAX_ARRAY_ELEMENTS or count * min_element_size > cursor.remaining:
        raise _CutShort(f"metadata array {shown} claims {count:,} elements but only {cursor.remaining:,} bytes remain")
    start = cursor.pos
    if count <= SMALL_ARRAY_MAX:
        meta.scalars[key] = _read_small_array(cursor, element_type, count, what)
        return
    if element_type == ValueType.STRING:
        cursor.skip_strings(count, what)
    else:
        cursor.skip(count * min_element_size, what)
    meta.arrays[key] = ArrayInfo(key=key, type=element_type, count=count, offset=start, nbytes=cursor.pos - start)


def _read_small_array(cursor: _Cursor, element_type: ValueType, count: int, what: str) -> list[Any]:
    if element_type == ValueType.STRING:
        return [cursor.string(what) for _ in range(count)]
    return list(cursor.unpack(struct.Struct(f"<{count}{SCALAR_FORMATS[element_type]}"), what))


def _alignment(meta: GGUFMetadata) -> int:
    value = meta.scalars.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise _Corrupt(f"general.alignment is {value!r}, not a power of two")
    return value


def _read_tensor_infos(cursor: _Cursor, n_tensors: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    seen: set[str] = set()
    for index in range(n_tensors):
        tensor = _read_tensor_info(cursor, index)
        if tensor.name in seen:
            raise _Corrupt(f"tensor {shown_name(tensor.name)} appears twice")
        seen.add(tensor.name)
        tensors.append(tensor)
    return tensors


def _read_tensor_info(cursor: _Cursor, index: int) -> TensorInfo:
    name = cursor.string(f"the name of tensor {index}")
    if len(name.encode("utf-8")) > MAX_TENSOR_NAME:
        raise _Corrupt(f"tensor {index} has a name longer than {MAX_TENSOR_NAME} bytes")
    shown = shown_name(name)
    n_dims = cursor.u32(f"the shape of tensor {shown}")
    if n_dims > MAX_DIMS:
        raise _Corrupt(f"tensor {shown} has {n_dims:,} dimensions (at most {MAX_DIMS} allowed)")
    shape = cursor.unpack(struct.Struct(f"<{n_dims}Q"), f"the shape of tensor {shown}")
    _check_shape(name, shape)
    type_id = cursor.u32(f"the type of tensor {shown}")
    offset = cursor.u64(f"the offset of tensor {shown}")
    nbytes = _tensor_nbytes(name, shape, type_id)
    return TensorInfo(name=name, shape=tuple(shape), ggml_type=type_id, offset=offset, nbytes=nbytes)


def _check_shape(name: str, shape: tuple[int, ...]) -> None:
    elements = 1
    for dim in shape:
        if dim > INT64_MAX:
            raise _Corrupt(f"tensor {shown_name(name)} has a negative dimension")
        elements *= dim
    if elements > INT64_MAX:
        raise _Corrupt(f"tensor {shown_name(name)} has an impossible shape {tuple(shape)}")


def _tensor_nbytes(name: str, shape: tuple[int, ...], type_id: int) -> int:
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise _Unsupported(f"tensor {shown_name(name)} has unknown ggml type {type_id}")
    row = shape[0] if shape else 1
    if row % ggml_type.block_size:
        raise _Corrupt(
            f"tensor {shown_name(name)} of type {ggml_type.name} has rows of {row} elements, "
            f"not a multiple of its block size {ggml_type.block_size}"
        )
    elements = 1
    for dim in shape:
        elements *= dim
    return elements // ggml_type.block_size * ggml_type.type_size


def _pad(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def _check_tensor_layout(meta: GGUFMetadata) -> None:
    """Offsets must follow each other like llama.cpp expects, and the data must fit in the file."""
    expected = 0
    for tensor in meta.tensors:
        if tensor.offset != expected:
            raise _Corrupt(f"tensor {shown_name(tensor.name)} is at offset {tensor.offset:,}, expected {expected:,}")
        expected += _pad(tensor.nbytes, meta.alignment)
    data_end = meta.data_offset + max((t.offset + t.nbytes for t in meta.tensors), default=0)
    if data_end > meta.file_size:
        present = meta.file_size / data_end * 100
        raise ModelError(
            f"{meta.path} is truncated: it has {meta.file_size:,} of the {data_end:,} bytes its tensors need "
            f"({present:.0f}% present); {ADVICE_REDOWNLOAD}"
        )


def _check_layer_count(meta: GGUFMetadata) -> None:
    layers = _as_int(meta.arch_get("block_count"))
    if layers == 0:
        raise ModelError(
            f"{meta.path} declares zero layers ({meta.architecture}.block_count = 0), so it cannot run; "
            "use a complete model file"
        )
    if layers is not None and not 0 < layers <= MAX_LAYERS:
        # Also protects every per-layer computation downstream from a hostile count.
        raise ModelError(
            f"{meta.path} declares {layers:,} layers ({meta.architecture}.block_count), more than llama.cpp's "
            f"limit of {MAX_LAYERS}; {ADVICE_RECONVERT}"
        )


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return None
