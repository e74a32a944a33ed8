"""A model file's validated header is read once per file, then taken from the cache folder."""

from __future__ import annotations

import os
import shutil

import pytest

from llmchat.errors import ModelError
from llmchat.gguf.header_cache import read_metadata_cached
from llmchat.gguf.reader import read_metadata


@pytest.mark.parametrize("model", ["smollm2_path", "gemma_path"])
def test_the_cached_header_is_the_header(model, request, isolated_home):
    path = request.getfixturevalue(model)
    first = read_metadata_cached(path)  # read, then stored
    entries = list((isolated_home / "cache" / "headers").iterdir())
    assert len(entries) == 1 and entries[0].stat().st_mode & 0o777 == 0o600
    second = read_metadata_cached(path)  # from the cache
    assert first == second == read_metadata(path)
    assert second.token_texts()[:5] == read_metadata(path).token_texts()[:5]  # arrays read on demand


def test_a_changed_file_is_read_again(smollm2_path, tmp_path):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path, copy)
    assert read_metadata_cached(copy).tensors
    with open(copy, "r+b") as handle:  # the same size, a damaged header
        handle.seek(4)
        handle.write(b"\xff\xff\xff\xff")
    with pytest.raises(ModelError, match="version"):
        read_metadata_cached(copy)
    shutil.copyfile(smollm2_path, copy)
    assert read_metadata_cached(copy).tensors
    os.truncate(copy, 1000)
    with pytest.raises(ModelError, match="truncated"):
        read_metadata_cached(copy)


def test_an_unwritable_cache_folder_costs_only_the_read(smollm2_path, isolated_home):
    isolated_home.mkdir(parents=True)
    (isolated_home / "cache").write_text("not a folder")
    assert read_metadata_cached(smollm2_path) == read_metadata(smollm2_path)


def test_a_damaged_cache_entry_is_read_past(smollm2_path, isolated_home):
    read_metadata_cached(smollm2_path)
    (entry,) = (isolated_home / "cache" / "headers").iterdir()
    entry.write_text('{"version": 1, "key": "x"')
    assert read_metadata_cached(smollm2_path) == read_metadata(smollm2_path)
