"""Speculative decoding on the real SmolLM2: drafting must never change a greedy reply.

`--lookup` (prompt-lookup n-grams) and `--draft-model` (a second model drafting greedily; here the
same SmolLM2 file, so the vocabulary matches and nearly every draft should be accepted) only
propose tokens; the main model verifies them. At temperature 0 with a fixed seed the reply must be
byte-identical to plain decoding, and `--json` must report how many drafts were accepted.
No wall-clock assertions: speed is measured by bench/speculative_bench.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# Flash attention on for both sides: drafting turns it on (engine.calibrate), and a plain run must
# use the same attention kernel to be the reference.
GREEDY = ("--temperature", "0", "--seed", "1", "--max-tokens", "64", "--no-history", "--json", "--flash-attn", "on")
SUBPROCESS_TIMEOUT_S = 300  # a guard against a hung child, not an assertion

PROMPTS = {
    # Copy-heavy: the reply repeats the prompt, so prompt lookup finds long matches.
    "copy": (
        "Repeat this paragraph exactly, changing only the word cat to dog: The cat sat on the warm mat "
        "by the kitchen door and watched the rain fall on the garden all afternoon, while the old clock "
        "in the hall ticked slowly and the kettle began to sing."
    ),
    # Free-form: few matches, so most drafts are rejected and the rollback path is exercised.
    "free": "Write three sentences about the history of the bicycle.",
}


@pytest.fixture(scope="module")
def ask(tmp_path_factory, smollm2_path):
    home = tmp_path_factory.mktemp("spec-home")
    cache: dict[tuple, dict] = {}

    def run(prompt_key: str, *extra: str) -> dict:
        key = (prompt_key, *extra)
        if key not in cache:
            env = dict(os.environ, LLMCHAT_HOME=str(home))
            env.pop("LLMCHAT_MODEL", None)
            proc = subprocess.run(
                [sys.executable, "-m", "llmchat", "ask", "-m", str(smollm2_path), *GREEDY, *extra, PROMPTS[prompt_key]],
                capture_output=True,
                text=True,
                env=env,
                stdin=subprocess.DEVNULL,
                timeout=SUBPROCESS_TIMEOUT_S,
            )
            assert proc.returncode == 0, proc.stderr
            lines = proc.stdout.strip().splitlines()
            assert len(lines) == 1, proc.stdout
            cache[key] = json.loads(lines[0])
        return cache[key]

    return run


# Every test here runs with llmchat's default engine flags. Flash attention is on by default,
# which makes a multi-token decode (how drafts are verified) compute bit-for-bit the same logits
# as one-token decodes. Without it, llama.cpp's CPU attention rounds differently for batches
# (logits differ by up to ~0.9 on SmolLM2), and a near-tie can flip a greedy choice: see
# test_flash_attention_makes_batched_decode_match_single_decode and bench/results/engine.md.


@pytest.mark.parametrize("prompt_key", sorted(PROMPTS))
def test_lookup_gives_the_same_greedy_reply(ask, prompt_key):
    plain = ask(prompt_key)
    drafted = ask(prompt_key, "--lookup")
    assert plain["reply"], "plain decoding produced no reply"
    assert drafted["reply"] == plain["reply"]
    assert drafted["finish_reason"] == plain["finish_reason"]
    assert drafted["stats"]["generated_tokens"] == plain["stats"]["generated_tokens"]
    # Plain decoding reports no drafting at all.
    assert "draft_acceptance" not in plain["stats"]


def test_lookup_reports_acceptance_on_a_copy_task(ask):
    stats = ask("copy", "--lookup")["stats"]
    assert stats["draft_proposed"] > 0
    assert 0 <= stats["draft_accepted"] <= stats["draft_proposed"]
    assert stats["draft_acceptance"] == pytest.approx(stats["draft_accepted"] / stats["draft_proposed"], abs=1e-3)
    assert stats["draft_accepted"] > 0, "a reply that copies the prompt should accept some lookup drafts"


@pytest.mark.parametrize("prompt_key", sorted(PROMPTS))
def test_draft_model_gives_the_same_greedy_reply(ask, smollm2_path, prompt_key):
    plain = ask(prompt_key)
    drafted = ask(prompt_key, "--draft-model", str(smollm2_path))
    assert drafted["reply"] == plain["reply"]
    assert drafted["finish_reason"] == plain["finish_reason"]
    assert drafted["stats"]["generated_tokens"] == plain["stats"]["generated_tokens"]


@pytest.mark.parametrize("penalty", ["1", "1.1"])
def test_self_draft_is_almost_always_accepted(ask, smollm2_path, penalty):
    # The drafter is the same model decoding greedily with the same repeat penalty over the same
    # history, so only drafts that run into the end of the reply can be rejected.
    stats = ask("free", "--repeat-penalty", penalty, "--draft-model", str(smollm2_path))["stats"]
    assert stats["draft_proposed"] > 0
    assert 0 <= stats["draft_accepted"] <= stats["draft_proposed"]
    assert stats["draft_acceptance"] >= 0.9, stats


def test_lookup_on_a_prompt_longer_than_one_batch(ask):
    # The prompt is evaluated in several --batch-size chunks while only the last positions get
    # logits (llmchat's drafting model class); the reply must still be the plain greedy one.
    small_batch = ("--batch-size", "16")
    plain = ask("copy", *small_batch)
    drafted = ask("copy", *small_batch, "--lookup")
    assert drafted["reply"] == plain["reply"]
    assert drafted["stats"]["prompt_tokens"] > 16


def test_drafts_never_outgrow_one_batch(ask):
    """A verification batch (the last token and its drafts) is one decode: with --batch-size 4 the
    drafts are capped at 3 (lookup would draft up to 16 on this copy task), and the reply is still
    the plain greedy one."""
    small_batch = ("--batch-size", "4")
    drafted = ask("copy", *small_batch, "--lookup")
    assert drafted["reply"] == ask("copy", *small_batch)["reply"]
    assert drafted["stats"]["draft_accepted"] > 0


def test_drafting_needs_a_batch_of_two(smollm2_path, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "llmchat", "ask", "-m", str(smollm2_path), "--lookup", "--batch-size", "1", "hi"],
        capture_output=True,
        text=True,
        env=dict(os.environ, LLMCHAT_HOME=str(tmp_path)),
        stdin=subprocess.DEVNULL,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.startswith("llmchat: error: ") and "--batch-size 2" in result.stderr


def test_drafting_keeps_no_per_token_logits(smollm2_path):
    """Verification samples at the last sampled token and each drafted one, so llama.cpp is asked
    for logits at those positions only: not one row of n_vocab floats per evaluated token (with
    llama-cpp-python's `Llama` and a drafter, peak RSS was 1105 MiB instead of 264 on a 3,461-token
    prompt). llama.cpp answers NULL for a row it did not compute."""
    from llmchat.engine import Engine, EngineSettings
    from llmchat.engine.bindings import llama_cpp

    engine = Engine.load(smollm2_path, EngineSettings(n_ctx=2048, lookup=True, draft_tokens=8, batch_size=64))
    try:
        model = engine.model
        assert model.output_window == 9 and engine.settings.flash_attn
        model.eval(engine.tokenize("word " * 100, special=False))  # two chunks of up to 64
        assert llama_cpp.llama_get_logits_ith(model.ctx, -9)
        assert not llama_cpp.llama_get_logits_ith(model.ctx, -10)
    finally:
        engine.close()


def test_no_flash_attn_with_lookup_still_answers(ask):
    # Allowed (the user asked for it); greedy identity is then not promised, only a reply.
    drafted = ask("copy", "--no-flash-attn", "--lookup")
    assert drafted["reply"] and drafted["stats"]["draft_proposed"] > 0


def test_flash_attention_makes_batched_decode_match_single_decode(smollm2_path):
    """The mechanism the tests above rely on, checked directly on llama.cpp: the logits of a
    continuation decoded one token at a time equal those of the same tokens decoded in batches of 9
    (prompt lookup's 8 drafts + 1) when flash attention is on."""
    import numpy as np

    from llmchat.engine import logs
    from llmchat.engine.bindings import llama_cpp
    from llmchat.engine.devices import cpu_has_amx
    from llmchat.engine.native import LoadedModel

    logs.install(False)
    model = LoadedModel(
        smollm2_path,
        n_ctx=512,
        max_ctx=512,
        n_batch=512,
        threads=2,
        gpu_layers=0,
        mmap=True,
        mlock=False,
        flash_attn=True,
        extra_buffer_types=not cpu_has_amx(),  # as the engine loads (no AMX buffers)
        output_window=9,
    )
    try:
        prompt = model.tokenize(PROMPTS["copy"].encode(), add_bos=False, special=False)
        continuation = model.tokenize(
            b" The old clock in the hall ticked slowly and the kettle began to sing.", add_bos=False, special=False
        )

        def row(index: int) -> np.ndarray:
            pointer = llama_cpp.llama_get_logits_ith(model.ctx, index)
            return np.ctypeslib.as_array(pointer, shape=(model.n_vocab,)).copy()

        def logits(chunk: int) -> np.ndarray:
            model.clear()
            model.eval(prompt)
            rows = [row(-1)]
            for i in range(0, len(continuation), chunk):
                part = continuation[i : i + chunk]
                model.eval(part)
                rows.extend(row(j - len(part)) for j in range(len(part)))
            return np.array(rows[: len(continuation)])

        assert np.array_equal(logits(1), logits(9))
    finally:
        model.close()


def test_lookup_and_draft_model_together_is_a_usage_error(smollm2_path, tmp_path):
    env = dict(os.environ, LLMCHAT_HOME=str(tmp_path))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmchat",
            "ask",
            "-m",
            str(smollm2_path),
            "--lookup",
            "--draft-model",
            str(smollm2_path),
            "--no-history",
            "hi",
        ],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("llmchat: error:")]
    assert len(errors) == 1 and "--lookup" in errors[0] and "--draft-model" in errors[0]


def test_prompt_lookup_drafts_what_followed_the_last_three_tokens():
    from llmchat.engine.drafting import PromptLookupDrafter

    drafter = PromptLookupDrafter(max_tokens=16)
    context = [5, 1, 2, 3, 9, 8, 7, 6, 4, 4, 1, 2, 3]  # ends with 1 2 3, seen at the start
    assert drafter(context) == [9, 8, 7, 6]  # the first draft is 4 tokens
    # Only a 2-token match: nothing is proposed (on free text such guesses were mostly wrong).
    assert drafter([5, 1, 2, 9, 1, 2]) == []


def test_prompt_lookup_matches_whole_tokens_only():
    """The search runs over the ids' bytes: a match that straddles token boundaries is no match."""
    from llmchat.engine.drafting import PromptLookupDrafter

    # As 4-byte little-endian ints, 1 << 24, 2 << 24, 3 << 24, 0 holds the bytes of 1, 2, 3 at offset 3.
    straddling = [1 << 24, 2 << 24, 3 << 24, 0]
    assert PromptLookupDrafter(max_tokens=16)([7, *straddling, 1, 2, 3]) == []
    # The more recent straddling "match" is skipped for the real one before it.
    assert PromptLookupDrafter(max_tokens=16)([1, 2, 3, 9, *straddling, 1, 2, 3]) == [9, *straddling[:3]]


def test_draft_length_doubles_after_full_acceptance_and_shrinks_after_a_miss():
    from llmchat.engine.drafting import DraftLength

    length = DraftLength(max_tokens=16)
    assert length.current == 4
    length.proposed(10, [1, 2, 3, 4])
    length.update([0] * 10 + [1, 2, 3, 4, 5])  # all four kept, plus the model's next token
    assert length.current == 8
    length.proposed(15, [6] * 8)
    length.update([0] * 15 + [6, 6, 7])  # two kept, then the model chose 7
    assert length.current == 2
    length.proposed(18, [1, 1])
    length.update([0] * 18 + [2])  # none kept
    assert length.current == 1
    for _ in range(6):
        length.proposed(0, [0] * length.current)
        length.update([0] * 40)
    assert length.current == 16  # capped


def test_prompt_lookup_index_drafts_as_a_fresh_search_at_every_step():
    """The drafter indexes the context as it grows; at every step of a reply its draft is the one
    a drafter that had never seen the earlier steps finds over the whole context."""
    import random

    from llmchat.engine.drafting import PromptLookupDrafter

    rng = random.Random(7)
    phrase = [rng.randrange(50) for _ in range(12)]
    context = [rng.randrange(50) for _ in range(30)] + phrase + [rng.randrange(50) for _ in range(20)]
    growing = PromptLookupDrafter(max_tokens=16)
    growing.start_reply(len(context), 1.0)
    drafts = 0
    for token in phrase * 3 + [rng.randrange(50) for _ in range(40)]:
        context.append(token)
        got = growing(context)
        fresh = PromptLookupDrafter(max_tokens=16)
        fresh.length.current = growing.length.current  # the length it drafted at; only the search differs
        assert got == fresh(context)
        drafts += bool(got)
    assert drafts > 10  # the repeated phrase was found again and again


def test_prompt_lookup_forgets_a_context_the_next_reply_does_not_continue():
    from llmchat.engine.drafting import PromptLookupDrafter

    drafter = PromptLookupDrafter(max_tokens=16)
    drafter.start_reply(8, 1.0)
    assert drafter([1, 2, 3, 4, 5, 6, 1, 2, 3]) == [4, 5, 6, 1]
    # Another conversation: 1 2 3 4 is not in it, so nothing is drafted from the old one.
    drafter.start_reply(6, 1.0)
    assert drafter([9, 9, 8, 7, 1, 2, 3]) == []
    # The next turn of the same conversation keeps its index and extends it.
    drafter.start_reply(10, 1.0)
    assert drafter([9, 9, 8, 7, 1, 2, 3, 5, 9, 8, 7]) == [1, 2, 3, 5]
    # Mid-reply, a context that is not the indexed one continued is indexed again from scratch:
    # 1 2 3 is followed by 6 here, by 5 in the old context.
    assert drafter([5, 1, 2, 3, 6, 6, 6, 6, 6, 6, 4, 1, 2, 3])[:1] == [6]
