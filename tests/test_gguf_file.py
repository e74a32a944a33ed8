"""The GGUF reader: correct on real models, and one clear ModelError (never a crash) on bad files.

Bad files are made two ways: with the `gguf` package's GGUFWriter (well-formed files with bad
content) and by byte surgery on a small generated file (what a broken download or tool produces).
Each bad file is also run through `llmchat info`, which must exit 3 with one stderr line.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from llmchat.errors import ModelError
from llmchat.gguf.loadable import KNOWN_ARCHITECTURES, check_loadable
from llmchat.gguf.metadata import GGML_TYPES, ValueType, ggml_type_name
from llmchat.gguf.reader import SMALL_ARRAY_MAX, read_metadata

REPO_ROOT = Path(__file__).resolve().parent.parent
N_VOCAB = 100  # > SMALL_ARRAY_MAX, so the vocabulary is a lazily read array
N_EMBD = 64


# ---------------------------------------------------------------------------------------------
# Fixtures and builders


# smollm2_path and gemma_path come from conftest.py: a missing test model fails, never skips.


def token_texts_for_test() -> list[str]:
    return ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(N_VOCAB - 4)] + ["héllo ▁wörld"]


def write_small_gguf(
    path: Path,
    *,
    arch: str = "llama",
    block_count: int = 2,
    name: str = "tiny test model",
    with_context_length: bool = True,
) -> Path:
    """A small but complete llama-style GGUF: vocabulary, hyperparameters and a few F32/F16 tensors."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(block_count)
    if with_context_length:
        writer.add_context_length(256)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_file_type(1)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(token_texts_for_test())
    writer.add_array("test.small_ints", [1, 2, 3])
    writer.add_tensor("token_embd.weight", np.ones((N_VOCAB, N_EMBD), dtype=np.float16))
    for layer in range(min(max(block_count, 1), 2)):  # a few layers of weights are enough here
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{layer}.attn_q.weight", np.ones((N_EMBD, N_EMBD), dtype=np.float16))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def small_gguf(tmp_path: Path) -> Path:
    return write_small_gguf(tmp_path / "tiny.gguf")


def kv_value_offset(data: bytes, key: str) -> int:
    """File offset just after a metadata key's name, where its u32 type starts."""
    encoded = key.encode()
    index = data.index(struct.pack("<Q", len(encoded)) + encoded)
    return index + 8 + len(encoded)


def tensor_info_offset(data: bytes, name: str) -> int:
    """File offset just after a tensor's name in the tensor table, where n_dims starts."""
    encoded = name.encode()
    index = data.rindex(struct.pack("<Q", len(encoded)) + encoded)
    return index + 8 + len(encoded)


def patched(source: Path, target: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(source.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    target.write_bytes(bytes(data))
    return target


def truncated_copy(source: Path, target: Path, fraction: float) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


def assert_one_line_model_error(path: Path, *fragments: str) -> ModelError:
    with pytest.raises(ModelError) as caught:
        meta = read_metadata(path)
        check_loadable(meta)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment.lower() in message.lower(), message
    return caught.value


def run_info(model: Path | str, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMCHAT_HOME=str(home))
    env.pop("LLMCHAT_MODEL", None)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "llmchat", "info", "-m", str(model), *extra],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )


def assert_cli_model_error(model: Path | str, home: Path, *fragments: str) -> None:
    result = run_info(model, home, "--json")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), lines[0]
    assert result.stdout == ""


# ---------------------------------------------------------------------------------------------
# Real models


def test_smollm2_metadata(smollm2_path: Path) -> None:
    meta = read_metadata(smollm2_path)
    assert meta.version == 3
    assert meta.file_size == smollm2_path.stat().st_size
    assert meta.architecture == "llama"
    assert meta.get("llama.block_count") == 30
    assert meta.get("llama.attention.head_count") == 9
    assert meta.get("llama.attention.head_count_kv") == 3
    assert meta.get("llama.context_length") == 8192
    assert meta.get("general.languages") == ["en"]  # a small array is read eagerly
    assert "tokenizer.chat_template" in meta.scalars
    assert meta.get("no.such.key", "fallback") == "fallback"
    tokens = meta.arrays["tokenizer.ggml.tokens"]
    assert tokens.type == ValueType.STRING and tokens.count == 49152
    assert "tokenizer.ggml.tokens" not in meta.scalars
    assert len(meta.tensors) == 272
    last = meta.tensors[-1]
    assert meta.data_offset + last.offset + last.nbytes == meta.file_size
    assert meta.data_offset % meta.alignment == 0


def test_smollm2_token_texts(smollm2_path: Path) -> None:
    texts = read_metadata(smollm2_path).token_texts()
    assert len(texts) == 49152
    assert texts[:3] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def test_smollm2_matches_gguf_package(smollm2_path: Path) -> None:
    """Cross-check tensors, offsets and the vocabulary against the reference reader."""
    from gguf import GGUFReader

    reference = GGUFReader(str(smollm2_path))
    meta = read_metadata(smollm2_path)
    assert [t.name for t in reference.tensors] == [t.name for t in meta.tensors]
    for ref, ours in zip(reference.tensors, meta.tensors):
        assert int(ref.n_bytes) == ours.nbytes, ours.name
        assert int(ref.data_offset) == meta.data_offset + ours.offset, ours.name
        assert tuple(int(d) for d in ref.shape) == ours.shape, ours.name
        assert int(ref.tensor_type) == ours.ggml_type, ours.name
    field = reference.fields["tokenizer.ggml.tokens"]
    expected = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    assert meta.token_texts() == expected
    merges = meta.read_array("tokenizer.ggml.merges")
    assert len(merges) == 48900 and " " in merges[0]
    assert meta.read_array("tokenizer.ggml.token_type")[:3] == [3, 3, 3]


def test_gemma_metadata_and_vocabulary(gemma_path: Path) -> None:
    meta = read_metadata(gemma_path)
    assert meta.architecture == "gemma3"
    assert meta.get("gemma3.block_count") == 18
    assert meta.get("gemma3.attention.sliding_window") == 512
    assert "tokenizer.chat_template" not in meta
    texts = meta.token_texts()
    assert len(texts) == 262144
    assert texts[:3] == ["<pad>", "<eos>", "<bos>"]
    assert meta.arrays["tokenizer.ggml.scores"].type == ValueType.FLOAT32
    assert sum(t.nbytes for t in meta.tensors) == meta.tensor_data_bytes
    check_loadable(meta)


def test_ggml_type_table_matches_gguf_package() -> None:
    from gguf import GGML_QUANT_SIZES

    for quant_type, (block_size, type_size) in GGML_QUANT_SIZES.items():
        ours = GGML_TYPES[int(quant_type)]
        assert (ours.name, ours.block_size, ours.type_size) == (quant_type.name, block_size, type_size)
    for name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "BF16", "TQ2_0", "MXFP4"):
        assert any(t.name == name for t in GGML_TYPES.values()), name


def test_known_architectures_cover_the_common_families() -> None:
    for arch in (
        "llama",
        "gemma",
        "gemma2",
        "gemma3",
        "qwen2",
        "qwen3",
        "phi3",
        "mistral3",
        "starcoder2",
        "granite",
        "command-r",
        "deepseek2",
        "olmo",
        "olmo2",
        "gpt-oss",
        "smollm3",
    ):
        assert arch in KNOWN_ARCHITECTURES, arch


# ---------------------------------------------------------------------------------------------
# A generated file


def test_small_generated_file_reads_back(small_gguf: Path) -> None:
    meta = read_metadata(small_gguf)
    assert meta.architecture == "llama"
    assert meta.get("general.name") == "tiny test model"
    assert meta.get("test.small_ints") == [1, 2, 3]
    assert meta.arrays["tokenizer.ggml.tokens"].count == N_VOCAB > SMALL_ARRAY_MAX
    assert meta.token_texts() == token_texts_for_test()  # including non-ASCII text
    embedding = meta.tensors[0]
    assert embedding.name == "token_embd.weight"
    assert embedding.shape == (N_EMBD, N_VOCAB)  # ggml order: row length first
    assert ggml_type_name(embedding.ggml_type) == "F16" and embedding.nbytes == N_VOCAB * N_EMBD * 2
    check_loadable(meta)


def test_check_loadable_accepts_a_path_for_messages(small_gguf: Path, tmp_path: Path) -> None:
    meta = read_metadata(write_small_gguf(tmp_path / "odd.gguf", arch="notarealarch"))
    with pytest.raises(ModelError, match="shown-name.gguf"):
        check_loadable(meta, "shown-name.gguf")


# ---------------------------------------------------------------------------------------------
# Bad files: what is wrong, and what to do, in one line


def test_missing_file(tmp_path: Path) -> None:
    err = assert_one_line_model_error(tmp_path / "nope.gguf", "not found", "nope.gguf", "check the path")
    assert err.exit_code == 3


def test_directory(tmp_path: Path) -> None:
    assert_one_line_model_error(tmp_path, "is a directory", "pass the .gguf file")


@pytest.mark.root
def test_permission_denied(small_gguf: Path) -> None:
    small_gguf.chmod(0)
    try:
        try:
            with open(small_gguf, "rb"):
                pytest.skip("running as root (or similar): chmod does not stop reads here")
        except PermissionError:
            pass
        assert_one_line_model_error(small_gguf, "permission denied", "chmod")
    finally:
        small_gguf.chmod(0o644)


def test_permission_denied_mapping(small_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same error as above, simulated, so it is covered even where tests run as root."""
    import llmchat.gguf.reader as gguf_reader

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gguf_reader, "open", denied, raising=False)
    assert_one_line_model_error(small_gguf, "permission denied", "chmod")


def test_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    assert_one_line_model_error(empty, "is empty", "download")


def test_random_bytes(tmp_path: Path) -> None:
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(b"\x00\x01" + random.Random(0).randbytes(4094))
    assert_one_line_model_error(noise, "not a GGUF file", "starts with", "pass a .gguf model file")


def test_non_gguf_text_file(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, I am not a model\n")
    assert_one_line_model_error(text, "not a GGUF file", "b'hello, I'")


@pytest.mark.parametrize(
    ("content", "hint"),
    [
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 12\n", "git lfs"),
        (b"<!DOCTYPE html><html><body>Not found</body></html>", "HTML page"),
        (b"PK\x03\x04" + bytes(60), "zip"),
        (b"tjgg" + bytes(60), "GGML"),
    ],
)
def test_common_look_alikes_are_named(tmp_path: Path, content: bytes, hint: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    assert_one_line_model_error(path, "not a GGUF file", hint)


def test_magic_only(tmp_path: Path) -> None:
    path = tmp_path / "magic.gguf"
    path.write_bytes(b"GGUF\x03\x00")
    assert_one_line_model_error(path, "truncated", "header")


@pytest.mark.parametrize(("version", "fragment"), [(1, "version 1"), (4, "version 4"), (3 << 24, "big-endian")])
def test_unsupported_versions(small_gguf: Path, tmp_path: Path, version: int, fragment: str) -> None:
    bad = patched(small_gguf, tmp_path / "version.gguf", 4, "<I", version)
    assert_one_line_model_error(bad, fragment)


@pytest.mark.parametrize("fraction", [0.10, 0.50, 0.99])
def test_truncated_generated_file(small_gguf: Path, tmp_path: Path, fraction: float) -> None:
    cut = truncated_copy(small_gguf, tmp_path / f"cut{int(fraction * 100)}.gguf", fraction)
    assert_one_line_model_error(cut, "truncated", "download the model again")


def test_truncated_inside_every_header_part(small_gguf: Path, tmp_path: Path) -> None:
    """Cut at every few bytes of the header: always 'truncated', never a Python error."""
    data = small_gguf.read_bytes()
    data_offset = read_metadata(small_gguf).data_offset
    target = tmp_path / "cut.gguf"
    for length in range(4, data_offset, 7):
        target.write_bytes(data[:length])
        with pytest.raises(ModelError, match="truncated"):
            read_metadata(target)


def test_huge_array_length(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    count_at = kv_value_offset(data, "tokenizer.ggml.tokens") + 4 + 4  # type, element type
    bad = patched(small_gguf, tmp_path / "array.gguf", count_at, "<Q", 1 << 40)
    assert_one_line_model_error(bad, "corrupt", "tokenizer.ggml.tokens", "1,099,511,627,776 elements")


def test_huge_string_length(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    length_at = kv_value_offset(data, "general.name") + 4
    bad = patched(small_gguf, tmp_path / "string.gguf", length_at, "<Q", 1 << 50)
    assert_one_line_model_error(bad, "corrupt", "general.name", "string of")


def test_huge_string_inside_a_large_array(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    first_length_at = kv_value_offset(data, "tokenizer.ggml.tokens") + 4 + 4 + 8
    bad = patched(small_gguf, tmp_path / "token.gguf", first_length_at, "<Q", 1 << 33)
    assert_one_line_model_error(bad, "corrupt", "tokenizer.ggml.tokens")


@pytest.mark.parametrize(("offset", "what"), [(8, "tensors"), (16, "metadata entries")])
def test_absurd_header_counts(small_gguf: Path, tmp_path: Path, offset: int, what: str) -> None:
    bad = patched(small_gguf, tmp_path / "counts.gguf", offset, "<Q", 10**15)
    assert_one_line_model_error(bad, "corrupt", what, "more than")


def test_unknown_tensor_type(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    type_at = tensor_info_offset(data, "output_norm.weight") + 4 + 8  # n_dims, one dimension
    bad = patched(small_gguf, tmp_path / "type.gguf", type_at, "<I", 77)
    assert_one_line_model_error(bad, "unknown ggml type 77", "output_norm.weight", "update llmchat")


def test_row_not_a_whole_block(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    type_at = tensor_info_offset(data, "output_norm.weight") + 4 + 8
    q4_k = next(t.id for t in GGML_TYPES.values() if t.name == "Q4_K")  # 256-element blocks, row is 64
    bad = patched(small_gguf, tmp_path / "block.gguf", type_at, "<I", q4_k)
    assert_one_line_model_error(bad, "not a multiple of its block size")


def test_too_many_dimensions(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    bad = patched(small_gguf, tmp_path / "dims.gguf", tensor_info_offset(data, "output_norm.weight"), "<I", 9)
    assert_one_line_model_error(bad, "9 dimensions")


def test_tensor_offset_out_of_place(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    offset_at = tensor_info_offset(data, "output_norm.weight") + 4 + 8 + 4
    bad = patched(small_gguf, tmp_path / "offset.gguf", offset_at, "<Q", 1 << 40)
    assert_one_line_model_error(bad, "output_norm.weight", "offset")


def test_invalid_value_type(small_gguf: Path, tmp_path: Path) -> None:
    data = small_gguf.read_bytes()
    bad = patched(small_gguf, tmp_path / "vtype.gguf", kv_value_offset(data, "general.name"), "<I", 42)
    assert_one_line_model_error(bad, "general.name", "invalid value type 42")


def raw_gguf(*entries: bytes) -> bytes:
    """A GGUF v3 file with no tensors and the given pre-encoded key/value entries."""
    return struct.pack("<4sIQQ", b"GGUF", 3, 0, len(entries)) + b"".join(entries)


def string_entry(key: str, value: str) -> bytes:
    k, v = key.encode(), value.encode()
    return struct.pack("<Q", len(k)) + k + struct.pack("<IQ", ValueType.STRING, len(v)) + v


def test_raw_builder_is_valid_gguf(tmp_path: Path) -> None:
    path = tmp_path / "raw.gguf"
    path.write_bytes(raw_gguf(string_entry("my.key", "one"), string_entry("other", "two")))
    assert read_metadata(path).scalars == {"my.key": "one", "other": "two"}


def test_duplicate_key(tmp_path: Path) -> None:
    path = tmp_path / "dup.gguf"
    path.write_bytes(raw_gguf(string_entry("my.key", "one"), string_entry("my.key", "two")))
    assert_one_line_model_error(path, "'my.key' appears twice")


def test_nested_array(tmp_path: Path) -> None:
    key = b"nested"
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", ValueType.ARRAY, ValueType.ARRAY, 1) + bytes(16)
    path = tmp_path / "nested.gguf"
    path.write_bytes(raw_gguf(entry))
    assert_one_line_model_error(path, "array of arrays")


def test_bad_alignment(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "align.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("general.alignment", 24)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    assert_one_line_model_error(path, "general.alignment is 24", "power of two")


def test_zero_block_count(tmp_path: Path) -> None:
    path = write_small_gguf(tmp_path / "zero.gguf", block_count=0)
    assert_one_line_model_error(path, "zero layers", "llama.block_count = 0")


def test_absurd_block_count(tmp_path: Path) -> None:
    path = write_small_gguf(tmp_path / "deep.gguf", block_count=1_000_000)
    assert_one_line_model_error(path, "1,000,000 layers", "limit of 512")


def test_control_characters_in_names_stay_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "ctrl.gguf"
    path.write_bytes(raw_gguf(string_entry("bad\nkey", "one"), string_entry("bad\nkey", "two")))
    err = assert_one_line_model_error(path, "appears twice")
    assert "bad\\nkey" in str(err)


def test_unknown_architecture(tmp_path: Path) -> None:
    path = write_small_gguf(tmp_path / "alien.gguf", arch="notarealarch")
    read_metadata(path)  # the file itself is fine ...
    assert_one_line_model_error(path, "architecture 'notarealarch'", "llama.cpp does not know")  # ... the model is not


def test_missing_required_hyperparameter(tmp_path: Path) -> None:
    path = write_small_gguf(tmp_path / "noctx.gguf", with_context_length=False)
    assert_one_line_model_error(path, "lacks required metadata", "llama.context_length")


def test_embedding_model_is_not_a_chat_model(tmp_path: Path) -> None:
    path = write_small_gguf(tmp_path / "bert.gguf", arch="bert")
    meta = read_metadata(path)
    check_loadable(meta, for_chat=False)
    with pytest.raises(ModelError, match="not a chat model"):
        check_loadable(meta)


def test_vocabulary_missing(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "novocab.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(ModelError, match="no vocabulary"):
        read_metadata(path).token_texts()


def test_random_corruption_never_escapes_as_another_error(small_gguf: Path, tmp_path: Path) -> None:
    """Flip random header bytes: the reader either copes or raises ModelError, nothing else."""
    data = small_gguf.read_bytes()
    header_end = read_metadata(small_gguf).data_offset
    rng = random.Random(1234)
    target = tmp_path / "fuzz.gguf"
    for _ in range(300):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(4, header_end)] = rng.randrange(256)
        target.write_bytes(bytes(mutated))
        try:
            meta = read_metadata(target)
            check_loadable(meta)
            if "tokenizer.ggml.tokens" in meta:
                meta.token_texts()
        except ModelError as err:
            assert "\n" not in str(err)


@pytest.mark.parametrize("fraction", [0.01, 0.10, 0.50, 0.99])  # 1% cuts into the header
def test_truncated_smollm2(smollm2_path: Path, tmp_path: Path, fraction: float) -> None:
    cut = truncated_copy(smollm2_path, tmp_path / f"smollm2-{int(fraction * 100)}.gguf", fraction)
    err = assert_one_line_model_error(cut, "truncated", "download the model again")
    if fraction >= 0.5:  # past the header: the size check says how much is there
        assert f"{cut.stat().st_size:,} of the {smollm2_path.stat().st_size:,} bytes" in str(err)


# ---------------------------------------------------------------------------------------------
# The same files through the CLI: exit 3, one stderr line, no traceback


def test_cli_bad_files(small_gguf: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    noise = tmp_path / "noise.gguf"
    noise.write_bytes(random.Random(0).randbytes(2048))
    data = small_gguf.read_bytes()
    cases: list[tuple[Path, tuple[str, ...]]] = [
        (tmp_path / "missing.gguf", ("not found",)),
        (tmp_path, ("is a directory",)),
        (empty, ("is empty",)),
        (noise, ("not a GGUF file",)),
        (truncated_copy(small_gguf, tmp_path / "cut10.gguf", 0.10), ("truncated",)),
        (truncated_copy(small_gguf, tmp_path / "cut50.gguf", 0.50), ("truncated",)),
        (truncated_copy(small_gguf, tmp_path / "cut99.gguf", 0.99), ("truncated",)),
        (
            patched(
                small_gguf, tmp_path / "array.gguf", kv_value_offset(data, "tokenizer.ggml.tokens") + 8, "<Q", 1 << 40
            ),
            ("corrupt",),
        ),
        (
            patched(small_gguf, tmp_path / "string.gguf", kv_value_offset(data, "general.name") + 4, "<Q", 1 << 50),
            ("corrupt",),
        ),
        (patched(small_gguf, tmp_path / "ntensors.gguf", 8, "<Q", 10**15), ("tensors",)),
        (write_small_gguf(tmp_path / "zero.gguf", block_count=0), ("zero layers",)),
        (write_small_gguf(tmp_path / "alien.gguf", arch="notarealarch"), ("notarealarch",)),
    ]
    for path, fragments in cases:
        assert_cli_model_error(path, home, *fragments)


def test_cli_truncated_smollm2(smollm2_path: Path, tmp_path: Path) -> None:
    cut = truncated_copy(smollm2_path, tmp_path / "smollm2-half.gguf", 0.5)
    assert_cli_model_error(cut, tmp_path, "truncated")
