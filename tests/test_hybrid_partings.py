"""A hybrid model's later turns evaluate what a transformer's do, with the family templates' own
rewrites of the last turn (llmchat.turn.parting; llmchat.engine.checkpoints).

A transformer's KV cache keeps any prefix, so a turn evaluates what follows the point where its
prompt leaves the cached one. A hybrid's cache cannot be cut back: it starts from the nearest
checkpoint of its recurrent state at or before that point. Each test drives a chat on a tiny
random-weight Qwen3.5 (tests/hybrid_models.py) with a family template, and compares every turn's
prefill with what a transformer would evaluate on the same cache and prompt, token for token.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_hybrid_checkpoints import LONG, _drive, _load

TEMPLATES = Path(__file__).parent / "data" / "chat_cases" / "templates"
# The hybrid families' own templates: Qwen3.5, LFM2 and LFM2.5, Granite 4.0-H, Nemotron-H.
FAMILY = [
    "Qwen3.5-4B.jinja",
    "LFM2-8B-A1B.jinja",
    "LFM2.5-8B-A1B.jinja",
    "LFM2.5-Instruct.jinja",
    "ibm-granite-granite-4.0.jinja",
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja",
    "NVIDIA-Nemotron-Nano-v2.jinja",
]
# What a hybrid may evaluate beyond a transformer: llama-server's last checkpoint is 4 tokens
# before a prompt's end, so a /retry (which leaves the cache 1 token before it) evaluates 4, not 1.
FEW = 4


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory, smollm2_path):
    from hybrid_models import write_qwen35

    return write_qwen35(tmp_path_factory.mktemp("hybrid") / "qwen35.gguf", smollm2_path)


@pytest.fixture(scope="module")
def loaded(qwen35_path, tmp_path_factory):
    result = _load(qwen35_path, tmp_path_factory.mktemp("load-home"))
    yield result
    result.engine.close()


class Evaluated:
    """Per `generate` of a LoadedModel: the tokens it prefilled, and the tokens a transformer
    would evaluate for the same prompt on the same cache (what follows the longest common prefix,
    and at least the last token, which brings the logits)."""

    def __init__(self, model, monkeypatch):
        from llmchat.engine.driver import common_prefix

        self.rows: list[list[int]] = []
        generate, prefill = model.generate, model.prefill

        def counted_generate(prompt, *args, **kwargs):
            common = common_prefix(model.tokens, prompt)
            self.rows.append([0, len(prompt) - min(common, len(prompt) - 1)])
            return generate(prompt, *args, **kwargs)

        def counted_prefill(tokens, *args, **kwargs):
            self.rows[-1][0] += len(tokens)
            return prefill(tokens, *args, **kwargs)

        monkeypatch.setattr(model, "generate", counted_generate)
        monkeypatch.setattr(model, "prefill", counted_prefill)

    def over_a_transformer(self) -> list[int]:
        """For each turn after the first: the tokens evaluated beyond a transformer's."""
        return [hybrid - transformer for hybrid, transformer in self.rows[1:]]


def _session(loaded, template: str, think: bool):
    from llmchat.reasoning.formats import ReasoningSettings
    from llmchat.turn.session import ChatSession

    return ChatSession.start(
        loaded.engine,
        sampling=loaded.sampling,
        model_label=loaded.model.name,
        template_choice=str(TEMPLATES / template),
        reasoning=ReasoningSettings(think=think),
    )


@pytest.mark.parametrize("think", [False, True], ids=["no-think", "think"])
@pytest.mark.parametrize("template", FAMILY)
def test_later_turns_retry_undo_and_edit_evaluate_what_a_transformer_does(loaded, template, think, monkeypatch):
    model = loaded.engine.model
    model.clear()
    evaluated = Evaluated(model, monkeypatch)
    session = _session(loaded, template, think)
    turns = [LONG, "And the second question?", "And a third one?", "And a fourth?"]
    edits = ["/retry", "/undo", "Another fourth?", "/edit", " Or a fifth?"]
    last = _drive(session, [*turns, *edits], monkeypatch)
    assert last.user == "Another fourth? Or a fifth?"
    # Turns 2 to 4, the retried turn 4, the new turn 4, the edited one.
    assert len(evaluated.rows) == 7 and evaluated.rows[0][0] > 900
    over = evaluated.over_a_transformer()
    assert all(extra <= FEW for extra in over), (over, evaluated.rows)


@pytest.mark.parametrize("think", [False, True], ids=["no-think", "think"])
def test_tool_rounds_and_the_turn_after_them_evaluate_what_a_transformer_does(loaded, think, tmp_path, monkeypatch):
    """Each turn calls a tool (forced: its name), then answers. The second round extends the first
    round's prompt; the next turn leaves it where the template rewrites the first round's
    generation prompt. (The tool takes no argument, so the call grammar leaves this random model
    nothing to ramble in; with thinking on, a budget of 0 closes the thinking at once.)"""
    from dataclasses import replace

    from llmchat.config import load_config
    from llmchat.reasoning.formats import ReasoningSettings
    from llmchat.tools import options as tool_options
    from llmchat.turn.session import ChatSession

    functions = tmp_path / "clock.py"
    functions.write_text('def clock() -> str:\n    """The time now."""\n    return "It is noon."\n', encoding="utf-8")
    model = loaded.engine.model
    model.clear()
    evaluated = Evaluated(model, monkeypatch)
    session = ChatSession.start(
        loaded.engine,
        sampling=replace(loaded.sampling, max_tokens=48),
        model_label=loaded.model.name,
        template_choice=str(TEMPLATES / "Qwen3.5-4B.jinja"),
        reasoning=ReasoningSettings(think=think, budget=0 if think else None),
    )
    request = tool_options.tool_request(None, [str(functions)], None, "clock", 1, True)
    toolset = tool_options.gather(request, load_config())
    try:
        tool_options.offer(session, toolset, request)
        for message in (f"{LONG}\nWhat time is it?", "And now?", "And a third time?"):
            result = session.turn(message, record=False)
            assert [call["result"] for call in result.to_record(1)["tool_calls"]] == ["It is noon."]
    finally:
        toolset.close()
    assert evaluated.rows[0][0] > 900
    over = evaluated.over_a_transformer()
    assert len(over) >= 5 and all(extra <= FEW for extra in over), (over, evaluated.rows)


@pytest.mark.parametrize(
    ("template", "think", "rewritten"),
    [
        ("Qwen3.5-4B.jinja", False, "<think>\n\n</think>\n\n"),  # the closed thinking block goes
        ("Qwen3.5-4B.jinja", True, "<think>\n"),  # so does the open one (with the thinking)
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", True, ">\n"),  # `<think>\n` becomes `<think></think>`
        ("LFM2.5-Instruct.jinja", False, ""),  # the reply follows the whole generation prompt
        ("ibm-granite-granite-4.0.jinja", False, ""),
    ],
)
def test_the_rewrite_of_the_generation_prompt_is_derived_from_the_template(loaded, template, think, rewritten):
    """The tail of the generation prompt that the next prompt renders otherwise, in SmolLM2's
    tokens (`<think>` is three of them: the rewrite of Nemotron's starts inside it)."""
    from llmchat.turn.parting import rewritten_tail

    session = _session(loaded, template, think)
    tail = rewritten_tail(session.tokenize_messages, think)
    assert loaded.engine.detokenize(list(tail)) == rewritten
