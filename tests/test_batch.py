"""`llmchat batch` on the real SmolLM2: records in input order, error records, resume, parallel
decoding, exit codes, stdin and plain-text input, and the same greedy reply as `llmchat ask`.

Kept small for a 2-core CI machine: few items, 16-24 generated tokens. No wall-clock assertions.
"""

from __future__ import annotations

import json

import pytest

from llmchat.batch.items import id_key, parse_input
from llmchat.batch.sink import InOrder, read_done_ids

GREEDY = ("--temperature", "0", "--seed", "1")
SYSTEM = "You are a concise assistant. Answer in one short sentence, without lists or preamble."


def records(text: str) -> list[dict]:
    lines = text.splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def check_stats(record: dict) -> None:
    stats = record["stats"]
    assert record["error"] is None
    assert isinstance(record["reply"], str)
    assert record["finish_reason"] in ("stop", "length")
    assert stats["generated_tokens"] > 0
    assert stats["ttft_s"] > 0
    assert stats["prompt_tokens"] > 0
    assert 0 <= stats["cached_tokens"] < stats["prompt_tokens"]
    assert stats["prompt_tokens"] == stats["cached_tokens"] + stats["prefill_tokens"]
    assert stats["context_used"] == stats["prompt_tokens"] + stats["generated_tokens"]
    assert stats["finish_reason"] == record["finish_reason"]
    if stats["generated_tokens"] > 1:
        assert stats["decode_tok_s"] > 0


def jsonl(*objects) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects)


# --- input parsing, ordering and resume bookkeeping (no model) ----------------------------------
def test_parse_input_detects_json_text_and_errors():
    data = (
        jsonl(
            {"id": "a", "prompt": "hi", "temperature": 0.2, "max_tokens": 8, "stop": "."},
            "plain prompt line",
            "",
            {"prompt": "no id"},
            '{"id": "broken", ',
            {"id": "x", "prompt": "p", "temperature": -1},
            {"id": "y", "prompt": "p", "top_k": 1.5},
            {"id": "z"},
            {"id": "a", "prompt": "duplicate id"},
            {
                "messages": [
                    {"role": "system", "content": "S"},
                    {"role": "user", "content": "u1"},
                    {"role": "assistant", "content": "a1"},
                    {"role": "user", "content": "u2"},
                ]
            },
            {"messages": [{"role": "assistant", "content": "no user last"}]},
        ).encode()
        + b"\xff\xfe not utf-8\n"
    )
    items = parse_input(data)
    by_line = {item.line: item for item in items}
    assert [item.index for item in items] == list(range(len(items)))
    a = by_line[1]
    assert (a.id, a.user, a.error, a.stop) == ("a", "hi", None, (".",))
    assert a.overrides == {"temperature": 0.2, "max_tokens": 8}
    assert (by_line[2].id, by_line[2].user) == (2, "plain prompt line")
    assert 3 not in by_line  # blank lines are not items, but still count as lines
    assert (by_line[4].id, by_line[4].user) == (4, "no id")
    assert by_line[5].id == 5 and "bad JSON" in by_line[5].error
    assert "temperature" in by_line[6].error
    assert "whole number" in by_line[7].error
    assert "prompt" in by_line[8].error
    assert "duplicate id" in by_line[9].error and by_line[9].id == 9
    chat = by_line[10]
    assert chat.error is None and chat.system == "S" and chat.user == "u2" and len(chat.history) == 2
    assert "last message" in by_line[11].error
    assert "UTF-8" in by_line[12].error


def test_in_order_buffers_until_the_gap_is_filled():
    emitted = []
    writer = InOrder([0, 2, 3, 5], emitted.append)
    writer.put(3, {"i": 3})
    writer.put(2, {"i": 2})
    assert emitted == [] and writer.buffered == 2
    writer.put(0, {"i": 0})
    assert [r["i"] for r in emitted] == [0, 2, 3]
    writer.put(5, {"i": 5})
    assert [r["i"] for r in emitted] == [0, 2, 3, 5] and writer.buffered == 0


def test_read_done_ids_truncates_a_partial_last_line(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": 1, "reply": "x"}\n{"id": "b", "reply": "y"}\n{"id": 3, "rep')
    done, cut = read_done_ids(out)
    assert done == {id_key(1), id_key("b")}
    assert cut == len(b'{"id": 3, "rep')
    assert out.read_bytes().endswith(b'"y"}\n')
    assert read_done_ids(tmp_path / "missing.jsonl") == (set(), 0)


# --- exit codes for usage errors (no model is loaded) -------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (("--parallel", "0"), "--parallel"),
        (("--resume",), "--resume needs -o"),
        (("--progress", "sometimes"), "--progress"),
    ],
)
def test_usage_errors_exit_2(cli, tmp_path, args, message):
    items = tmp_path / "items.txt"
    items.write_text("hello\n")
    result = cli("batch", str(items), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""


def test_missing_input_exits_2(cli, tmp_path):
    result = cli("batch", str(tmp_path / "nope.jsonl"))
    assert result.returncode == 2 and "not a file" in result.stderr


# --- the real model ---------------------------------------------------------------------------------
def test_mixed_good_and_bad_lines(cli, tmp_path, isolated_home):
    long_prompt = "Tell me about this: " + "alpha beta gamma delta " * 150  # > 512 tokens
    items = tmp_path / "items.jsonl"
    items.write_text(
        jsonl(
            {"id": "good-1", "prompt": "What is the capital of France?"},
            "{not json",
            {"id": "no-prompt", "system": "x"},
            {"id": "bad-temp", "prompt": "hi", "temperature": "hot"},
            {"id": "too-long", "prompt": long_prompt},
            "Name a colour.",
            {"id": "good-2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8},
        )
    )
    out = tmp_path / "out.jsonl"
    result = cli("batch", str(items), "-o", str(out), "--ctx", "512", "--max-tokens", "16", *GREEDY)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    got = records(out.read_text())
    assert [r["id"] for r in got] == ["good-1", 2, "no-prompt", "bad-temp", "too-long", 6, "good-2"]
    errors = {r["id"]: r["error"] for r in got if r["error"]}
    assert set(errors) == {2, "no-prompt", "bad-temp", "too-long"}
    assert all("\n" not in e for e in errors.values())
    assert "context" in errors["too-long"]
    for r in got:
        if r["error"]:
            assert r["reply"] is None and r["finish_reason"] == "error" and r["stats"] is None
        else:
            check_stats(r)
    assert got[-1]["stats"]["generated_tokens"] <= 8  # the item's own max_tokens
    assert "3 ok, 4 failed" in result.stderr
    assert "4 of 7 items failed" in result.stderr
    # A batch is not a conversation: nothing goes to the history store.
    assert not (isolated_home / "history.db").exists()


def test_all_ok_exit_0_stdin_and_plain_text(cli):
    text = "What is 2 + 2?\n\nName a fruit.\n"
    result = cli("batch", "-", "--max-tokens", "12", *GREEDY, input=text)
    assert result.returncode == 0, result.stderr
    got = records(result.stdout)
    assert [r["id"] for r in got] == [1, 3]  # line numbers; the blank line is skipped
    for r in got:
        check_stats(r)
    assert "batch: done: 2/2 items (2 ok, 0 failed)" in result.stderr


def test_shared_system_prompt_reuses_the_kv_cache_serial(cli, tmp_path):
    items = tmp_path / "items.jsonl"
    items.write_text(
        jsonl(*({"id": i, "system": SYSTEM, "prompt": p} for i, p in enumerate(["Name a planet.", "Name a river."])))
    )
    result = cli("batch", str(items), "--max-tokens", "8", *GREEDY)
    assert result.returncode == 0, result.stderr
    first, second = records(result.stdout)
    check_stats(first)
    check_stats(second)
    assert first["stats"]["cached_tokens"] == 0
    assert second["stats"]["cached_tokens"] >= 20  # the system prompt was not prefilled again


def test_parallel_keeps_input_order_and_shares_the_prefix(cli, tmp_path):
    prompts = [
        "Name a planet.",
        "Write one word about the sea.",
        "What is 3 + 4?",
        "Name a month.",
        "Say hello in French.",
        "Name a tree.",
    ]
    items = tmp_path / "items.jsonl"
    items.write_text(
        jsonl(*({"id": f"q{i}", "system": SYSTEM, "prompt": p, "max_tokens": 8 + 3 * i} for i, p in enumerate(prompts)))
    )
    result = cli("batch", str(items), "--parallel", "4", *GREEDY)
    assert result.returncode == 0, result.stderr
    got = records(result.stdout)
    assert [r["id"] for r in got] == [f"q{i}" for i in range(len(prompts))]
    for i, r in enumerate(got):
        check_stats(r)
        assert r["stats"]["generated_tokens"] <= 8 + 3 * i
    # The system prompt is evaluated once and copied to the other sequences.
    assert sum(r["stats"]["cached_tokens"] >= 20 for r in got) >= len(prompts) - 1
    assert "(parallel 4)" in result.stderr


def test_resume_after_an_interrupted_run(cli, tmp_path):
    prompts = ["Name a colour.", "Name an animal.", "Name a city.", "Name a sport."]
    items = tmp_path / "items.txt"
    items.write_text("".join(p + "\n" for p in prompts))
    out = tmp_path / "out.jsonl"
    # What a crash leaves: two complete records and half of the third.
    done = [
        {"id": 1, "reply": "Blue.", "finish_reason": "stop", "seed": 1, "stats": {}, "error": None},
        {"id": 2, "reply": "Cat.", "finish_reason": "stop", "seed": 1, "stats": {}, "error": None},
    ]
    out.write_text(jsonl(*done) + '{"id": 3, "reply": "Par')
    result = cli("batch", str(items), "-o", str(out), "--resume", "--max-tokens", "8", *GREEDY)
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert text.endswith("\n")
    got = records(text)  # every line parses: the partial line is gone
    assert [r["id"] for r in got] == [1, 2, 3, 4]
    assert got[:2] == done  # untouched
    for r in got[2:]:
        check_stats(r)
    assert "partial last line" in result.stderr and "2 already in the output" in result.stderr
    # Resuming a finished run does nothing and succeeds.
    again = cli("batch", str(items), "-o", str(out), "--resume", "--max-tokens", "8", *GREEDY)
    assert again.returncode == 0 and out.read_text() == text and "nothing to do" in again.stderr


def test_greedy_batch_reply_matches_ask(cli, tmp_path):
    prompt = "Explain in one sentence why the sky is blue."
    asked = cli("ask", "--no-history", "--json", "--max-tokens", "24", *GREEDY, prompt)
    assert asked.returncode == 0, asked.stderr
    reply = json.loads(asked.stdout)["reply"]
    items = tmp_path / "items.jsonl"
    items.write_text(
        jsonl(
            {"id": "sky", "prompt": prompt},
            {"id": "other", "prompt": "Name a planet."},
            {"id": "sky-again", "prompt": prompt},
        )
    )
    result = cli("batch", str(items), "--max-tokens", "24", *GREEDY)
    assert result.returncode == 0, result.stderr
    got = {r["id"]: r for r in records(result.stdout)}
    assert got["sky"]["reply"] == reply
    # Later items reuse the KV cache (a shared template prefix), and the answer does not change.
    assert got["sky-again"]["reply"] == reply
    assert got["sky-again"]["stats"]["cached_tokens"] > 0


def test_parallel_decoder_with_one_sequence_matches_serial_generation(smollm2_path):
    """The parallel decoder's sampler chain, stop rules and prefix reuse are those of Engine.generate:
    with one sequence the tokens are identical (several sequences: the next test)."""
    from llmchat.batch.runner import BatchRunner
    from llmchat.config import load_config
    from llmchat.engine.interface import GenerateRequest, QueuedRequest
    from llmchat.engine.parallel import ParallelDecoder, context_per_sequence
    from llmchat.options import RunOptions
    from llmchat.startup.loading import start_session

    options = RunOptions(model=str(smollm2_path), temperature=0.0, seed=1, max_tokens=16, system=SYSTEM)
    session = start_session(options, config=load_config(), overflow="error", with_history=False)
    try:
        engine = session.engine
        runner = BatchRunner(session, parallel=1, progress_mode="off", sink=None)  # type: ignore[arg-type]
        items = parse_input(b"Name a planet.\nWhat is 3 + 4?\nName a month.\n")
        prepared = [runner.prepare(item) for item in items]
        stops = tuple(session.template.stop_strings)
        serial = []
        for p in prepared:
            generation = engine.generate(GenerateRequest(p.prompt, p.sampling, max_tokens=16, stop_strings=stops))
            text = "".join(event.text for event in generation)
            serial.append((generation.outcome.generated_ids, text))
        results = {}
        per_seq = context_per_sequence(max(len(p.prompt) for p in prepared) + 16, engine.n_ctx)
        decoder = ParallelDecoder(engine, 1, per_seq)
        decoder.run(
            (QueuedRequest(i, GenerateRequest(p.prompt, p.sampling, 16, stops)) for i, p in enumerate(prepared)),
            lambda r: results.__setitem__(r.key, r),
        )
        assert [(results[i].outcome.generated_ids, results[i].text) for i in range(len(prepared))] == serial
        assert decoder.prompt_reused > 0  # the system prompt was kept in the KV cache between items
    finally:
        session.engine.close()


def test_parallel_greedy_replies_match_serial_ones(cli, tmp_path):
    """Twelve items through 4 slots, so slots are recycled and share the template prefix: every
    greedy reply must be the one --parallel 1 gives. (In one shared KV buffer, recycled sequences
    landed out of order in the cache and about half the replies drifted at a near-tie; one KV
    stream per sequence keeps llama.cpp's attention arithmetic that of a lone sequence.)"""
    topics = [
        "the moon",
        "bread",
        "rivers",
        "chess",
        "volcanoes",
        "owls",
        "glass",
        "trains",
        "coffee",
        "maps",
        "bees",
        "salt",
    ]
    items = tmp_path / "items.jsonl"
    items.write_text(jsonl(*({"id": t, "prompt": f"Write two sentences about {t}."} for t in topics)))
    replies = {}
    for parallel in ("1", "4"):
        # Flash attention on for both: --parallel turns it on (engine.calibrate), and the serial
        # reference must use the same attention kernel.
        result = cli("batch", str(items), "--parallel", parallel, "--max-tokens", "40", "--flash-attn", "on", *GREEDY)
        assert result.returncode == 0, result.stderr
        replies[parallel] = {r["id"]: r["reply"] for r in records(result.stdout)}
    assert len(replies["1"]) == len(topics) and all(replies["1"].values())
    differing = [t for t in topics if replies["4"][t] != replies["1"][t]]
    assert differing == []
