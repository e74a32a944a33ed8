"""A model's raw output read as a turn reads it, without a model: reasoning split, then calls.

The same two steps a turn takes on the decoded text (llmchat.reasoning's ThinkingSplitter, fed
piece by piece, then the call format's parser), so `llmchat template parse` answers "why didn't my
tool call run?" with the turn's own reading, and the reference cases of llama.cpp's test suite run
through it whole and one character at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from typing import Any

from llmchat.prompt.format_analysis import analyze
from llmchat.prompt.sandbox import compile_template, render_compiled
from llmchat.reasoning import ThinkingSplitter, detect_format, starts_in_thinking, thinking_variables
from llmchat.structured import unfenced
from llmchat.tools.families import call_in_reasoning, detect_family

PROBE_USER = {"role": "user", "content": "Hey there!"}


def generation_prompt(template_source: str, variables: Mapping[str, Any], tools: list[dict[str, Any]]) -> str:
    """The prompt a fresh turn ends with, for the reasoning split's start state."""
    context = {
        **variables,
        "messages": [PROBE_USER],
        "add_generation_prompt": True,
        "bos_token": "",
        "eos_token": "",
    }
    if tools:
        context["tools"] = tools
    return render_compiled(_compiled(template_source), context, "the chat template")


@lru_cache(maxsize=8)
def _compiled(template_source: str) -> object:
    return compile_template(template_source, "the chat template")


def read_output(
    template_source: str,
    output: str | Iterable[str],
    schemas: Mapping[str, Any] | None = None,
    *,
    thinking: bool | None = None,
    effort: str | None = None,
    split_reasoning: bool = True,
    json_reply: bool = False,
) -> dict[str, Any]:
    """{content, reasoning_content, tool_calls: [{name, arguments}]} for a raw output, given whole
    or as pieces (a stream). `split_reasoning=False` reads it as a model without a reasoning
    format (llama.cpp's `--reasoning-format none`): thinking stays in the content. `json_reply`: the
    reply was asked for as JSON (a schema): a Markdown fence around it is not part of it."""
    detected = detect_format(template_source)
    fmt = detected if split_reasoning else None
    variables = thinking_variables(detected, thinking, effort, lambda line: None)
    tools = [
        {"type": "function", "function": {"name": name, "parameters": schema}}
        for name, schema in (schemas or {}).items()
    ]
    pieces = [output] if isinstance(output, str) else list(output)
    raw = "".join(pieces)
    reasoning = ""
    answer = raw
    prompt = ""
    if detected is not None:
        try:
            prompt = generation_prompt(template_source, variables, tools)
        except Exception:  # noqa: BLE001 - a template that cannot render a fresh turn starts outside thinking
            prompt = ""
    if fmt is not None:
        splitter = ThinkingSplitter(fmt, start_in_thinking=starts_in_thinking(fmt, prompt))
        for piece in pieces:
            splitter.feed(piece)
        splitter.flush()
        reasoning, answer = splitter.reasoning, splitter.answer
    elif (
        detected is not None
        and detected.kind == "tags"
        and starts_in_thinking(detected, prompt)
        and detected.close_tag in raw
    ):
        # Read without a split, a reply that closes the block the prompt opened started inside
        # it: its text includes the opening, as llama.cpp's reasoning_format "none" shows it.
        answer = prompt[prompt.rindex(detected.open_tag) :] + raw
    family = detect_family(template_source)
    parsed = family.parse(answer, schemas)
    if family.id == "gpt_oss" and fmt is not None:
        # Harmony writes a call's name in its header, which the reasoning split leaves out of the
        # answer: the calls come from the whole reply, the content from the answer.
        parsed = replace(family.parse(raw, schemas), content=parsed.content)
    at = call_in_reasoning(family, reasoning) if not parsed.calls else None
    if at is not None:
        reasoning, answer = reasoning[:at].strip(), reasoning[at:] + answer
        parsed = family.parse(answer, schemas)
    content = analyze(template_source).unwrap(parsed.content)
    if json_reply:
        content = unfenced(content)
    return {
        "content": content,
        "reasoning_content": reasoning,
        "tool_calls": [{"name": call.name, "arguments": call.arguments} for call in parsed.calls],
    }
