"""An argument written as nested XML elements, typed by the tool's schema.

MiniMax M3 writes an object argument as its fields' elements (`<number><real>1.5</real>…`) and an
array as `<item>` elements, each opened after the template's own separator token. The call parser
finds such a value's raw text; this reads it as the object or array the schema asks for, with
each leaf typed as the schema types it (a string stays text, a number is read as JSON).
"""

from __future__ import annotations

import json
import re
from typing import Any

_OPEN = re.compile(r"\s*<([A-Za-z_][\w.-]*)>")


def nested_value(raw: str, schema: Any, separator: str = "") -> Any | None:
    """The value of `raw` read as nested elements, or None where it is not written that way (or
    the schema asks for neither an object nor an array, or allows a string: then, as llama.cpp
    reads it, the elements are the string's text)."""
    if _allows(schema, "string") or not (_allows(schema, "object") or _allows(schema, "array")):
        return None
    text = raw.replace(separator, "") if separator.strip() else raw
    elements = _elements(text.strip())
    if not elements:
        return None
    return _typed_elements(elements, schema)


def _elements(text: str) -> list[tuple[str, str]] | None:
    """[(name, content)] of a text that is only a sequence of elements, else None."""
    found: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        opened = _OPEN.match(text, pos)
        if opened is None:
            return None if text[pos:].strip() else found
        name = opened.group(1)
        end = _matching_close(text, opened.end(), name)
        if end is None:
            return None
        found.append((name, text[opened.end() : end]))
        pos = end + len(f"</{name}>")
    return found


def _matching_close(text: str, pos: int, name: str) -> int | None:
    """Where the element opened before `pos` closes, counting same-named elements inside it."""
    depth = 1
    tags = re.compile(rf"<(/?){re.escape(name)}>")
    for tag in tags.finditer(text, pos):
        depth += -1 if tag.group(1) else 1
        if depth == 0:
            return tag.start()
    return None


def _typed_elements(elements: list[tuple[str, str]], schema: Any) -> Any:
    if _allows(schema, "array") and all(name == "item" for name, _ in elements):
        items = _option(schema, "array").get("items", {})
        return [_typed(content, items) for _, content in elements]
    properties = _option(schema, "object").get("properties", {})
    return {name: _typed(content, properties.get(name, {})) for name, content in elements}


def _typed(content: str, schema: Any) -> Any:
    inner = _elements(content.strip()) if content.strip().startswith("<") else None
    if _allows(schema, "string"):
        return content
    if inner and (_allows(schema, "object") or _allows(schema, "array") or not schema):
        return _typed_elements(inner, schema)
    if not content.strip() and (_allows(schema, "array") or _allows(schema, "object")):
        return [] if _allows(schema, "array") else {}  # an empty element: no items, no fields
    try:
        return json.loads(content)
    except json.JSONDecodeError:
        return content


def _options(schema: Any) -> list[dict[str, Any]]:
    if not isinstance(schema, dict):
        return []
    union = schema.get("anyOf") or schema.get("oneOf")
    return [option for option in union if isinstance(option, dict)] if isinstance(union, list) else [schema]


def _types(schema: Any) -> set[str]:
    found: set[str] = set()
    for option in _options(schema):
        kind = option.get("type")
        found.update(kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else [])
    return found


def _allows(schema: Any, kind: str) -> bool:
    return kind in _types(schema)


def _option(schema: Any, kind: str) -> dict[str, Any]:
    for option in _options(schema):
        declared = option.get("type")
        if declared == kind or (isinstance(declared, list) and kind in declared):
            return option
    return {}
