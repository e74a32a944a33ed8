"""One turn, one record: every mode prints the same record shape, batch --parallel goes through the
same prepare/finish as a serial turn, earlier replies go back to the model as the ids they were
sampled as, and a reply stuck in a loop is stopped.

Real engine, real SmolLM2 (the `smollm2_path` fixture marks these `model`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmchat.engine.stopping import LoopDetector
from llmchat.turn.record import error_record

JSON_RECORD_PAGE = Path(__file__).resolve().parent.parent / "docs" / "json-record.md"


def documented_record_keys() -> tuple[str, ...]:
    """The record's keys as the manual's table lists them (docs/json-record.md, "Its keys"), in
    order: the contract the records are checked against (not a copy of the code's own list)."""
    section = JSON_RECORD_PAGE.read_text(encoding="utf-8").split("## Its keys", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    return tuple(key for row in rows for key in re.findall(r"`([a-z_]+)`", row))


RECORD_KEYS = documented_record_keys()


def test_the_record_builders_give_the_documented_keys():
    from llmchat.turn.metrics import TurnStats
    from llmchat.turn.record import TurnResult

    assert RECORD_KEYS[:3] == ("id", "reply", "reasoning") and "parsed" in RECORD_KEYS
    assert tuple(TurnResult("q", "a", "stop", TurnStats(), 1).to_record(1)) == RECORD_KEYS
    assert tuple(error_record(1, "bad")) == RECORD_KEYS


GREEDY = ("--temperature", "0", "--seed", "1", "--no-history")


def records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


# --- the record shape ---------------------------------------------------------------------------------
def test_ask_chat_and_batch_print_the_same_record_shape(cli, smollm2_path, tmp_path):
    model = ("-m", str(smollm2_path), "--max-tokens", "6", *GREEDY)
    ask = cli("ask", "--json", *model, "Name a color.")
    assert ask.returncode == 0, ask.stderr
    chat = cli("chat", "--json", *model, input="Name a color.\n")
    assert chat.returncode == 0, chat.stderr
    items = tmp_path / "items.txt"
    items.write_text("Name a color.\n{bad json\n")
    batch_model = [arg for arg in model if arg != "--no-history"]  # a batch is never saved
    serial = cli("batch", str(items), "--progress", "off", *batch_model)
    parallel = cli("batch", str(items), "--progress", "off", "--parallel", "2", *batch_model)
    assert serial.returncode == parallel.returncode == 1  # the bad line is an error record

    shapes = {
        "ask": records(ask.stdout),
        "chat": records(chat.stdout),
        "batch": records(serial.stdout),
        "batch --parallel": records(parallel.stdout),
    }
    for mode, found in shapes.items():
        for record in found:
            assert tuple(record) == RECORD_KEYS, (mode, tuple(record))
    answered = [found[0] for found in shapes.values()]
    stats_keys = {tuple(sorted(record["stats"])) for record in answered}
    assert len(stats_keys) == 1, stats_keys  # the same stats keys everywhere, trim counts and seed included
    assert all(record["seed"] is not None and "messages_dropped" in record["stats"] for record in answered)
    assert shapes["chat"][0]["id"] == 1  # scripted chat: the turn number
    assert shapes["batch"][0]["id"] == 1 and shapes["batch"][1]["error"]
    assert tuple(error_record(1, "x")) == RECORD_KEYS


def test_parallel_records_equal_serial_records(cli, smollm2_path, tmp_path):
    """The same items through --parallel 1 and --parallel 4: whole records agree (greedy replies,
    finish reasons, token counts and every stats key); only the clocks may differ."""
    items = tmp_path / "items.jsonl"
    prompts = ["Name a planet.", "What is 3 + 4?", "Name a month.", "Say hello.", "Name a fruit.", "Name a river."]
    items.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": p}) for i, p in enumerate(prompts)) + "\n")
    runs = []
    for parallel in ("1", "4"):
        # One attention kernel on both sides: --parallel turns flash attention on (engine.calibrate).
        result = cli(
            "batch", str(items), "-m", str(smollm2_path), "--max-tokens", "16", "--parallel", parallel,
            "--progress", "off", "--temperature", "0", "--seed", "1", "--flash-attn", "on",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        runs.append(records(result.stdout))
    clocks = {"ttft_s", "prefill_s", "decode_s", "total_s", "prefill_tok_s", "decode_tok_s", "ttfa_s"}
    # cached_tokens differs by design: slots share prefixes differently from one sequence. The
    # threads follow what else the machine runs at that moment (engine.threads), not the work.
    varying = clocks | {"cached_tokens", "prefill_tokens", "threads", "threads_why"}
    for serial, parallel in zip(*runs):
        assert set(serial["stats"]) == set(parallel["stats"])
        assert {k: v for k, v in serial.items() if k not in ("stats", "seed")} == {
            k: v for k, v in parallel.items() if k not in ("stats", "seed")
        }
        assert {k: v for k, v in serial["stats"].items() if k not in varying} == {
            k: v for k, v in parallel["stats"].items() if k not in varying
        }


# --- exact KV reuse after every reply ------------------------------------------------------------------
def test_sampled_reply_ids_keep_the_cache_across_ten_turns(smollm2_path):
    """At temperature 0.7 a sampled reply is often not the tokenizer's own tokenization of its
    text; the next prompt must still extend the cache: on every turn, the cached tokens are the
    previous prompt plus its reply (less the reply's end token, which is never evaluated)."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    options = RunOptions(model=str(smollm2_path), temperature=0.7, seed=11, max_tokens=60, ctx=4096)
    session = start_session(options, config=load_config(), overflow="drop", with_history=False)
    messages = [
        "Tell me a long story about a dragon.",
        "Continue the story.",
        "And then?",
        "What happened next?",
        "Describe the dragon's cave.",
        "Who else lived there?",
        "Give the dragon a name.",
        "What did it eat?",
        "How did the story end?",
        "Tell me the moral.",
    ]
    try:
        previous = None
        for message in messages:
            result = session.turn(message)
            stats = result.stats
            assert stats.messages_dropped == 0
            if previous is not None:
                expected = previous.prompt_tokens + previous.generated_tokens
                # The template adds its end-of-turn marker after a reply: at most a few tokens differ.
                assert expected - 3 <= stats.cached_tokens <= expected, (message, stats, previous)
            previous = stats
        # The mechanism itself, on a split the tokenizer would never make: a reply sampled as one
        # token per character goes back to the model as exactly those ids.
        reply = session.conversation.messages[-1]
        split = [token for char in reply["content"] for token in session.engine.tokenize(char, special=False)]
        assert session.engine.detokenize(split) == reply["content"]
        assert split != session.engine.tokenize(reply["content"], special=False)
        reply["token_ids"] = split
        prompt = session.tokenize_messages(session.conversation.prompt_messages("Next?"))
        assert any(prompt[i : i + len(split)] == split for i in range(len(prompt) - len(split) + 1))
    finally:
        session.close()


def test_reply_ids_are_used_only_where_they_spell_the_reply(smollm2_path):
    """A reply cut by a stop string is not what its ids spell: its text is tokenized instead."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    options = RunOptions(model=str(smollm2_path), temperature=0.0, seed=1, max_tokens=24, stop=("e",))
    session = start_session(options, config=load_config(), overflow="drop", with_history=False)
    try:
        result = session.turn("Write one sentence about the sea.")
        assert "e" not in result.reply
        assert "token_ids" not in session.conversation.messages[-1]
        follow = session.turn("Again.")
        assert follow.stats.cached_tokens > 0
    finally:
        session.close()


def test_a_reasoning_models_reply_without_thinking_goes_back_as_its_sampled_ids(smollm2_path):
    """LFM2.5's template has a thinking block (a reasoning format) that SmolLM2 never writes: the
    reply is all answer, and its sampled ids go back as they are, as any model's reply does."""
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    template = Path(__file__).parent / "data" / "chat_cases" / "templates" / "LFM2.5-Instruct.jinja"
    options = RunOptions(
        model=str(smollm2_path), temperature=0.7, seed=11, max_tokens=40, ctx=4096, template=str(template)
    )
    session = start_session(options, config=load_config(), overflow="drop", with_history=False)
    try:
        first = session.turn("Tell me a long story about a dragon.")
        assert session.reasoning_format is not None and not first.reasoning and first.reply
        assert session.conversation.messages[-1]["token_ids"] == first.token_ids
        assert session.engine.detokenize(first.token_ids) == first.reply
        second = session.turn("Continue the story.").stats
        expected = first.stats.prompt_tokens + first.stats.generated_tokens
        assert expected - 3 <= second.cached_tokens <= expected, (second, first.stats)
    finally:
        session.close()


# --- no runaway replies --------------------------------------------------------------------------------
def test_loop_detector_counts_whole_periods():
    detector = LoopDetector(max_period=8, repeats=3, min_span=12)
    assert not any(detector.feed(token) for token in [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3])
    assert detector.feed(4)  # the span 1 2 3 4 has now appeared three times in a row
    assert detector.period == 4
    varied = LoopDetector(max_period=8, repeats=3, min_span=12)
    # Counting 1..40: neighbours repeat the "\n" token, never a whole span.
    assert not any(varied.feed(token) for n in range(1, 41) for token in (n, 0))
    short = LoopDetector(max_period=8, repeats=3, min_span=12)
    assert not any(short.feed(7) for _ in range(11))  # a run shorter than min_span is not a loop
    assert short.feed(7)  # the 12th copy reaches it


@pytest.mark.slow
def test_a_looping_reply_is_stopped_with_a_notice(cli, smollm2_path):
    """A greedy reply that copies the prompt's run of "cat" ends as a loop, once. (SmolLM2 loops
    on this prompt with flash attention on or off, at any thread count and batch size tried: a
    prompt that merely invites a long reply loops on one CPU kind and ends on another.)

    With --no-loop-stop, the same greedy reply capped at the tokens the loop stop let through
    runs to the cap: those tokens held no end of the reply, and nothing else may end it there.
    (Uncapped, the loop ends by itself on some CPUs: on an AMD Zen 4 after 255 tokens.) One fixed
    thread count, so that both runs compute the same tokens whatever else the machine runs."""
    prompt = "Repeat the word cat forever: " + " ".join(["cat"] * 16)
    greedy = ("ask", "--json", "-m", str(smollm2_path), "--temperature", "0", "--no-history", "--threads", "1")
    result = cli(*greedy, "--max-tokens", "1500", prompt)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["finish_reason"] == "loop", record["stats"]
    looped = record["stats"]["generated_tokens"]
    assert looped < 1500
    assert result.stderr.count("kept repeating itself") == 1
    off = cli(*greedy, "--max-tokens", str(looped), "--no-loop-stop", prompt)
    assert off.returncode == 0, off.stderr
    capped = json.loads(off.stdout)
    # At the cap's token the loop stop would have fired (it wins over the cap): "length" says it was off.
    assert (capped["finish_reason"], capped["stats"]["generated_tokens"]) == ("length", looped), capped["stats"]
    assert capped["reply"] == record["reply"]
    assert "kept repeating itself" not in off.stderr
