"""Earlier reasoning, sent back as each template asks.

An assistant message that had thinking reaches the template with it as `reasoning_content`, as
llama.cpp's common_chat_templates_apply passes it, and the template decides what to keep:
- Qwen3, Qwen3.5, GLM 4.5+, MiniMax M2 and DeepSeek V3.2 keep it after the last user message
  (the tool rounds of the current turn) and drop it before;
- Kimi K2 Thinking keeps it after the last reply that called nothing (the same rounds);
- MiniMax M3 keeps it for every turn; DeepSeek V4 whenever tools are listed or after the last
  user message.
Without it the next round would re-prefill a reply the model never wrote (its call without its
thinking) and reason worse; with it the round's prompt extends the one before plus its reply, so
the KV cache is reused whole.

A template that does not read `reasoning_content` (the format analysis found no thinking there,
or found it under another name: gpt-oss' `thinking`) never gets it: its prompt stays exactly as it
was. `--reasoning-preserve` sets the variable a template has for keeping all earlier thinking
(`PRESERVE_SWITCHES`); a template without one keeps what it keeps, and says so once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

REASONING_KEY = "reasoning_content"

# A template's own switch for keeping the thinking of every turn, and the value that keeps it:
# GLM 4.7's `clear_thinking`, DeepSeek V4's `drop_thinking`, Qwen 3.6's `preserve_thinking`.
PRESERVE_SWITCHES: tuple[tuple[str, bool], ...] = (
    ("clear_thinking", False),
    ("drop_thinking", False),
    ("preserve_thinking", True),
)


def renders_reasoning(template_source: str) -> bool:
    """Whether the template reads earlier thinking from `reasoning_content` (the format analysis
    rendered a message with it and found the thinking in the prompt)."""
    if REASONING_KEY not in template_source:  # cheap, and spares a template the analysis
        return False
    from llmchat.prompt.format_analysis import analyze

    layout = analyze(template_source).reasoning
    return layout is not None and layout.message_key == REASONING_KEY


def for_template(messages: Sequence[Mapping[str, Any]], template_source: str) -> list[dict[str, Any]]:
    """The messages as the template takes them: without `reasoning_content` where it does not
    read it, so its prompt is what it always was."""
    if not any(REASONING_KEY in m for m in messages) or renders_reasoning(template_source):
        return [dict(m) for m in messages]
    return [{k: v for k, v in m.items() if k != REASONING_KEY} for m in messages]


def preserve_switches(template_source: str) -> dict[str, bool]:
    """The template's own variables that keep every turn's thinking, set to keep it."""
    return {name: keeps for name, keeps in PRESERVE_SWITCHES if re.search(rf"\b{name}\b", template_source) is not None}


def preserve_variables(template_source: str, preserve: bool, say: Callable[[str], None]) -> dict[str, Any]:
    """Template variables for --reasoning-preserve; a template that cannot do it says so once."""
    if not preserve:
        return {}
    switches = preserve_switches(template_source)
    if switches:
        return dict(switches)
    if renders_reasoning(template_source):
        names = ", ".join(name for name, _ in PRESERVE_SWITCHES)
        say(
            f"this model's template has no switch to keep earlier thinking ({names}); --reasoning-preserve "
            "does nothing here: the template itself decides which earlier thinking the model sees"
        )
    else:
        say("this model's template never shows earlier thinking to the model; --reasoning-preserve does nothing here")
    return {}
