"""Rendering a conversation with a chosen template, and telling the engine which parts of the
prompt are template text and which are message text (the prompt's trust boundary).

`render_prompt` returns the prompt text and the same text as pieces `(text, trusted)`: message
contents are untrusted, so the engine can tokenize them without special-token parsing and a
user typing `<|im_end|>` gets plain text. The pieces come from a second render in which each
message content is replaced by a placeholder of private-use characters; the text around the
placeholders is the template's own (trusted). If that does not reproduce the real render exactly
(the template rewrites message text), the whole prompt becomes one trusted piece and a note says so.

A template whose system-prompt probe (llmchat.prompt.resolution) found it drops or refuses the
system message is rendered with the system text folded into the first user message.
Rendering itself happens in llmchat.prompt.sandbox.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from llmchat.errors import UsageError
from llmchat.prompt.model_facts import ModelFacts
from llmchat.prompt.reasoning_history import REASONING_KEY, for_template
from llmchat.prompt.sandbox import TemplateRenderError, compile_template, render_compiled

# Private-use characters (plane 15) mark where message contents go in the skeleton render.
_PLACEHOLDER_OPEN = "\U000f0000"
_PLACEHOLDER_CLOSE = "\U000f0001"
_PLACEHOLDER_RE = re.compile(f"{_PLACEHOLDER_OPEN}(\\d+){_PLACEHOLDER_CLOSE}")


@dataclass(frozen=True)
class Piece:
    text: str
    trusted: bool  # False: message content, to be tokenized without special-token parsing
    # For message content: the role of the message it came from. An assistant reply rendered
    # verbatim can then be given back to the model as the very token ids it was sampled as.
    role: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    pieces: tuple[Piece, ...]
    notes: tuple[str, ...] = ()


@dataclass
class ResolvedTemplate:
    name: str
    source: str  # "flag" | "config" | "gguf" | "builtin" | "fallback"
    source_detail: str  # e.g. "GGUF tokenizer.chat_template"; used in every error message
    text: str  # Jinja source
    stop_strings: tuple[str, ...]
    system_mode: str = "native"  # "native" | "folded"
    notes: list[str] = field(default_factory=list)  # for --verbose
    warning: str | None = None  # set for the ChatML fallback
    steps: list[str] = field(default_factory=list)  # how it was chosen
    _compiled: Any = field(default=None, repr=False, compare=False)

    def compiled(self) -> Any:
        """The compiled jinja2 Template, built once: rendering happens every turn."""
        if self._compiled is None:
            self._compiled = compile_template(self.text, self.source_detail)
        return self._compiled


# The keys of a tool conversation's messages that reach the template besides role and content:
# an assistant's calls, and a tool result's call id and tool name (llmchat.tools.prompt).
TOOL_MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name")


def _normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    normalized = []
    for number, message in enumerate(messages, start=1):
        if not isinstance(message, Mapping):
            raise UsageError(f"message {number} is not an object with role and content")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise UsageError(f"message {number} has no role (a string such as user, assistant or system)")
        # An assistant message that only calls tools may have no content (some templates want None).
        if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
            raise UsageError(f"message {number} ({role}) has no content string")
        shaped: dict[str, Any] = {"role": role, "content": content}
        for key in TOOL_MESSAGE_KEYS:
            if key in message:
                shaped[key] = message[key]
        if role == "assistant" and isinstance(message.get(REASONING_KEY), str) and message[REASONING_KEY]:
            shaped[REASONING_KEY] = message[REASONING_KEY]  # its earlier thinking (llmchat.prompt.reasoning_history)
        normalized.append(shaped)
    return normalized


def fold_system_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
    """System messages moved into the next user message as system + "\\n" + user (llama.cpp's
    convention for templates without a system role). A system message with no user message after
    it becomes a user message of its own."""
    folded: list[dict[str, str]] = []
    pending: list[str] = []
    for message in messages:
        if message["role"] == "system":
            if message["content"]:
                pending.append(message["content"])
            continue
        if pending and message["role"] == "user":
            message = {"role": "user", "content": "\n".join([*pending, message["content"]])}
            pending = []
        folded.append(dict(message))
    if pending:
        folded.append({"role": "user", "content": "\n".join(pending)})
    return folded


def template_context(
    messages: list[dict[str, str]],
    facts: ModelFacts,
    add_generation_prompt: bool,
    variables: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    # `variables` (enable_thinking, reasoning_effort, --template-var) go first: ours win.
    return {
        **_tool_template_defaults(),
        **(variables or {}),
        "messages": messages,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": facts.bos_token,
        "eos_token": facts.eos_token,
    }


_STARTED_AT: list[str] = []


def _tool_template_defaults() -> dict[str, Any]:
    """Firefunction v2's template reads `functions` (the tools as JSON text) and `datetime` on every
    render, tools or not; without them it cannot render a plain chat. (llmchat.tools.prompt sets
    the real values when tools are offered.) The time is taken once per process: a clock that
    moved between turns would change the system prompt and defeat the KV-prefix reuse."""
    if not _STARTED_AT:
        from datetime import datetime, timezone

        _STARTED_AT.append(datetime.now(timezone.utc).strftime("%b %d %Y %H:%M:%S GMT"))
    return {"functions": "[]", "datetime": _STARTED_AT[0]}


def render_prompt(
    resolved: ResolvedTemplate,
    messages: Sequence[Mapping[str, str]],
    facts: ModelFacts,
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
) -> RenderedPrompt:
    """The prompt for `messages`, as text and as trusted/untrusted pieces that join to that text.
    `variables`: extra template variables the template's authors defined (`enable_thinking`)."""
    conversation = _normalize_messages(for_template(messages, resolved.text))
    if resolved.system_mode == "folded":
        conversation = fold_system_messages(conversation)
    compiled = resolved.compiled()
    label = resolved.source_detail
    reference = render_compiled(
        compiled, template_context(conversation, facts, add_generation_prompt, variables), label
    )
    pieces, notes = _pieces(compiled, conversation, facts, add_generation_prompt, reference, label, variables)
    return RenderedPrompt(reference, pieces, notes)


def _placeholder(index: int) -> str:
    return f"{_PLACEHOLDER_OPEN}{index}{_PLACEHOLDER_CLOSE}"


_ALL_CONTENTS_NOTE = (
    "the template rewrites message text, so this prompt was tokenized as template text: "
    "special-token text inside messages (such as <|im_end|>) was not neutralized"
)
_ASSISTANT_REWRITE_NOTE = (
    "the template rewrites assistant replies (for example it drops reasoning), so earlier replies were "
    "tokenized as template text; user and system text stayed plain text"
)


def _pieces(
    compiled: Any,
    conversation: list[dict[str, str]],
    facts: ModelFacts,
    add_generation_prompt: bool,
    reference: str,
    label: str,
    variables: Mapping[str, Any] | None = None,
) -> tuple[tuple[Piece, ...], tuple[str, ...]]:
    """Split the reference render into template text and message contents.

    First every content is protected, and the string values of the arguments of earlier tool
    calls with them (a call the model wrote is text it sampled; re-rendered, `<|im_end|>` inside an
    argument must not become the control token). A template that prints arguments in a way the
    splice cannot follow gets the next try without them. Reasoning templates rewrite assistant
    replies (Qwen3 and DeepSeek R1 drop `<think>` blocks), which breaks that; the last try protects
    only user and system text, the part that comes from outside. Failing all, the prompt is one
    trusted piece.
    """
    every = {i for i, m in enumerate(conversation) if m["content"] or m.get(REASONING_KEY)}
    if not every:
        return ((Piece(reference, True),) if reference else ()), ()
    with_calls = any(m.get("tool_calls") for m in conversation)
    attempts = (
        *(((every, True, ()),) if with_calls else ()),
        (every, False, ()),
        (
            {i for i, m in enumerate(conversation) if m["content"] and m["role"] != "assistant"},
            False,
            (_ASSISTANT_REWRITE_NOTE,),
        ),
    )
    for protected, arguments, notes in attempts:
        if not protected:
            continue
        spliced = _protected_pieces(
            compiled, conversation, protected, facts, add_generation_prompt, reference, label, variables, arguments
        )
        if spliced is not None:
            return spliced, notes
    return (Piece(reference, True),), (_ALL_CONTENTS_NOTE,)


def _with_argument_placeholders(conversation: list[dict[str, Any]], contents: list[str]) -> list[dict[str, Any]]:
    """The conversation with each non-empty string value in a tool call's arguments replaced by a
    placeholder numbered after the messages' own; the values are appended to `contents`."""

    def protect(value: Any) -> Any:
        if isinstance(value, str) and value:
            contents.append(value)
            return _placeholder(len(contents) - 1)
        if isinstance(value, dict):
            return {key: protect(item) for key, item in value.items()}
        if isinstance(value, list):
            return [protect(item) for item in value]
        return value

    shaped = []
    for message in conversation:
        calls = message.get("tool_calls")
        if message["role"] == "assistant" and isinstance(calls, list):
            message = {**message, "tool_calls": [_call_with_placeholders(call, protect) for call in calls]}
        shaped.append(message)
    return shaped


def _with_reasoning_placeholders(
    conversation: list[dict[str, Any]], protected: set[int], contents: list[str]
) -> list[dict[str, Any]]:
    """The earlier thinking of each protected message replaced by a placeholder numbered after the
    contents so far, as its content is: the model sampled it, so `<|im_end|>` written inside it
    must stay text; the thinking is appended to `contents`."""
    shaped = []
    for index, message in enumerate(conversation):
        if index in protected and message.get(REASONING_KEY):
            contents.append(message[REASONING_KEY])
            message = {**message, REASONING_KEY: _placeholder(len(contents) - 1)}
        shaped.append(message)
    return shaped


def _call_with_placeholders(call: Any, protect: Any) -> Any:
    # The arguments as an object (their string values), or as JSON text (the shape some templates
    # print as it is: DeepSeek R1, Functionary), which is then protected whole.
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), (dict, str)):
        return call
    return {**call, "function": {**function, "arguments": protect(function["arguments"])}}


def _protected_pieces(
    compiled: Any,
    conversation: list[dict[str, str]],
    protected: set[int],
    facts: ModelFacts,
    add_generation_prompt: bool,
    reference: str,
    label: str,
    variables: Mapping[str, Any] | None = None,
    arguments: bool = False,
) -> tuple[Piece, ...] | None:
    """Render with placeholders for the `protected` contents (and, with `arguments`, the string
    values of tool calls' arguments) and splice them back in. Empty contents are never replaced:
    there is nothing to protect, and `{% if content %}` must take the same branch in both renders."""
    contents: list[str] = [message["content"] or "" for message in conversation]
    roles: list[str | None] = [m["role"] for m in conversation]
    skeleton_messages = [
        {**message, "content": _placeholder(index) if index in protected and message["content"] else message["content"]}
        for index, message in enumerate(conversation)
    ]
    skeleton_messages = _with_reasoning_placeholders(skeleton_messages, protected, contents)
    if arguments:
        skeleton_messages = _with_argument_placeholders(skeleton_messages, contents)
    roles.extend([None] * (len(contents) - len(roles)))  # thinking or an argument is no message's content
    try:
        skeleton = render_compiled(
            compiled, template_context(skeleton_messages, facts, add_generation_prompt, variables), label
        )
    except TemplateRenderError as err:
        if err.kind in ("refused", "limit"):
            raise
        return None
    return _splice(reference, skeleton, contents, roles)


def _content_variants(content: str) -> list[str]:
    """The forms templates commonly print a content in: as is, trimmed (`| trim`, `.strip()`), or
    inside a JSON string (`| tojson`: Llama 3.x and gpt-oss print a tool's result that way)."""
    variants: list[str] = []
    as_json = json.dumps(content, ensure_ascii=False)[1:-1]
    for variant in (content, content.strip(), content.rstrip(), content.lstrip(), as_json):
        if variant not in variants:
            variants.append(variant)
    return variants


def _splice(
    reference: str, skeleton: str, contents: Sequence[str], roles: Sequence[str | None] | None = None
) -> tuple[Piece, ...] | None:
    """Pieces from the skeleton render with each placeholder replaced by its content, or None
    when that does not give back exactly the reference render."""
    parts = _PLACEHOLDER_RE.split(skeleton)  # literal, index, literal, index, ..., literal
    literals, indexes = parts[0::2], parts[1::2]
    if any(_PLACEHOLDER_OPEN in lit or _PLACEHOLDER_CLOSE in lit for lit in literals):
        return None  # a placeholder was cut or rewritten: the template transforms contents
    pieces: list[Piece] = []
    pos = 0
    for number, literal in enumerate(literals):
        if not reference.startswith(literal, pos):
            return None
        pieces.append(Piece(literal, True))
        pos += len(literal)
        if number == len(indexes):
            break
        index = int(indexes[number])
        if index >= len(contents):
            return None
        following = literals[number + 1]
        variant = next(
            (
                v
                for v in _content_variants(contents[index])
                if reference.startswith(v, pos) and reference.startswith(following, pos + len(v))
            ),
            None,
        )
        if variant is None:
            return None
        pieces.append(Piece(variant, False, roles[index] if roles is not None else None))
        pos += len(variant)
    if pos != len(reference):
        return None
    return _merge_pieces(pieces)


def _merge_pieces(pieces: Iterable[Piece]) -> tuple[Piece, ...]:
    merged: list[Piece] = []
    for piece in pieces:
        if not piece.text:
            continue
        if merged and merged[-1].trusted == piece.trusted and (piece.trusted or merged[-1].role == piece.role):
            merged[-1] = Piece(merged[-1].text + piece.text, piece.trusted, piece.role)
        else:
            merged.append(piece)
    return tuple(merged)
