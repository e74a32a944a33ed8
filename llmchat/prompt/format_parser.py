"""Tool calls read out of a reply, and written back, by a derived `CallLayout`.

One reader and one writer for every layout the analysis finds, instead of one parser per family.
The reader is strict about the call (a name, arguments that decode) and lenient about what the
template's text puts around it: whitespace may differ, a call id may be left out, the end of the
section may be missing where generation stopped. What comes before the first call is the content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from llmchat.prompt.layout import ID_SLOT, INDEX_SLOT, KEY_SLOT, CallLayout
from llmchat.prompt.literals import literal_at
from llmchat.prompt.xml_arguments import nested_value

_DECODER = json.JSONDecoder()
_NAME = r"[^\s<>{}()\[\]\"',:=|]+"
_KEY = r"[^\s<>{}()\[\]\"',:=|/][^\s<>{}()\[\]\"',:=|]*"
_ID_TEXT = r"[A-Za-z0-9_\-.:]*"


@dataclass(frozen=True)
class FoundCall:
    name: str
    arguments: Any
    id: str | None = None


@dataclass(frozen=True)
class FoundReply:
    content: str
    calls: tuple[FoundCall, ...]


def _pattern(text: str, exact_tail: bool = False) -> str:
    """A regex for a fixed text of the layout: any run of whitespace may be any run (or none), a
    call id may be left out with the marker that introduces it, an index is any number.
    `exact_tail`: whitespace at the end is the template's own, or none (what follows is a value
    whose own leading whitespace counts)."""
    if exact_tail and text != text.rstrip():
        tail = text[len(text.rstrip()) :]
        return _pattern(text.rstrip()) + f"(?:{re.escape(tail)})?"
    out: list[str] = [r"\s*"]
    for part in re.split(rf"(\s+|{ID_SLOT}|{INDEX_SLOT})", text):
        if not part:
            continue
        if part.isspace():
            out.append(r"\s*")
        elif part == INDEX_SLOT:
            out.append(r"\d+")
        elif part == ID_SLOT:
            before = out.pop() if len(out) > 1 and out[-1] != r"\s*" else ""
            out.append(
                f"(?:{before}(?P<id>{_ID_TEXT}))?" if "(?P<id>" not in "".join(out) else f"(?:{before}{_ID_TEXT})?"
            )
        else:
            out.append(re.escape(part))
    return "".join(out)


@dataclass(frozen=True)
class _Compiled:
    opener: re.Pattern[str]
    bare_opener: re.Pattern[str] | None  # the call without its section or outer wrapper
    next_call: re.Pattern[str]
    args_start: re.Pattern[str]
    call_end: re.Pattern[str]
    section_end: re.Pattern[str]
    key_prefix: re.Pattern[str]
    string_prefix: re.Pattern[str]
    value_prefix: re.Pattern[str]
    value_suffix: re.Pattern[str]
    arg_separator: re.Pattern[str]


def _inner_marker(text: str) -> str:
    """The last marker-like piece of an opener (`<function=` of `<tool_call>\\n<function=`)."""
    pieces = [p for p in re.split(r"\s+", text.replace(ID_SLOT, " ").replace(INDEX_SLOT, " ")) if p]
    return pieces[-1] if pieces else ""


@lru_cache(maxsize=64)
def _compile(layout: CallLayout) -> _Compiled:
    start = layout.section_start
    if layout.list_wrapped and start.endswith("["):
        start = start[:-1]
    opener = _pattern(start + (layout.call_start if not layout.list_wrapped else ""))
    inner = _inner_marker(layout.call_start)
    bare = None
    if inner and inner != (start + layout.call_start).strip() and len(inner) >= 3 and not inner.isalnum():
        bare = re.compile(_pattern(inner))

    def c(text: str) -> re.Pattern[str]:
        return re.compile(_pattern(text))

    return _Compiled(
        opener=re.compile(opener) if (start + layout.call_start).strip() else re.compile(r"\s*(?=[\[{])"),
        bare_opener=bare,
        # Between two calls: the first one's end (a model may leave it out), the separator, the
        # next one's start, with any whitespace between the pieces.
        next_call=re.compile(
            f"(?:{_pattern(layout.call_end)})?" + _pattern(layout.separator) + _pattern(layout.call_start)
        ),
        args_start=c(layout.args_start),
        call_end=c(layout.call_end),
        section_end=c(
            layout.section_end[1:] if layout.list_wrapped and layout.section_end.startswith("]") else layout.section_end
        ),
        key_prefix=c(layout.key_prefix),
        string_prefix=re.compile(_pattern(layout.string_prefix, exact_tail=True)),
        value_prefix=c(layout.value_prefix),
        value_suffix=c(layout.value_suffix),
        arg_separator=c(layout.arg_separator),
    )


def find_opener(layout: CallLayout, text: str) -> tuple[int, int] | None:
    """Where the first call opens in text: (start, end of the opener)."""
    compiled = _compile(layout)
    if not (layout.section_start + layout.call_start).strip():
        match = re.match(r"\s*(?=[\[{])", text)
        return (match.start(), match.end()) if match else None
    match = compiled.opener.search(text)
    bare = compiled.bare_opener.search(text) if compiled.bare_opener is not None else None
    if bare is not None and (match is None or bare.start() < match.start()):
        match = bare  # a call written without its outer wrapper, before any wrapped one
    if match is None:
        return None
    # The opener's own leading \s* may have matched whitespace that belongs to the content.
    start = match.start() + (len(match.group(0)) - len(match.group(0).lstrip()))
    return start, match.end()


def parse(layout: CallLayout, text: str, schemas: Mapping[str, Any] | None = None) -> FoundReply:
    """The content before the first call, and the calls."""
    at = find_opener(layout, text)
    if at is None:
        return FoundReply(text, ())
    try:
        calls, end = (
            _json_calls(layout, text, at[1]) if layout.name_in_json else _text_calls(layout, text, at[1], schemas)
        )
    except ValueError:
        calls, end = [], len(text)
    if not calls:
        return FoundReply(text, ())
    content = text[: at[0]].rstrip()
    if layout.preamble and content.endswith(layout.preamble):
        content = content[: -len(layout.preamble)]
    after = _after_calls(layout, text, end)
    return FoundReply(f"{content}\n{after}".strip() if after else content, tuple(calls))


def _after_calls(layout: CallLayout, text: str, pos: int) -> str:
    """Text the model wrote after its calls (past the call's and the section's ends): part of
    the content, as llama.cpp reads it."""
    compiled = _compile(layout)
    for closing in (compiled.call_end, compiled.section_end):
        found = closing.match(text, pos)
        if found is not None:
            pos = found.end()
    after = text[pos:].strip()
    # Closing markup alone (the section's and the turn's ends, however the template spells
    # them) is not text the model meant for the user.
    return "" if _ONLY_MARKUP.fullmatch(after) else after


_ONLY_MARKUP = re.compile(r"(?:\s*(?:<[^<>]*>(?:[a-z]+<[^<>]*>)?|\[/?[A-Z_]+\]))*\s*")


# --- name in a JSON object ------------------------------------------------------------------------
def _json_calls(layout: CallLayout, text: str, pos: int) -> tuple[list[FoundCall], int]:
    compiled = _compile(layout)
    calls: list[FoundCall] = []
    while True:
        pos = _skip_space(text, pos)
        value, end = _DECODER.raw_decode(text, pos)
        items = value if isinstance(value, list) else [value]
        for item in items:
            call = _call_from_object(layout, item)
            if call is None:
                if calls:
                    return calls, pos
                raise ValueError("not a call")
            calls.append(call)
        pos = end
        if layout.list_wrapped:
            return calls, pos
        following = compiled.next_call.match(text, pos)
        if following is not None and (layout.call_start + layout.separator).strip():
            pos = following.end()
        elif not text[_skip_space(text, pos) : _skip_space(text, pos) + 1] == "{":
            return calls, pos  # several calls may also follow each other with nothing but space between


def _call_from_object(layout: CallLayout, item: Any) -> FoundCall | None:
    if not isinstance(item, dict):
        return None
    inner = item.get(layout.function_key) if layout.function_key else item
    if not isinstance(inner, dict):
        return None
    call_id = item.get(layout.id_key) if layout.id_key else None
    if layout.name_is_key:
        if len(inner) != 1:
            return None
        name, arguments = next(iter(inner.items()))
    else:
        name = inner.get(layout.name_key)
        arguments = inner.get(layout.arguments_key, {})
        if not isinstance(name, str):
            return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    return FoundCall(name, arguments, call_id if isinstance(call_id, str) else None)


# --- name in the text -----------------------------------------------------------------------------
def _text_calls(
    layout: CallLayout, text: str, pos: int, schemas: Mapping[str, Any] | None
) -> tuple[list[FoundCall], int]:
    compiled = _compile(layout)
    calls: list[FoundCall] = []
    while True:
        name_match = re.compile(r"\s*(" + _NAME + ")").match(text, pos)
        if name_match is None:
            raise ValueError("no name")
        name = name_match.group(1)
        start = compiled.args_start.match(text, name_match.end())
        if start is None:
            raise ValueError("no arguments")
        call_id = start.groupdict().get("id")
        pos = start.end()
        properties = ((schemas or {}).get(name) or {}).get("properties", {}) if schemas else {}
        if layout.args == "json":
            arguments, pos = _json_arguments(text, pos)
        else:
            arguments, pos = _tagged_arguments(layout, compiled, text, pos, properties)
        calls.append(FoundCall(name, arguments, call_id or None))
        following = compiled.next_call.match(text, pos)
        if following is not None and following.end() > pos and (layout.separator + layout.call_start).strip():
            pos = following.end()
            continue
        return calls, pos


def _json_arguments(text: str, pos: int) -> tuple[Any, int]:
    pos = _skip_space(text, pos)
    value, end = _DECODER.raw_decode(text, pos)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, dict):
        raise ValueError("arguments are not an object")
    return value, end


def _tagged_arguments(
    layout: CallLayout, compiled: _Compiled, text: str, pos: int, properties: Mapping[str, Any]
) -> tuple[dict[str, Any], int]:
    arguments: dict[str, Any] = {}
    keyed = bool(layout.key_prefix.strip())  # each argument opens with a marker of its own
    while True:
        if arguments:
            separator = compiled.arg_separator.match(text, pos) if layout.arg_separator.strip() else None
            if separator is not None:
                pos = separator.end()
            elif not keyed:
                return arguments, pos
        if layout.call_end.strip() and compiled.call_end.match(text, pos):
            return arguments, pos
        prefix = compiled.key_prefix.match(text, pos)
        if prefix is None:
            return arguments, pos
        key = _KEY_AT.match(text, prefix.end())
        if key is None:
            return arguments, pos
        if not keyed and not (
            compiled.string_prefix.match(text, key.end()) or compiled.value_prefix.match(text, key.end())
        ):
            return arguments, pos
        keyed_layout = with_key(layout, key.group(1))
        value, pos = _tagged_value(
            keyed_layout, _compile(keyed_layout), text, key.end(), properties.get(key.group(1), {})
        )
        arguments[key.group(1)] = value


_KEY_AT = re.compile(r"\s*(" + _KEY + ")")


def with_key(layout: CallLayout, key: str) -> CallLayout:
    """The layout for one argument: its name filled in where the template repeats it."""
    if KEY_SLOT not in layout.string_suffix + layout.value_suffix + layout.arg_separator:
        return layout
    from dataclasses import replace

    return replace(
        layout,
        string_suffix=layout.string_suffix.replace(KEY_SLOT, key),
        value_suffix=layout.value_suffix.replace(KEY_SLOT, key),
        arg_separator=layout.arg_separator.replace(KEY_SLOT, key),
    )


def _tagged_value(layout: CallLayout, compiled: _Compiled, text: str, pos: int, schema: Any) -> tuple[Any, int]:
    """One value and the position after its closing text. A string is raw text up to its
    suffix; where the template marks strings and other values alike, the tool's schema says
    which it is (a value that is not valid JSON is a string all the same)."""
    wants_string = isinstance(schema, dict) and schema.get("type") == "string"
    distinct = layout.string_prefix != layout.value_prefix
    quoted = distinct and layout.string_prefix.startswith(layout.value_prefix)
    if not layout.string_is_json and not quoted:
        opened = compiled.string_prefix.match(text, pos) if layout.string_prefix else None
        if opened is not None or not distinct:
            start = opened.end() if opened is not None else pos
            raw, end = _raw_until(text, start, layout.string_suffix, layout)
            closed = re.compile(_pattern(layout.string_suffix)).match(text, end)
            value = raw if (distinct or wants_string) else _maybe_json(raw)
            if isinstance(value, str) and not wants_string:
                nested = nested_value(raw, schema, layout.preamble)  # MiniMax M3's nested elements
                value = value if nested is None else nested
            return value, closed.end() if closed is not None else end
    opened = compiled.value_prefix.match(text, pos)
    start = _skip_space(text, opened.end() if opened is not None else pos)
    quote = (
        layout.string_prefix[len(layout.value_prefix) :] if layout.string_prefix.startswith(layout.value_prefix) else ""
    )
    scanned = literal_at(text, start, quote, layout.string_suffix if quote else "")
    if scanned is not None:
        value, end = scanned
    else:
        value, end = _raw_until(text, start, layout.value_suffix or layout.arg_separator or layout.call_end, layout)
        value = _maybe_json(value)
    if wants_string and not isinstance(value, str):
        value = text[start:end]
    closed = compiled.value_suffix.match(text, end)
    return value, closed.end() if closed is not None else end


_CDATA = re.compile(r"<!\[CDATA\[(.*?)\]\]>", re.DOTALL)


def _raw_until(text: str, start: int, suffix: str, layout: CallLayout) -> tuple[str, int]:
    """The raw value from start to the suffix (exact, else without its whitespace), as the
    template wrote it: its own leading and trailing newline are not part of the value. A value
    in a CDATA section is its content, whatever markup it holds."""
    cdata = _CDATA.match(text, start)
    if cdata is not None:
        return cdata.group(1), cdata.end()
    for candidate in (suffix, suffix.strip()):
        if candidate:
            at = text.find(candidate, start)
            if at >= 0:
                raw = text[start:at]
                if suffix.startswith("\n") and candidate == suffix.strip():
                    raw = raw.rstrip("\n")
                return _trim_template_newlines(raw, layout), at
    return _trim_template_newlines(text[start:], layout), len(text)


def _trim_template_newlines(raw: str, layout: CallLayout) -> str:
    if layout.string_prefix.endswith("\n") and raw.startswith("\n"):
        raw = raw[1:]
    return raw


def _maybe_json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


# --- writing a call the template's way ------------------------------------------------------------
def _fill(text: str, index: int) -> str:
    return text.replace(INDEX_SLOT, str(index)).replace(ID_SLOT, f"call{index:05d}")


def call_text(layout: CallLayout, calls: list[tuple[str, Any]]) -> str:
    """Calls [(name, arguments)] written as the template writes them."""
    pieces = []
    for index, (name, arguments) in enumerate(calls):
        pieces.append(_one_call(layout, name, arguments, index))
    separator = _fill(layout.separator, 0)
    if layout.list_wrapped:
        return _fill(layout.section_start, 0) + separator.join(pieces) + _fill(layout.section_end, 0)
    body = (_fill(layout.call_end, 0) + separator).join(pieces)
    return _fill(layout.section_start, 0) + body + _fill(layout.call_end, 0) + _fill(layout.section_end, 0)


def _dumps(layout: CallLayout, value: Any) -> str:
    item, key = layout.json_separators
    return json.dumps(value, ensure_ascii=False, separators=(item, key))


def _one_call(layout: CallLayout, name: str, arguments: Any, index: int) -> str:
    if layout.name_in_json:
        inner: dict[str, Any] = {}
        if layout.name_is_key:
            inner = {name: arguments}
        else:
            for key in layout.key_order or (layout.name_key, layout.arguments_key):
                if key == layout.name_key:
                    inner[key] = name
                elif key == layout.arguments_key:
                    inner[key] = _dumps(layout, arguments) if layout.arguments_as_text else arguments
                elif key == layout.id_key:
                    inner[key] = f"call{index:05d}"
        return _fill(layout.call_start, index) + _dumps(layout, inner)
    head = _fill(layout.call_start, index) + name + _fill(layout.args_start, index)
    if layout.args == "json":
        return head + _dumps(layout, arguments)
    parts = []
    for key, value in (arguments or {}).items():
        one = with_key(layout, key)
        if isinstance(value, str):
            written = _dumps(one, value) if one.string_is_json else value
            parts.append(one.key_prefix + key + one.string_prefix + written + one.string_suffix)
        else:
            parts.append(one.key_prefix + key + one.value_prefix + _dumps(one, value) + one.value_suffix)
    return head + layout.arg_separator.join(parts)
