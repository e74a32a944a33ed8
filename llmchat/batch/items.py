"""Batch input: one item per line, JSONL or plain text; a bad line becomes an error item.

A JSON item holds `id?`, `prompt` or `messages`, `system?` and optional sampling (`temperature`,
`top_p`, `top_k`, `min_p`, `repeat_penalty`, `max_tokens`, `seed`, `stop`), and an optional `schema`
of its own (a JSON Schema object, or a string as `--schema` takes it), `files`: paths (globs,
folders) attached before the prompt, relative to the input file's folder (llmchat.turn.attachments), and
`tools` (names, as `-T` takes them, or tools offered on the command line) and `tool_choice`, which
replace the command line's for this item (their names are checked by llmchat.batch.tools). Items
without an id get their 1-based line number. Duplicate ids are errors.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from llmchat.engine.sampling import parse_value
from llmchat.errors import LlmchatError, UsageError

if TYPE_CHECKING:
    from llmchat.edges.bounded_input import Bound
    from llmchat.store.attachment_records import Attachment
    from llmchat.turn.structured import StructuredOutput

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")
INTEGER_KEYS = ("top_k", "max_tokens", "seed")
ROLES = ("system", "user", "assistant")


# --- input ------------------------------------------------------------------------------------------
@dataclass
class BatchItem:
    index: int  # position among the items (0-based), the output order
    line: int  # 1-based line number in the input
    id: Any
    user: str | None = None  # the message to answer
    history: list[dict] = field(default_factory=list)  # earlier user/assistant messages
    system: str | None = None
    has_system: bool = False  # the item chose its system prompt (even "none")
    overrides: dict = field(default_factory=dict)  # validated sampling values
    stop: tuple[str, ...] | None = None
    structured: StructuredOutput | None = None  # the item's own `schema` (None: the run's --schema, if any)
    error: str | None = None  # the line could not be used
    files: list[str] = field(default_factory=list)  # "files": paths relative to the input file's folder
    attachments: tuple[Attachment, ...] = ()  # what `files` attached: images and audio go to the engine
    tools: list[str] | None = None  # "tools": this item's own (None: the command line's)
    tool_choice: str | None = None  # "tool_choice": this item's own (None: the command line's)


def id_key(value: Any) -> str:
    """Ids compare by their JSON text: 7 and "7" are different ids."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def parse_input(data: bytes | Iterable[bytes]) -> list[BatchItem]:
    """Every non-blank line (of the bytes, or each line given, its newline included or not) becomes
    an item (possibly an error item). Duplicate ids are errors."""
    items: list[BatchItem] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n") if isinstance(data, bytes) else data, start=1):
        raw = raw.removesuffix(b"\n").rstrip(b"\r")
        if not raw.strip():
            continue
        item = parse_line(raw, number, len(items))
        key = id_key(item.id)
        if key in first_line:
            previous = first_line[key]
            item = BatchItem(
                index=len(items),
                line=number,
                id=item.id,
                error=f"duplicate id {item.id!r} (first used on line {previous})",
            )
            # The duplicate's record would make its id ambiguous; answer it under its line number instead.
            if id_key(number) not in first_line:
                item.id = number
        first_line.setdefault(id_key(item.id), number)
        items.append(item)
    return items


def parse_line(raw: bytes, number: int, index: int) -> BatchItem:
    item = BatchItem(index=index, line=number, id=number)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        item.error = f"line {number} is not UTF-8 (bad byte at offset {err.start})"
        return item
    if "\x00" in text:
        item.error = f"line {number} contains NUL bytes"
        return item
    if not text.lstrip().startswith("{"):
        item.user = text
        return item
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        item.error = f"line {number}: bad JSON ({err.msg} at column {err.colno})"
        return item
    if not isinstance(obj, dict):
        item.error = f"line {number}: expected a JSON object"
        return item
    try:
        _fill_from_json(item, obj)
    except (UsageError, ValueError, TypeError) as err:
        item.error = f"line {number}: {err}"
    return item


def _fill_from_json(item: BatchItem, obj: dict) -> None:
    if "id" in obj:
        value = obj["id"]
        if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value):
            raise ValueError("id must be a non-empty string or an integer")
        item.id = value
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise ValueError("give either 'prompt' (a string) or 'messages' (a list of {role, content})")
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("'prompt' must be a non-empty string")
        item.user = prompt
    else:
        _fill_messages(item, obj["messages"])
    if "system" in obj:
        if item.has_system:
            raise ValueError("the system prompt is given twice ('system' and a system message); keep one")
        system = obj["system"]
        if system is not None and not isinstance(system, str):
            raise ValueError("'system' must be a string or null")
        item.system, item.has_system = (system or None), True
    for name in SAMPLING_KEYS:
        if name in obj:
            item.overrides[name] = _sampling_value(name, obj[name])
    if "stop" in obj:
        stop = obj["stop"]
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ValueError("'stop' must be a string or a list of strings")
        item.stop = tuple(s for s in stop if s)
    if "files" in obj:
        files = obj["files"]
        if not isinstance(files, list) or not all(isinstance(f, str) and f and f != "-" for f in files):
            raise ValueError("'files' must be a list of paths (relative to the input file's folder)")
        item.files = list(files)
    if "tools" in obj:
        tools = obj["tools"]
        if isinstance(tools, str):
            tools = [tools]
        if not isinstance(tools, list) or not all(isinstance(name, str) and name.strip() for name in tools):
            raise ValueError("'tools' must be a list of tool names (as -T takes them), or [] for none")
        item.tools = list(tools)
    if "tool_choice" in obj:
        choice = obj["tool_choice"]
        if not isinstance(choice, str) or not choice.strip():
            raise ValueError("'tool_choice' must be auto, required, none or a tool's name")
        item.tool_choice = choice
    if "schema" in obj:
        from llmchat.turn.structured import item_structured

        item.structured = item_structured(obj["schema"])


def attach_files(
    items: list[BatchItem],
    base: Path,
    resources: Callable[[str], bytes] | None = None,
    bound: Bound | None = None,
) -> None:
    """Put each item's `files` before its message, wrapped with their paths (`mcp:SERVER/URI`: an
    MCP resource, read by `resources`); a file that cannot be attached (missing, binary, not UTF-8,
    more text than `bound`, a resource its server cannot read) makes that item an error item, and
    the run goes on."""
    from llmchat.turn.attachments import collect, compose

    for item in items:
        if not item.files or item.error or item.user is None:
            continue
        try:
            attached = tuple(collect(item.files, base=base, resources=resources, bound=bound))
            item.user = compose(attached, item.user)  # an image or audio clip: its marker (llmchat.media)
            item.attachments = attached
        except LlmchatError as err:
            item.error = f"line {item.line}: {err}"


def _fill_messages(item: BatchItem, messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content}")
    for position, message in enumerate(messages):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise ValueError(f"messages[{position}] must be {{role: system|user|assistant, content: string}}")
        if message["role"] == "system" and position != 0:
            raise ValueError(f"messages[{position}]: a system message may only come first")
    if messages[0]["role"] == "system":
        item.system, item.has_system = (messages[0]["content"] or None), True
        messages = messages[1:]
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        raise ValueError("the last message must be a non-empty user message")
    for position, message in enumerate(messages[:-1]):
        expected = "user" if position % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise ValueError("messages must alternate user and assistant, starting with user")
    item.history = [{"role": m["role"], "content": m["content"]} for m in messages[:-1]]
    item.user = messages[-1]["content"]


def _sampling_value(name: str, value: Any) -> Any:
    if value is None and name in ("max_tokens", "seed"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a whole number" if name in INTEGER_KEYS else "a number"
        raise ValueError(f"{name} must be {kind}, got {json.dumps(value)}")
    if name in INTEGER_KEYS and isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{name} must be a whole number, got {value:g}")
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite")
    return parse_value(name, repr(value))
