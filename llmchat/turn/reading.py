"""A model's raw output read as a turn reads it, without a model: reasoning split, then calls.

The same two steps a turn takes on the decoded text (llmchat.reasoning.thinking's ThinkingSplitter, fed
piece by piece, then `read_finished_reply`: the call format's parser and the template's content markers,
the one reading the tool loop gives each round's reply too), so `llmchat template parse` answers
"why didn't my tool call run?" with the turn's own reading, and the reference cases of llama.cpp's
test suite run through it whole and one character at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from llmchat.prompt.sandbox import compile_template, render_compiled
from llmchat.reasoning.formats import detect_format, starts_in_thinking, thinking_preface, thinking_variables
from llmchat.reasoning.thinking import ThinkingSplitter
from llmchat.tools.families import CALLS_IN_HEADERS, call_in_reasoning, detect_family
from llmchat.turn.markers import reply_content
from llmchat.turn.structured import unfenced

if TYPE_CHECKING:
    from llmchat.tools.call_parsers import ParsedReply
    from llmchat.tools.families import Family

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
    pieces = [output] if isinstance(output, str) else list(output)
    raw = "".join(pieces)
    reasoning, answer = split_thinking(
        template_source, pieces, schemas, thinking=thinking, effort=effort, split_reasoning=split_reasoning
    )
    # gpt-oss' calls are in the channel headers that only a split leaves out of the answer.
    whole_reply = raw if split_reasoning and detect_format(template_source) is not None else None
    reading = read_finished_reply(
        template_source, detect_family(template_source), answer, reasoning, schemas, whole_reply=whole_reply
    )
    content = unfenced(reading.parsed.content) if json_reply else reading.parsed.content
    return {
        "content": content,
        "reasoning_content": reading.reasoning,
        "tool_calls": [{"name": call.name, "arguments": call.arguments} for call in reading.parsed.calls],
    }


def split_thinking(
    template_source: str,
    pieces: list[str],
    schemas: Mapping[str, Any] | None = None,
    *,
    thinking: bool | None = None,
    effort: str | None = None,
    split_reasoning: bool = True,
) -> tuple[str, str]:
    """(reasoning, answer) of a raw output fed piece by piece, as a turn splits it while it
    streams. Without a split the answer is the whole output."""
    detected = detect_format(template_source)
    fmt = detected if split_reasoning else None
    raw = "".join(pieces)
    if detected is None:
        return "", raw
    variables = thinking_variables(detected, thinking, effort, lambda line: None)
    tools = [
        {"type": "function", "function": {"name": name, "parameters": schema}}
        for name, schema in (schemas or {}).items()
    ]
    try:
        prompt = generation_prompt(template_source, variables, tools)
    except Exception:  # noqa: BLE001 - a template that cannot render a fresh turn starts outside thinking
        prompt = ""
    if fmt is not None:
        openers = detect_family(template_source).triggers if tools else ()
        preface = thinking_preface(fmt, prompt)
        splitter = ThinkingSplitter(
            fmt, start_in_thinking=preface is not None, call_openers=openers, preface=preface or ""
        )
        for piece in pieces:
            splitter.feed(piece)
        splitter.flush()
        return splitter.reasoning, splitter.answer
    if detected.kind == "tags" and starts_in_thinking(detected, prompt) and detected.close_tag in raw:
        # Read without a split, a reply that closes the block the prompt opened started inside
        # it: its text includes the opening, as llama.cpp's reasoning_format "none" shows it.
        return "", prompt[prompt.rindex(detected.open_tag) :] + raw
    return "", raw


@dataclass(frozen=True)
class ReplyReading:
    """A finished reply as a turn reads it: its thinking, its answer (where a call written inside
    the thinking block moved to), and the answer parsed: its calls, and the text shown."""

    reasoning: str
    answer: str
    parsed: ParsedReply


def read_finished_reply(
    template_source: str,
    family: Family,
    answer: str,
    reasoning: str = "",
    schemas: Mapping[str, Any] | None = None,
    *,
    whole_reply: str | None = None,
) -> ReplyReading:
    """The one reading of a finished reply, already split into thinking and answer (a turn splits
    it as it streams, `read_output` as a turn would): the calls in the model's own format, and the
    text without the markers the template wraps a reply in (Command R7B's `<|START_RESPONSE|>`).
    The tool loop reads each round with it and `read_output` each raw output, so a reply reads the
    same with tools offered as in `template parse` and the reference cases.

    `whole_reply`: everything decoded, where the split took the thinking out of `answer` (None:
    the answer is all of it)."""
    parsed = family.parse(answer, schemas)
    if family.id in CALLS_IN_HEADERS and whole_reply is not None:
        # Harmony (and Muse Glimmer) write a call's name in its header, which the reasoning split leaves out of the
        # answer: the calls come from the whole reply, the content from the answer.
        parsed = replace(family.parse(whole_reply, schemas), content=parsed.content)
    at = call_in_reasoning(family, reasoning) if not parsed.calls else None
    if at is not None:
        reasoning, answer = reasoning[:at].strip(), reasoning[at:] + answer
        parsed = family.parse(answer, schemas)
    # A derived family's parser unwraps its content already; a hand-written row's does not, and
    # the markers that close the turn (`<|eot|>`) are the template's, not the family's.
    content = reply_content(template_source, parsed.content)
    return ReplyReading(reasoning, answer, replace(parsed, content=content))
