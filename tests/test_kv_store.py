"""The KV cache on disk (llmchat.engine.kv_store) with the real engine and SmolLM2.

One engine serves the in-process tests; "a new process" is that engine with its KV cache emptied
(what a fresh context holds). The CLI tests run real new processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmchat.engine.interface import GenerateRequest
from llmchat.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=1)
STORY = " ".join(f"Note {i}: the lighthouse keeper counted {i} ships before dawn." for i in range(12))


@pytest.fixture(scope="module")
def engine(smollm2_path):
    from llmchat.engine import Engine, EngineSettings

    loaded = Engine.load(smollm2_path, EngineSettings(n_ctx=1024, batch_size=512))
    yield loaded
    loaded.close()


def forget(engine) -> None:
    """What a new process starts with: an empty KV cache."""
    engine.model.clear()


def chat_prompt(engine, *turns: str) -> list[int]:
    text = "".join(f"<|im_start|>{role}\n{content}<|im_end|>\n" for role, content in turns)  # type: ignore[misc]
    return engine.tokenize(
        "<|im_start|>system\nYou are brief.<|im_end|>\n" + text + "<|im_start|>assistant\n", special=True
    )


def user(text: str) -> tuple[str, str]:
    return ("user", text)


def reply(engine, prompt: list[int], n: int = 12) -> list[int]:
    generation = engine.generate(GenerateRequest(prompt, GREEDY, max_tokens=n))
    for _ in generation:
        pass
    return generation.outcome.generated_ids


def store(engine, folder: Path, **kwargs):
    from llmchat.engine.kv_store import KVStore

    notices: list[str] = []
    return KVStore(engine, folder=folder, warn=notices.append, **kwargs), notices


def test_restored_cache_continues_exactly_as_the_cache_in_memory(engine, tmp_path):
    """A restore brings back the very keys and values the first process had: continuing from disk
    must give the same greedy reply, token for token, as continuing in memory."""
    kv, notices = store(engine, tmp_path)
    forget(engine)
    first = chat_prompt(engine, user(STORY + " How many notes are there?"))
    first_reply = reply(engine, first)
    saved = kv.save("conv-1")
    assert saved is not None and saved.stat().st_mode & 0o777 == 0o600
    evaluated = engine.evaluated_tokens()
    assert evaluated == first + first_reply[:-1] or evaluated == first + first_reply

    second = evaluated + engine.tokenize("<|im_end|>\n<|im_start|>user\nAnd the last ship?<|im_end|>\n", special=True)
    second += engine.tokenize("<|im_start|>assistant\n", special=True)
    in_memory = reply(engine, second)

    forget(engine)
    restored = kv.restore(second)
    assert restored is not None and restored.tokens == len(evaluated)
    assert engine.cached_prefix(second) == len(evaluated)
    generation = engine.generate(GenerateRequest(second, GREEDY, max_tokens=12))
    for _ in generation:
        pass
    assert generation.outcome.cached_tokens == len(evaluated)
    assert generation.outcome.generated_ids == in_memory
    assert notices == []

    # A fresh prefill computes the same prefix in one batch instead of token by token; with flash
    # attention the rows agree to rounding (docs/speed-and-memory.md, determinism), so only the first pick is held.
    forget(engine)
    fresh = reply(engine, second)
    assert fresh[0] == in_memory[0]


def test_a_shorter_shared_prefix_is_restored_and_cut_back(engine, tmp_path):
    """Batch items and edited conversations share only the start of a saved sequence."""
    kv, _ = store(engine, tmp_path)
    forget(engine)
    first = chat_prompt(engine, user(STORY + " Which note mentions 7 ships?"))
    reply(engine, first)
    kv.save(None)
    other = chat_prompt(engine, user(STORY + " Which note is the first?"))
    shared = next(i for i, (a, b) in enumerate(zip(first, other)) if a != b)
    forget(engine)
    restored = kv.restore(other)
    assert restored is not None and restored.tokens == shared
    assert engine.evaluated_tokens() == other[: restored.tokens]
    generation = engine.generate(GenerateRequest(other, GREEDY, max_tokens=4))
    for _ in generation:
        pass
    assert generation.outcome.cached_tokens == restored.tokens


def test_nothing_is_restored_when_memory_already_has_it(engine, tmp_path):
    kv, _ = store(engine, tmp_path)
    forget(engine)
    prompt = chat_prompt(engine, user(STORY))
    reply(engine, prompt, n=2)
    kv.save("conv-2")
    assert kv.restore(prompt) is None  # the in-memory cache already covers the prompt


def _three_sequences(engine, kv) -> list[Path]:
    saved = []
    for index, question in enumerate(("Who kept the light?", "What came at dawn?", "How cold was it?")):
        forget(engine)
        reply(engine, chat_prompt(engine, user(f"{STORY} {question}")), n=1)
        path = kv.save(f"conv-{index}")
        assert path is not None
        os.utime(path, (1_000_000 + index * 10, 1_000_000 + index * 10))  # a clear order of use
        saved.append(path)
    return saved


def test_eviction_keeps_the_folder_under_its_bound_least_recently_used_first(engine, tmp_path):
    probe, _ = store(engine, tmp_path / "probe")
    forget(engine)
    reply(engine, chat_prompt(engine, user(f"{STORY} Who kept the light?")), n=1)
    one_file = probe.save("probe").stat().st_size

    kv, _ = store(engine, tmp_path / "kv", max_bytes=int(one_file * 2.5))
    first, second, third = _three_sequences(engine, kv)
    assert not first.exists() and second.exists() and third.exists()
    total = sum(p.stat().st_size for p in (tmp_path / "kv").iterdir())
    assert total <= one_file * 2.5


def test_a_restore_counts_as_a_use(engine, tmp_path):
    kv, _ = store(engine, tmp_path)
    forget(engine)
    reply(engine, chat_prompt(engine, user(f"{STORY} Who kept the light?")), n=1)
    size = kv.save("sizer").stat().st_size
    kv.max_bytes = int(size * 10)
    for path in tmp_path.iterdir():
        path.unlink()
    first, second, third = _three_sequences(engine, kv)
    forget(engine)
    assert kv.restore(chat_prompt(engine, user(f"{STORY} Who kept the light? And who else?"))) is not None
    from llmchat.engine.kv_store import evict

    evict(int(size * 2.5), folder=tmp_path)
    assert first.exists() and not second.exists() and third.exists()


def test_one_conversation_keeps_one_file_and_history_rm_can_remove_it(engine, tmp_path):
    from llmchat.engine.kv_store import remove_for_conversation

    kv, _ = store(engine, tmp_path)
    forget(engine)
    prompt = chat_prompt(engine, user(STORY))
    reply(engine, prompt, n=2)
    older = kv.save("talk")
    reply(engine, chat_prompt(engine, user(STORY), ("assistant", "Twelve."), user("Sure?")), n=2)
    newer = kv.save("talk")
    assert newer != older and not older.exists() and newer.exists()
    assert remove_for_conversation("talk", folder=tmp_path) == [newer]
    assert list(tmp_path.iterdir()) == []


def _saved(engine, folder: Path) -> tuple[Path, list[int]]:
    kv, _ = store(engine, folder)
    forget(engine)
    prompt = chat_prompt(engine, user(STORY + " Count the notes."))
    reply(engine, prompt, n=2)
    path = kv.save("c")
    assert path is not None
    return path, prompt + engine.tokenize("more text for the next turn, long enough", special=False)


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip_state", "flip_header", "flip_tokens", "empty", "garbage"],
)
def test_damaged_files_are_skipped_with_one_notice_and_deleted(engine, tmp_path, damage):
    path, next_prompt = _saved(engine, tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 1000]
    elif damage == "flip_state":
        data[-500] ^= 0xFF
    elif damage == "flip_header":
        data[12] = ord("!")
    elif damage == "flip_tokens":
        header_end = 12 + int.from_bytes(data[8:12], "little")
        data[header_end + 40] ^= 0x01  # one token id changes: the file no longer spells the prompt
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(os.urandom(4096))
    path.write_bytes(bytes(data))
    kv, notices = store(engine, tmp_path)
    forget(engine)
    restored = kv.restore(next_prompt)
    if damage == "flip_tokens":
        # Still a whole file, but its tokens part from the prompt at the flipped one: it can give
        # at most the tokens before it, which is too little to be worth a read here.
        assert restored is None or restored.tokens < 40
        assert engine.evaluated_tokens() == next_prompt[: len(engine.evaluated_tokens())]
        return
    assert restored is None
    assert len(notices) == 1 and path.name in notices[0] and "deleted" in notices[0], notices
    assert not path.exists()
    assert engine.evaluated_tokens() == []
    # The turn goes on with a full prefill.
    generation = engine.generate(GenerateRequest(next_prompt, GREEDY, max_tokens=2))
    for _ in generation:
        pass
    assert generation.outcome.cached_tokens == 0 and generation.outcome.generated_tokens == 2


def test_a_file_for_another_version_of_the_model_is_deleted(smollm2_path, tmp_path):
    """Same path, other size or mtime: the weights may have changed; the file is never loaded."""
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.kv_store import KVStore

    copy = tmp_path / "model.gguf"
    shutil.copyfile(smollm2_path, copy)
    folder = tmp_path / "kv"
    engine = Engine.load(copy, EngineSettings(n_ctx=512))
    try:
        kv = KVStore(engine, folder=folder)
        prompt = chat_prompt(engine, user(STORY))
        reply(engine, prompt, n=2)
        path = kv.save("m")
        assert path is not None
        os.utime(copy, (1_000_000, 1_000_000))  # the model file was replaced
        notices: list[str] = []
        changed = KVStore(engine, folder=folder, warn=notices.append)
        forget(engine)
        assert changed.restore(prompt + engine.tokenize(" and more words to prefill here", special=False)) is None
        assert len(notices) == 1 and "another version of this model file" in notices[0]
        assert not path.exists()
    finally:
        engine.close()


def test_other_settings_neither_load_nor_delete_a_file(engine, tmp_path):
    """A file for another n_ctx or flash-attention setting is valid for that engine: kept."""
    from llmchat.engine.kv_store import KVStore, list_entries

    path, next_prompt = _saved(engine, tmp_path)
    kv = KVStore(engine, folder=tmp_path)
    kv.identity = kv.identity | {"n_ctx": 4096}
    forget(engine)
    assert kv.restore(next_prompt) is None
    assert path.exists() and len(list_entries(tmp_path)[0]) == 1


WRITER = """
import sys
from pathlib import Path
from llmchat.engine.kv_store import write_entry
import json
folder, identity, tokens, state_file, name = sys.argv[1:6]
state = Path(state_file).read_bytes()
for _ in range(int(sys.argv[6])):
    write_entry(Path(folder), json.loads(identity), json.loads(tokens), state, name)
"""


def test_two_processes_writing_the_same_key_leave_no_torn_file(engine, tmp_path):
    from llmchat.engine.kv_store import KVStore, read_entry

    forget(engine)
    prompt = chat_prompt(engine, user(STORY))
    reply(engine, prompt, n=2)
    tokens = engine.evaluated_tokens()
    state = engine.sequence_state()
    state_file = tmp_path / "state.bin"
    state_file.write_bytes(state)
    folder = tmp_path / "kv"
    identity = KVStore(engine, folder=folder).identity
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(folder), json.dumps(identity), json.dumps(tokens), str(state_file)]
            + [name, "15"]
        )
        for name in ("writer-a", "writer-b")
    ]
    seen = 0
    for _ in range(200):  # bounded: read while they write
        for path in folder.glob("*.kv") if folder.exists() else []:
            entry = read_entry(path)  # raises CorruptFile on a torn file
            assert entry.tokens.tolist() == tokens
            assert entry.conversation_id in ("writer-a", "writer-b")
            seen += 1
        if all(w.poll() is not None for w in writers):
            break
    for writer in writers:
        assert writer.wait(timeout=120) == 0
    files = list(folder.iterdir())
    assert len(files) == 1, files  # one name, no temp file left behind
    kv, notices = store(engine, folder)
    forget(engine)
    restored = kv.restore(tokens + engine.tokenize(" and then the next question comes along here", special=False))
    assert restored is not None and restored.tokens == len(tokens) and notices == []


@pytest.mark.model
def test_ask_continue_in_a_new_process_restores_from_disk(cli, isolated_home):
    args = ("--temperature", "0", "--max-tokens", "8", "--ctx", "1024", "--json")
    first = cli("ask", *args, STORY + " How many notes?")
    assert first.returncode == 0, first.stderr
    files = list((isolated_home / "cache" / "kv").glob("*.kv"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    assert (isolated_home / "cache" / "kv").stat().st_mode & 0o777 == 0o700
    record = json.loads(first.stdout)
    used = record["stats"]["context_used"]

    second = cli("ask", "-c", *args, "And the last one?")
    assert second.returncode == 0, second.stderr
    stats = json.loads(second.stdout)["stats"]
    assert stats["disk_cached_tokens"] >= used - 2
    assert stats["cached_tokens"] == stats["disk_cached_tokens"]
    assert stats["restore_s"] > 0

    listing = cli("cache", "list", "--json")
    assert listing.returncode == 0
    assert [f["conversation_id"] for f in json.loads(listing.stdout)["files"]] == [record["conversation_id"]]

    off = cli("ask", "-c", "--no-prompt-cache", *args, "Again?")
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout)["stats"]["disk_cached_tokens"] == 0

    cleared = cli("cache", "clear")
    assert cleared.returncode == 0 and "removed 1 KV cache file" in cleared.stderr
    assert list((isolated_home / "cache" / "kv").glob("*.kv")) == []


@pytest.mark.model
def test_no_history_writes_no_kv_cache(cli, isolated_home):
    result = cli("ask", "--no-history", "--temperature", "0", "--max-tokens", "4", "--ctx", "1024", STORY)
    assert result.returncode == 0, result.stderr
    assert not (isolated_home / "cache" / "kv").exists()
