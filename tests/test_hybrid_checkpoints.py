"""Checkpoints of the recurrent state (llmchat.engine.checkpoints) on real hybrid models.

The models are tiny random-weight LFM2 and Qwen3.5 ones written at test time
(tests/hybrid_models.py) with SmolLM2's tokenizer and chat template: llama.cpp cannot drop a suffix
of their caches, so without checkpoints every prompt that leaves the cached one is prefilled from
the start. Replies are compared only
with other replies of the same engine (greedy), never with fixed text.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from hybrid_models import write_lfm2, write_qwen35
from prompt_toolkit.application import create_app_session
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

DATA = Path(__file__).parent / "data"
ENTER = "\r"
CTRL_D = "\x04"
LONG = " ".join(f"note{i} about the garden" for i in range(150))  # about 1,000 tokens


@pytest.fixture(scope="module", params=[write_lfm2, write_qwen35], ids=["lfm2", "qwen35"])
def writer(request):
    return request.param


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory, smollm2_path, writer):
    return writer(tmp_path_factory.mktemp("hybrid") / "tiny.gguf", smollm2_path)


def _load(path, home, **options):
    from llmchat.config import load_config
    from llmchat.options import RunOptions
    from llmchat.startup.loading import load_model

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLMCHAT_HOME", str(home))
        # Flash attention off: on this model llama.cpp's CPU arithmetic then does not depend on how
        # the tokens are batched (with it on, two batchings of one prompt differed by 0.25 in a logit),
        # and a restore and a fresh prefill batch them differently.
        settings = dict(ctx=4096, temperature=0.0, seed=1, max_tokens=8, batch_size=64, flash_attn="off") | options
        opts = RunOptions(model=str(path), **settings)
        return load_model(opts, config=load_config(), announce=False)


@pytest.fixture(scope="module")
def loaded(hybrid_path, tmp_path_factory):
    result = _load(hybrid_path, tmp_path_factory.mktemp("load-home"))
    yield result
    result.engine.close()


class Counted:
    """The tokens a LoadedModel's `method` hands to llama.cpp, counted on their way in: `prefill`,
    what each `generate` evaluates before its first sample; `eval`, every decode call."""

    def __init__(self, model, monkeypatch, method="prefill"):
        self.counts: list[int] = []
        real = getattr(model, method)

        def counted(tokens, *args):
            self.counts.append(len(tokens))
            real(tokens, *args)

        monkeypatch.setattr(model, method, counted)

    def take(self) -> int:
        total = sum(self.counts)
        self.counts.clear()
        return total


def _session(loaded):
    from llmchat.turn.session import ChatSession

    return ChatSession.start(loaded.engine, sampling=loaded.sampling, model_label=loaded.model.name, history=None)


def _drive(session, keys, monkeypatch):
    from llmchat.ui.chat import run_interactive

    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: no terminal modes to set
    with create_pipe_input() as pipe, create_app_session(input=pipe, output=DummyOutput()):
        pipe.send_text(ENTER.join(keys) + ENTER + CTRL_D)
        run_interactive(session, show_stats=False, markdown=False, verbose=False)
    return session.last_result


def test_the_model_is_hybrid_and_cannot_drop_a_suffix(loaded):
    """The premise: without checkpoints this model's cache could only be reused by extension."""
    from llmchat.engine.bindings import llama_cpp

    model = loaded.engine.model
    assert model.is_recurrent and model.checkpoints is not None
    model.clear()
    model.eval(model.tokenize(b"one two three four five six", add_bos=False, special=False))
    assert not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(model.ctx), 0, 2, -1)
    model.clear()


def test_a_restored_checkpoint_gives_the_logits_of_a_full_prefill(loaded):
    from llmchat.engine.bindings import llama_cpp

    model = loaded.engine.model

    def logits() -> list[float]:
        row = llama_cpp.llama_get_logits_ith(model.ctx, -1)
        return [row[i] for i in range(model.n_vocab)]

    first = model.tokenize(LONG.encode(), add_bos=False, special=False)
    later = first + model.tokenize(b" and then the roses by the old stone wall", add_bos=False, special=False)
    other = first + model.tokenize(b" but the tulips instead", add_bos=False, special=False)
    model.clear()
    model.prefill(first)
    model.prefill(later[len(model.tokens) :])  # a checkpoint where this prefill starts
    kept = model.rewind(model.reusable(other))
    assert kept == len(first)
    model.prefill(other[kept:])
    restored = logits()
    # The same batches without the detour through `later`: the restored state is the very state.
    model.clear()
    model.prefill(first)
    model.prefill(other[len(first) :])
    assert restored == logits()
    # And a fresh prefill of the whole prompt (other batches): the same logits where this was
    # written; on another CPU the batching may round differently, far below the logits' spread.
    model.clear()
    model.prefill(other)
    fresh = logits()
    assert max(abs(a - b) for a, b in zip(restored, fresh)) <= 1e-3 * (max(fresh) - min(fresh))


def test_turns_retry_and_undo_prefill_only_what_changed(loaded, monkeypatch):
    model = loaded.engine.model
    model.clear()
    prefills = Counted(model, monkeypatch)
    session = _session(loaded)

    first = _drive(session, [LONG], monkeypatch)
    assert prefills.take() == first.stats.prompt_tokens > 900 and first.stats.cached_tokens == 0
    previous = first.stats.prompt_tokens
    for message in ("And the second question?", "And a third one?"):
        turn = _drive(session, [message], monkeypatch).stats
        prefilled = prefills.take()
        # Everything before the new message came from the cache; the stats say what was evaluated.
        assert turn.cached_tokens >= previous and prefilled < 40
        assert turn.cached_tokens == turn.prompt_tokens - prefilled
        previous = turn.prompt_tokens

    third = session.last_result
    retried = _drive(session, ["/retry"], monkeypatch)
    prefilled = prefills.take()
    # The same prompt again: back to the checkpoint a few tokens before its end, not to the start.
    assert retried.stats.prompt_tokens == previous and 0 < prefilled <= 8
    assert retried.stats.cached_tokens == retried.stats.prompt_tokens - prefilled
    assert retried.reply == third.reply  # greedy: the same state gives the same reply

    undone = _drive(session, ["/undo", "Another third one?"], monkeypatch).stats
    prefilled = prefills.take()
    # Back to where the third message's prefill began (the end of the second reply).
    assert 0 < prefilled < 40 and undone.cached_tokens == undone.prompt_tokens - prefilled


def test_the_reply_after_a_restore_equals_a_fresh_run_on_the_same_prompt(loaded, monkeypatch):
    model = loaded.engine.model
    model.clear()
    prefills = Counted(model, monkeypatch)
    session = _session(loaded)
    _drive(session, [LONG, "Which flowers?", "Which colours?"], monkeypatch)
    after_restore = _drive(session, ["/undo", "/undo", "Which trees?"], monkeypatch)
    prefills.take()
    assert after_restore.stats.cached_tokens > 900  # the long first turn came back from a checkpoint

    model.clear()  # nothing cached: /retry prefills the whole prompt
    fresh = _drive(session, ["/retry"], monkeypatch)
    assert prefills.take() == fresh.stats.prompt_tokens == after_restore.stats.prompt_tokens
    assert fresh.stats.cached_tokens == 0
    assert fresh.reply == after_restore.reply


def test_without_checkpoints_the_stats_count_the_tokens_evaluated_again(hybrid_path, tmp_path, monkeypatch):
    loaded = _load(hybrid_path, tmp_path, ctx_checkpoints=0)
    try:
        model = loaded.engine.model
        assert model.checkpoints is None
        prefills = Counted(model, monkeypatch)
        session = _session(loaded)
        _drive(session, [LONG, "And the second question?"], monkeypatch)
        prefills.take()
        retried = _drive(session, ["/retry"], monkeypatch).stats
        # The cache cannot be cut back, so the whole prompt is read again, and the stats say so.
        assert prefills.take() == retried.prompt_tokens and retried.cached_tokens == 0
    finally:
        loaded.engine.close()


def test_a_rejected_draft_goes_back_to_the_state_before_its_batch(
    hybrid_path, writer, smollm2_path, tmp_path, monkeypatch
):
    """Drafts from another random model are mostly rejected: each rejection restores the state held
    before its batch, not the prompt's checkpoint, which would evaluate the whole reply again. (The
    replies are not compared: a drafted batch and single tokens round differently, and this random
    model's near-ties flip on that, differently on each CPU.)"""
    writer(tmp_path / "drafter.gguf", smollm2_path, seed=1)
    # Flash attention on, as `auto` picks it for drafting (docs/speed-and-memory.md, "Determinism").
    loaded = _load(hybrid_path, tmp_path, max_tokens=48, flash_attn="on", draft_model=tmp_path / "drafter.gguf")
    try:
        evals = Counted(loaded.engine.model, monkeypatch, "eval")
        result = _session(loaded).turn(LONG, record=False)
        stats = result.stats
        after_prompt = evals.take() - stats.prompt_tokens
    finally:
        loaded.engine.close()
    assert stats.generated_tokens > 0
    assert stats.draft_proposed > stats.draft_accepted  # drafts were rejected
    assert after_prompt <= 2 * (stats.generated_tokens + stats.draft_proposed)


def test_chat_on_a_hybrid_prefills_only_each_new_turn(cli, hybrid_path):
    lines = f"{LONG}\nAnd the second question?\nAnd a third one?\n"
    result = cli("chat", "--json", "-m", str(hybrid_path), "--max-tokens", "8", "--temperature", "0", input=lines)
    assert result.returncode == 0, result.stderr
    stats = [json.loads(line)["stats"] for line in result.stdout.splitlines()]
    assert len(stats) == 3 and stats[0]["cached_tokens"] == 0
    for before, turn in zip(stats, stats[1:]):
        assert turn["cached_tokens"] >= before["prompt_tokens"]
        assert turn["prompt_tokens"] - turn["cached_tokens"] < 40


def test_a_negative_checkpoint_count_is_one_line_and_a_usage_error(cli, hybrid_path):
    result = cli("ask", "-m", str(hybrid_path), "--ctx-checkpoints", "-1", "hi")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "'--ctx-checkpoints': -1 is not in the range" in result.stderr


def test_a_template_that_drops_the_last_replys_thinking_still_reuses_the_cache(cli, hybrid_path):
    """Qwen3.5's own template opens a thinking block in the generation prompt and drops a reply's
    thinking from the next turn's prompt, so each new prompt leaves the cached one inside the last
    reply: a checkpoint near the end of the previous prompt serves it, not a prefill from the start."""
    template = DATA / "chat_cases" / "templates" / "Qwen3.5-4B.jinja"
    lines = f"{LONG}\nAnd the second question?\nAnd a third one?\n"
    args = ("chat", "--json", "-m", str(hybrid_path), "--template", str(template), "--think")
    result = cli(*args, "--max-tokens", "8", "--temperature", "0", input=lines)
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    stats = [record["stats"] for record in records]
    assert len(stats) == 3 and stats[0]["cached_tokens"] == 0 and stats[0]["prompt_tokens"] > 900
    for turn in stats[1:]:
        # The whole earlier conversation came from the cache, up to a few tokens of the last reply.
        assert turn["prompt_tokens"] - turn["cached_tokens"] < 60, turn
    # The same conversation with no checkpoints reads it all again after the first turn.
    bare = cli(*args, "--ctx-checkpoints", "0", "--max-tokens", "8", "--temperature", "0", input=lines)
    assert bare.returncode == 0, bare.stderr
    bare_stats = [json.loads(line)["stats"] for line in bare.stdout.splitlines()]
    assert [turn["cached_tokens"] for turn in bare_stats[1:]] == [0, 0]


def test_a_tool_round_on_a_hybrid_reuses_the_first_rounds_prompt(cli, hybrid_path, tmp_path):
    """A forced call, its result, then the answer: the second round's prompt extends the first
    round's (the call and its result appended), and the recurrent state is not read again. The
    tool takes no argument, so the call grammar leaves this random model nothing to ramble in."""
    tools = tmp_path / "clock.py"
    tools.write_text('def clock() -> str:\n    """The time now."""\n    return "It is noon."\n', encoding="utf-8")
    run = cli(
        "ask",
        "-m",
        str(hybrid_path),
        *("--temperature", "0", "--seed", "1", "--no-history", "--max-tokens", "96", "--chain-limit", "1"),
        *("--functions", str(tools), "--tool-choice", "clock", "--approve-tools", "--json"),
        f"{LONG}\nWhat time is it?",
    )
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stdout)
    assert [call["result"] for call in record["tool_calls"]] == ["It is noon."]
    first, second = record["stats"]["rounds"]
    assert first["cached_tokens"] == 0 and first["prompt_tokens"] > 900
    # Back at most to the checkpoint a few tokens before the first round's end, never to the start.
    assert second["cached_tokens"] >= first["prompt_tokens"] - 8
    assert second["prompt_tokens"] - second["cached_tokens"] < 120
