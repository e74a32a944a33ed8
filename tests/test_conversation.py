"""The token budget and trimming: pure logic first (a word-count tokenizer), then the real model."""

from __future__ import annotations

import json

import pytest

from llmchat.errors import ContextOverflowError
from llmchat.turn.conversation import Budget, Conversation, fit_to_context


def words(messages: list[dict]) -> list[int]:
    """A stand-in tokenizer for the pure trimming logic: one token per word plus 4 per message."""
    return [0] * sum(len(m["content"].split()) + 4 for m in messages)


def chat_of(exchanges: int, size: int) -> Conversation:
    conversation = Conversation(system="be brief")
    for i in range(exchanges):
        conversation.add_exchange(f"question {i} " + "w " * size, f"answer {i} " + "w " * size)
    return conversation


def test_fits_without_trimming():
    conversation = chat_of(2, 5)
    fit = fit_to_context(conversation, "hello", Budget(1000, 100), words)
    assert fit.messages_dropped == 0 and conversation.window_start == 0


def test_trims_whole_exchanges_down_to_the_target_and_keeps_system_and_newest():
    conversation = chat_of(10, 20)
    budget = Budget(400, 100)
    fit = fit_to_context(conversation, "newest question", budget, words)
    assert fit.messages_dropped > 0 and fit.messages_dropped % 2 == 0
    assert len(fit.prompt_tokens) <= budget.prompt_limit * 0.65 + 1
    kept = conversation.prompt_messages("newest question")
    assert kept[0] == {"role": "system", "content": "be brief"}
    assert kept[-1]["content"] == "newest question"
    assert kept[1]["role"] == "user"  # the window starts on an exchange boundary
    assert fit.tokens_dropped > 0


def test_after_a_trim_the_next_turns_extend_the_same_prefix():
    conversation = chat_of(10, 20)
    budget = Budget(400, 100)
    fit_to_context(conversation, "q", budget, words)
    start = conversation.window_start
    conversation.add_exchange("q", "short answer")
    fit = fit_to_context(conversation, "another", budget, words)
    assert fit.messages_dropped == 0 and conversation.window_start == start


def test_a_message_too_big_alone_is_refused_with_counts():
    conversation = chat_of(1, 5)
    with pytest.raises(ContextOverflowError) as info:
        fit_to_context(conversation, "w " * 500, Budget(300, 50), words)
    assert "--ctx" in str(info.value) and info.value.prompt_tokens > info.value.limit
    assert conversation.window_start == 0  # nothing dropped on a refusal


def test_overflow_error_mode_refuses_instead_of_trimming():
    conversation = chat_of(10, 20)
    with pytest.raises(ContextOverflowError, match="--overflow drop"):
        fit_to_context(conversation, "q", Budget(400, 100), words, overflow="error")


def test_long_scripted_chat_with_small_context_trims_and_keeps_answering(cli):
    """The real model, --ctx 512: every turn is answered, trims are announced, the system prompt survives."""
    messages = [f"Tell me one fact about the number {i}. Please answer in one or two sentences." for i in range(14)]
    result = cli(
        "chat",
        "--json",
        "--ctx",
        "512",
        "--max-tokens",
        "48",
        "--temperature",
        "0",
        "--seed",
        "3",
        "--compact",
        "off",  # trimming as such (compaction: tests/test_compaction.py)
        "--system",
        "You are a terse assistant. SYSTEM-MARKER-42.",
        input="\n".join(messages) + "\n",
    )
    assert result.returncode == 0, result.stderr
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert [t["id"] for t in turns] == list(range(1, 15))  # scripted chat: the turn number is the id
    assert all(t["reply"] is not None and t["error"] is None for t in turns)
    dropped = [t["stats"]["messages_dropped"] for t in turns]
    assert sum(dropped) > 0
    assert "context: dropped" in result.stderr
    # Turns right after a trim reuse the trimmed prefix again on the following turn.
    after_trim = [i + 1 for i, d in enumerate(dropped) if d and i + 1 < len(turns) and not dropped[i + 1]]
    assert after_trim and all(turns[i]["stats"]["cached_tokens"] > 0 for i in after_trim)
    for turn in turns:
        assert turn["stats"]["context_used"] <= turn["stats"]["context_limit"]
    # The system prompt survived every trim: history holds it for the conversation.
    shown = cli("history", "show", "last", "--json")
    assert "SYSTEM-MARKER-42" in shown.stdout


def test_cached_tokens_grow_across_turns(cli):
    result = cli(
        "chat",
        "--json",
        "--no-history",
        "--temperature",
        "0",
        "--max-tokens",
        "16",
        input="Hello there.\nWhat is your name?\nAnd what can you do?\n",
    )
    assert result.returncode == 0, result.stderr
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert turns[0]["stats"]["cached_tokens"] == 0
    for previous, turn in zip(turns, turns[1:]):
        # Only the new turn is prefilled: most of the previous prompt comes from the KV cache.
        assert turn["stats"]["cached_tokens"] >= previous["stats"]["prompt_tokens"] - 2
        assert turn["stats"]["prefill_tokens"] < turn["stats"]["prompt_tokens"]


def test_scripted_chat_message_too_long_is_skipped_and_session_goes_on(cli):
    result = cli(
        "chat",
        "--json",
        "--no-history",
        "--ctx",
        "128",
        "--max-tokens",
        "16",
        input="Hi.\n" + "word " * 300 + "\nBye.\n",
    )
    assert result.returncode == 4
    turns = [json.loads(line) for line in result.stdout.splitlines()]
    assert [t["error"] is None for t in turns] == [True, False, True]
    assert "raise --ctx" in result.stderr


def test_trim_turn_shifts_the_kept_cache_instead_of_prefilling_it(cli):
    """After a trim, the kept exchanges stay in the KV cache (moved back), unless --no-kv-shift."""
    messages = (
        "\n".join(f"Tell me one fact about the number {i}. Please answer in one or two sentences." for i in range(12))
        + "\n"
    )
    common = (
        "chat",
        "--json",
        "--no-history",
        "--ctx",
        "512",
        "--max-tokens",
        "48",
        "--temperature",
        "0",
        "--compact",
        "off",
    )
    cached_on_trim = {}
    for flag in ("--kv-shift", "--no-kv-shift"):
        result = cli(*common, flag, input=messages)
        assert result.returncode == 0, result.stderr
        turns = [json.loads(line) for line in result.stdout.splitlines()]
        trims = [t for t in turns if t["stats"]["messages_dropped"]]
        assert trims, "the small context must force a trim"
        cached_on_trim[flag] = trims[0]["stats"]["cached_tokens"]
        assert all(t["reply"] for t in turns)
    # Without the shift only the system prompt survives in the cache; with it, the kept turns do too.
    assert cached_on_trim["--kv-shift"] > cached_on_trim["--no-kv-shift"] + 64
