"""Chat templates: choose one for a model, render conversations with it safely, and tell the
engine which parts of the prompt are template text and which are message text.

Resolution (`resolve_template`), first that applies wins:
    1. `--template NAME|PATH` (a built-in name, or a path to a .jinja file);
    2. the per-model template from the config file (same NAME|PATH forms);
    3. the model's own GGUF `tokenizer.chat_template` (named variants such as
       `tokenizer.chat_template.tool_use` are reported but not used);
    4. a built-in template matched on the GGUF metadata (marker tokens in the vocabulary first,
       then `general.name`/`general.basename`, then `general.architecture`);
    5. ChatML, with a warning that names the `--template` flag.

Rendering happens in `llmchat.template_sandbox` (jinja2's immutable sandbox with step, time and
size limits, Hugging Face's conventions); every failure there is a `TemplateError` that names the
template's source and the `--template` override.

System prompts are never lost: each resolved template is probed once with a system message. If
it raises or drops the system text, `system_mode` is "folded" and `render_prompt` puts the
system text in front of the first user message (system + "\\n" + user, llama.cpp's convention).

`render_prompt` returns the prompt text and the same text as pieces `(text, trusted)`: message
contents are untrusted, so the engine can tokenize them without special-token parsing and a
user typing `<|im_end|>` gets plain text. The pieces come from a second render in which each
message content is replaced by a placeholder of private-use characters; the text around the
placeholders is the template's own (trusted). If that does not reproduce the real render exactly
(the template rewrites message text), the whole prompt becomes one trusted piece and a note says so.

Built-in templates live in the top-level `templates/` folder (package data `llmchat.templates`),
one `<name>.jinja` per family, each opening with a header comment:

    {#
    description: one line for `llmchat template list`
    match-architecture: gemma, gemma2, gemma3      general.architecture, exact (case-insensitive)
    match-name: gemma                               substring of general.name / general.basename,
                                                    lowercased with spaces and "_" turned into "-"
    match-token: <start_of_turn>, <end_of_turn>     vocabulary entries; when the vocabulary is
                                                    known, all must be present
    stop: <end_of_turn>, <eos>                      stop strings for generation
    source: where the format comes from (official template / documentation URL)
    #}

List values are separated by commas; inside a value `\\,` is a comma, `\\n` a newline, `\\t` a
tab and `\\\\` a backslash. Keys may repeat (values add up). The file name is the template name.
A user's own .jinja file may carry the same header; its `stop:` line is then used.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Container, Iterable, Mapping, Sequence

from llmchat.errors import TemplateError, UsageError
from llmchat.template_sandbox import OVERRIDE_HINT, TemplateRenderError, compile_template, render_compiled

FALLBACK_TEMPLATE = "chatml"

# Strings that end a turn in some family; a GGUF template that mentions one gets it as a stop string.
KNOWN_STOP_MARKERS = (
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "</s>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|EOT|>",
    "<｜end▁of▁sentence｜>",
    "<|eot|>",
    "<|return|>",
    "<|end_of_turn|>",  # OpenChat
    "<|turn_end|>",
    "[|endofturn|]",
)

_PROBE_SYSTEM = "llmchat-system-probe-7f3a"
_PROBE_USER = "llmchat-user-probe-91c2"

# Private-use characters (plane 15) mark where message contents go in the skeleton render.
_PLACEHOLDER_OPEN = "\U000f0000"
_PLACEHOLDER_CLOSE = "\U000f0001"
_PLACEHOLDER_RE = re.compile(f"{_PLACEHOLDER_OPEN}(\\d+){_PLACEHOLDER_CLOSE}")


# =================================================================================================
# Data types
# =================================================================================================
@dataclass(frozen=True)
class ModelFacts:
    """What template resolution needs to know about a model (from its GGUF metadata)."""

    architecture: str = ""
    name: str = ""
    basename: str = ""
    chat_template: str | None = None  # tokenizer.chat_template
    named_templates: Mapping[str, str] = field(default_factory=dict)  # tokenizer.chat_template.<name>
    bos_token: str = ""
    eos_token: str = ""
    tokens: frozenset[str] = frozenset()  # marker tokens present in the vocabulary
    # True when `tokens` was checked against the whole vocabulary for every built-in's markers
    # (facts_from_metadata does that): a built-in whose markers are missing is then ruled out.
    vocab_known: bool = False

    def has_token(self, text: str) -> bool:
        return text in self.tokens


@dataclass(frozen=True)
class BuiltinTemplate:
    name: str
    path: str  # where the .jinja file was read from (for display)
    text: str
    description: str
    match_architectures: tuple[str, ...]
    match_names: tuple[str, ...]
    match_tokens: tuple[str, ...]
    stop_strings: tuple[str, ...]
    source: str


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


# =================================================================================================
# Built-in templates and their headers
# =================================================================================================
_HEADER_RE = re.compile(r"\A\s*\{#(.*?)#\}", re.S)
_LIST_KEYS = {"match-architecture", "match-name", "match-token", "stop"}
_TEXT_KEYS = {"description", "source"}


def parse_template_header(text: str, where: str) -> dict[str, list[str]]:
    """The `key: value` lines of a template's opening `{# ... #}` comment ({} when there is none)."""
    match = _HEADER_RE.match(text)
    if match is None:
        return {}
    header: dict[str, list[str]] = {}
    for number, raw in enumerate(match.group(1).splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if not sep or key not in _LIST_KEYS | _TEXT_KEYS:
            known = ", ".join(sorted(_LIST_KEYS | _TEXT_KEYS))
            raise TemplateError(f"{where}: header line {number} {line!r} is not 'key: value' with a key from: {known}")
        values = _split_header_list(value) if key in _LIST_KEYS else [value.strip()]
        header.setdefault(key, []).extend(v for v in values if v)
    return header


def _split_header_list(value: str) -> list[str]:
    """Comma-separated values; backslash escapes \\, \\n \\t \\\\. Only unescaped whitespace
    around a value is dropped, so `\\n\\nUser:` keeps its newlines."""
    escapes = {",": ",", "n": "\n", "t": "\t", "\\": "\\"}
    items: list[str] = []
    current: list[tuple[str, bool]] = []  # (text, came from an escape)

    def finish() -> None:
        while current and not current[0][1] and current[0][0].isspace():
            current.pop(0)
        while current and not current[-1][1] and current[-1][0].isspace():
            current.pop()
        items.append("".join(text for text, _ in current))
        current.clear()

    chars = iter(value)
    for char in chars:
        if char == "\\":
            nxt = next(chars, "")
            current.append((escapes.get(nxt, "\\" + nxt), True))
        elif char == ",":
            finish()
        else:
            current.append((char, False))
    finish()
    return items


def _builtin_from_text(name: str, path: str, text: str) -> BuiltinTemplate:
    header = parse_template_header(text, f"built-in template {path}")
    return BuiltinTemplate(
        name=name,
        path=path,
        text=text,
        description=" ".join(header.get("description", [])),
        match_architectures=tuple(a.lower() for a in header.get("match-architecture", [])),
        match_names=tuple(_normalize_name(n) for n in header.get("match-name", [])),
        match_tokens=tuple(header.get("match-token", [])),
        stop_strings=tuple(header.get("stop", [])),
        source="; ".join(header.get("source", [])),
    )


def _template_files() -> list[tuple[str, str, str]]:
    """(name, path for display, text) of every built-in, from the installed package data or,
    in a source checkout that is not installed, from the repository's templates/ folder."""
    try:
        from importlib import resources

        root = resources.files("llmchat.templates")
        found = [
            (entry.name[: -len(".jinja")], str(entry), entry.read_text(encoding="utf-8"))
            for entry in root.iterdir()
            if entry.name.endswith(".jinja")
        ]
        if found:
            return found
    except (ImportError, OSError, TypeError, ValueError):
        pass
    folder = Path(__file__).resolve().parent.parent / "templates"
    return [(p.stem, str(p), p.read_text(encoding="utf-8")) for p in folder.glob("*.jinja")]


@functools.lru_cache(maxsize=1)
def _builtins() -> tuple[BuiltinTemplate, ...]:
    templates = [_builtin_from_text(name, path, text) for name, path, text in _template_files()]
    if not templates:
        raise TemplateError(
            "no built-in chat templates found (the llmchat installation is incomplete); reinstall llmchat"
        )
    return tuple(sorted(templates, key=lambda t: t.name))


def builtin_templates() -> list[BuiltinTemplate]:
    return list(_builtins())


def builtin_template(name: str) -> BuiltinTemplate | None:
    return next((t for t in _builtins() if t.name == name), None)


def marker_tokens() -> tuple[str, ...]:
    """Every vocabulary entry the built-ins' match rules and the stop inference look at."""
    markers = {token for t in _builtins() for token in t.match_tokens}
    markers.update(KNOWN_STOP_MARKERS)
    return tuple(sorted(markers))


# =================================================================================================
# Rendering and pieces
# =================================================================================================
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


def _context(
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
    conversation = _normalize_messages(messages)
    if resolved.system_mode == "folded":
        conversation = fold_system_messages(conversation)
    compiled = resolved.compiled()
    label = resolved.source_detail
    reference = render_compiled(compiled, _context(conversation, facts, add_generation_prompt, variables), label)
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
    if not any(message["content"] for message in conversation):
        return ((Piece(reference, True),) if reference else ()), ()
    every = {i for i, m in enumerate(conversation) if m["content"]}
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
        {**message, "content": _placeholder(index) if index in protected else message["content"]}
        for index, message in enumerate(conversation)
    ]
    if arguments:
        skeleton_messages = _with_argument_placeholders(skeleton_messages, contents)
        roles.extend([None] * (len(contents) - len(roles)))  # an argument is no message's content
    try:
        skeleton = render_compiled(
            compiled, _context(skeleton_messages, facts, add_generation_prompt, variables), label
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


# =================================================================================================
# System-prompt probe
# =================================================================================================
def _probe_render(compiled: Any, messages: list[dict[str, str]], facts: ModelFacts, label: str) -> str:
    return render_compiled(compiled, _context(messages, facts, True), label)


def _probe_system_handling(compiled: Any, facts: ModelFacts, label: str) -> tuple[str, list[str]]:
    """("native" | "folded", notes). Raises TemplateError when even a lone user message fails."""
    user = {"role": "user", "content": _PROBE_USER}
    user_only = _probe_render(compiled, [user], facts, label)
    if _PROBE_USER.lower() not in user_only.lower():
        raise TemplateError(f"{label} leaves out the user's message when rendering a conversation; {OVERRIDE_HINT}")

    system = {"role": "system", "content": _PROBE_SYSTEM}
    try:
        with_system = _probe_render(compiled, [system, user], facts, label)
    except TemplateRenderError as err:
        if err.kind not in ("raised", "error"):
            raise
        return "folded", [
            f"the template refuses a system message ({err.detail}); the system prompt is put in front of the first user message"
        ]
    if _PROBE_SYSTEM.lower() not in with_system.lower():
        return "folded", [
            "the template drops the system message; the system prompt is put in front of the first user message"
        ]

    notes = []
    if _adds_default_system_prompt(compiled, facts, label, user_only):
        notes.append(
            "the template adds its own default system prompt when the conversation has none (kept: it is the model's own behaviour)"
        )
    return "native", notes


def _adds_default_system_prompt(compiled: Any, facts: ModelFacts, label: str, user_only: str) -> bool:
    """True when a lone user message gets more text in front of it than a user message after an
    empty system message: the template wrote a system prompt of its own."""
    try:
        empty_system = _probe_render(
            compiled, [{"role": "system", "content": ""}, {"role": "user", "content": _PROBE_USER}], facts, label
        )
    except TemplateError:
        return False
    before_user = user_only.lower().find(_PROBE_USER.lower())
    before_user_with_empty_system = empty_system.lower().find(_PROBE_USER.lower())
    return before_user_with_empty_system >= 0 and before_user > before_user_with_empty_system


# =================================================================================================
# Resolution
# =================================================================================================
@dataclass(frozen=True)
class _Candidate:
    name: str
    source: str
    source_detail: str
    text: str
    stop_strings: tuple[str, ...]
    warning: str | None = None


@dataclass(frozen=True)
class _Match:
    template: BuiltinTemplate
    score: tuple[int, int, int]  # (marker tokens present, name matched, architecture matched)
    reasons: tuple[str, ...]


def _normalize_name(text: str) -> str:
    return re.sub(r"[\s_]+", "-", text.strip().lower())


def _match_builtin(template: BuiltinTemplate, facts: ModelFacts) -> _Match | None:
    if facts.vocab_known and template.match_tokens and not all(facts.has_token(t) for t in template.match_tokens):
        return None  # its turn markers are not in this vocabulary: it cannot be this model's format
    tokens = [t for t in template.match_tokens if facts.has_token(t)]
    model_names = [_normalize_name(n) for n in (facts.name, facts.basename) if n]
    names = [pattern for pattern in template.match_names if any(pattern in n for n in model_names)]
    arch = bool(facts.architecture) and facts.architecture.lower() in template.match_architectures
    if not (tokens or names or arch):
        return None
    reasons = []
    if tokens:
        reasons.append("tokens " + " ".join(tokens))
    if names:
        reasons.append(f"name contains {names[0]!r}")
    if arch:
        reasons.append(f"architecture {facts.architecture}")
    return _Match(template, (len(tokens), int(bool(names)), int(arch)), tuple(reasons))


def match_builtins(facts: ModelFacts) -> list[_Match]:
    """Built-ins that match the model, best first (ties: alphabetical, so the choice is stable)."""
    matches = [m for m in (_match_builtin(t, facts) for t in _builtins()) if m is not None]
    return sorted(matches, key=lambda m: (tuple(-s for s in m.score), m.template.name))


def _choice_candidate(choice: str, source: str) -> _Candidate:
    """A NAME|PATH choice from --template (source "flag") or the config file (source "config")."""
    where = "--template" if source == "flag" else "the config file's template"
    builtin = builtin_template(choice)
    if builtin is not None:
        return _Candidate(
            builtin.name, source, f"built-in template '{builtin.name}' ({where})", builtin.text, builtin.stop_strings
        )
    path = Path(choice).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"cannot read template file {path} ({where}): {err}") from None
        label = f"template file {path} ({where})"
        return _Candidate(path.stem, source, label, text, _declared_or_inferred_stops(text, label))
    names = ", ".join(t.name for t in _builtins())
    raise UsageError(f"unknown template {choice!r} ({where}): not a file and not a built-in ({names})")


def _declared_or_inferred_stops(text: str, label: str) -> tuple[str, ...]:
    try:
        declared = parse_template_header(text, label).get("stop", [])
    except TemplateError:
        declared = []
    return tuple(declared) or infer_stop_strings(text)


def infer_stop_strings(text: str, eos_token: str = "") -> tuple[str, ...]:
    """Stop strings for a template without a header: the known end-of-turn markers it mentions,
    plus the model's EOS text when the template writes `eos_token`."""
    stops = [marker for marker in KNOWN_STOP_MARKERS if marker in text]
    if eos_token and "eos_token" in text and eos_token not in stops:
        stops.append(eos_token)
    return tuple(stops)


def _fallback_warning(facts: ModelFacts) -> str:
    described = ", ".join(
        f"{label} {value!r}"
        for label, value in (("architecture", facts.architecture), ("name", facts.name or facts.basename))
        if value
    )
    about = f" ({described})" if described else ""
    return (
        f"this model{about} has no chat template and no built-in template matches it; using ChatML. "
        f"If replies look wrong, pick one with --template NAME (see `llmchat template list`)"
    )


def resolve_template(
    facts: ModelFacts, user_choice: str | None = None, config_choice: str | None = None
) -> ResolvedTemplate:
    """Choose the template (see the module docstring for the order), compile it and probe it."""
    steps: list[str] = []
    candidate: _Candidate | None = None

    if user_choice:
        candidate = _choice_candidate(user_choice, "flag")
        steps.append(f"1. --template {user_choice}: {candidate.source_detail} -> chosen")
    else:
        steps.append("1. --template: not given")

    if config_choice and candidate is None:
        candidate = _choice_candidate(config_choice, "config")
        steps.append(f"2. config file: template {config_choice!r}: {candidate.source_detail} -> chosen")
    else:
        steps.append(
            f"2. config file: template {config_choice!r} (not used: --template wins)"
            if config_choice
            else "2. config file: no template for this model"
        )

    steps.append("3. " + _gguf_step(facts, chosen=candidate is None and bool(facts.chat_template)))
    if candidate is None and facts.chat_template:
        label = "GGUF tokenizer.chat_template"
        candidate = _Candidate(
            "gguf", "gguf", label, facts.chat_template, infer_stop_strings(facts.chat_template, facts.eos_token)
        )

    matches = match_builtins(facts)
    steps.append("4. " + _builtin_step(matches, chosen=candidate is None and bool(matches)))
    if candidate is None and matches:
        best = matches[0].template
        detail = f"built-in template '{best.name}' (matched on {', '.join(matches[0].reasons)})"
        candidate = _Candidate(best.name, "builtin", detail, best.text, best.stop_strings)

    if candidate is None:
        fallback = builtin_template(FALLBACK_TEMPLATE)
        assert fallback is not None, "chatml.jinja ships with llmchat"
        warning = _fallback_warning(facts)
        candidate = _Candidate(
            fallback.name,
            "fallback",
            "built-in template 'chatml' (fallback)",
            fallback.text,
            fallback.stop_strings,
            warning,
        )
        steps.append("5. fallback: ChatML -> chosen")
    else:
        steps.append("5. fallback: not needed")

    return _prepare(candidate, facts, steps)


def _gguf_step(facts: ModelFacts, *, chosen: bool) -> str:
    named = sorted(facts.named_templates)
    named_text = f"; named variants {', '.join(named)} are not used" if named else ""
    if not facts.chat_template:
        return f"GGUF tokenizer.chat_template: not present{named_text}"
    verdict = "chosen" if chosen else "present, not used"
    return f"GGUF tokenizer.chat_template: {len(facts.chat_template):,} characters -> {verdict}{named_text}"


def _builtin_step(matches: list[_Match], *, chosen: bool) -> str:
    if not matches:
        return "built-in match: none"
    best = matches[0]
    text = f"built-in match: '{best.template.name}' ({', '.join(best.reasons)})"
    if len(matches) > 1:
        text += "; also " + ", ".join(f"'{m.template.name}'" for m in matches[1:4])
    return text + (" -> chosen" if chosen else " (not used)")


def _prepare(candidate: _Candidate, facts: ModelFacts, steps: list[str]) -> ResolvedTemplate:
    resolved = ResolvedTemplate(
        name=candidate.name,
        source=candidate.source,
        source_detail=candidate.source_detail,
        text=candidate.text,
        stop_strings=candidate.stop_strings,
        warning=candidate.warning,
        steps=steps,
    )
    mode, notes = _probe_system_handling(resolved.compiled(), facts, resolved.source_detail)
    resolved.system_mode = mode
    resolved.notes.extend(notes)
    if not resolved.stop_strings:
        resolved.notes.append(
            "no stop strings known for this template; generation ends at the model's end-of-generation tokens"
        )
    return resolved


# =================================================================================================
# Model facts from GGUF metadata
# =================================================================================================
def _token_at(token_texts: Sequence[str], index: Any) -> str:
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(token_texts):
        return token_texts[index]
    return ""


def facts_from_metadata(
    meta: Mapping[str, Any],
    vocabulary: Container[str] | None = None,
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
) -> ModelFacts:
    """ModelFacts from GGUF scalar metadata and, when given, the vocabulary.

    The one builder for both callers: `template show` passes the GGUF's token list (BOS and EOS
    are then looked up by id); a loaded model passes a view that asks its tokenizer, with its own
    BOS and EOS text. So `template show` and `chat` choose a template from the same facts.
    """

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""

    prefix = "tokenizer.chat_template."
    named = {
        key[len(prefix) :]: value for key, value in meta.items() if key.startswith(prefix) and isinstance(value, str)
    }
    tokens: frozenset[str] = frozenset()
    if vocabulary is not None:
        lookup = set(vocabulary) if isinstance(vocabulary, Sequence) else vocabulary
        tokens = frozenset(marker for marker in marker_tokens() if marker in lookup)
        if isinstance(vocabulary, Sequence):
            bos_token = (
                _token_at(vocabulary, meta.get("tokenizer.ggml.bos_token_id")) if bos_token is None else bos_token
            )
            eos_token = (
                _token_at(vocabulary, meta.get("tokenizer.ggml.eos_token_id")) if eos_token is None else eos_token
            )
    return ModelFacts(
        architecture=text("general.architecture"),
        name=text("general.name"),
        basename=text("general.basename"),
        chat_template=text("tokenizer.chat_template") or None,
        named_templates=named,
        bos_token=bos_token or "",
        eos_token=eos_token or "",
        tokens=tokens,
        vocab_known=vocabulary is not None,
    )


def facts_from_gguf(path: str | Path) -> ModelFacts:
    """ModelFacts of a GGUF file, read with llmchat's fast header reader (no llama.cpp), from the
    header cache when the file is the one read before."""
    from llmchat.errors import ModelError
    from llmchat.gguf.header_cache import cached_for_file, read_metadata_cached

    meta = read_metadata_cached(Path(path))

    def from_vocabulary() -> dict[str, Any]:
        """What the facts take from the whole vocabulary: which marker tokens it holds, BOS, EOS."""
        try:
            token_texts: Sequence[str] | None = meta.token_texts()
        except ModelError:
            token_texts = None
        facts = facts_from_metadata(meta.scalars, token_texts)
        return {
            "markers": list(marker_tokens()),
            "tokens": sorted(facts.tokens),
            "known": facts.vocab_known,
            "bos": facts.bos_token,
            "eos": facts.eos_token,
        }

    found = cached_for_file(Path(path), "vocabulary-facts", from_vocabulary)
    if found.get("markers") != list(marker_tokens()):  # the built-ins changed since: look again
        found = from_vocabulary()
    vocabulary = frozenset(found["tokens"]) if found["known"] else None
    return facts_from_metadata(meta.scalars, vocabulary, bos_token=found["bos"], eos_token=found["eos"])
