"""Grammars that hold a reply to a shape: JSON Schema -> GBNF, and `--grammar` files.

Why each part is the way it is:
- The converter is llama.cpp's own, as llama-cpp-python ships it (`llama_cpp.llama_grammar`), but
  that converter skips keywords it cannot express without a word, and llama-cpp-python falls back
  to "any JSON" when conversion fails. Here every keyword is checked first: one the grammar
  cannot enforce is refused with a usage error naming it and where it is, never dropped.
  Two gaps of the shipped converter are filled: integer bounds (`minimum`, `maximum`, the
  exclusive ones) become digit-range rules, and a JSON string may not hold raw control
  characters (the shipped `char` rule allowed a raw newline, which no JSON parser accepts).
- The converter treats a missing `additionalProperties` as false. That only narrows what the model
  may write; what it writes still validates against the schema as the user gave it.

Holding the sampled reply to the grammar is llmchat.engine.grammar_gate's job, and putting it into
a sampler chain llmchat.engine.sampler's; this module loads no llama.cpp sampler.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmchat.bounded_input import ANY_TEXT, read_file
from llmchat.errors import UsageError

MAX_INTEGER_DIGITS = 16  # what the converter's own integer rule allows
_TYPES = {"string", "number", "integer", "boolean", "null", "object", "array"}
_FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
_ANNOTATIONS = {
    "title",
    "description",
    "$schema",
    "$id",
    "$comment",
    "default",
    "examples",
    "readOnly",
    "writeOnly",
    "deprecated",
    "$defs",
    "definitions",
}
_ENFORCED = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "pattern",
    "format",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
}
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# A JSON string character: anything but a quote, a backslash or a control character, or an escape.
_JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar (root rule `root`) and where it came from, for messages."""

    text: str
    source: str


# --- JSON Schema -> GBNF ------------------------------------------------------------------------------
def schema_to_gbnf(schema: dict[str, Any]) -> str:
    """The GBNF that holds a reply to `schema`; UsageError for anything the grammar cannot enforce."""
    check_enforceable(schema)
    from llmchat.engine.bindings import library_module

    SchemaConverter: Any = library_module("llama_grammar").SchemaConverter

    class Converter(SchemaConverter):
        def visit(self, node: dict[str, Any], name: str) -> str:
            if node.get("type") == "integer" and any(key in node for key in _BOUNDS):
                low, high = integer_bounds(node)
                rule_name = name or "root"
                if rule_name in ("integer", "number", "integral-part"):
                    rule_name += "-"
                return str(self._add_rule(rule_name, f"({integer_range_rule(low, high)}) space"))
            return str(super().visit(node, name))

        def _add_primitive(self, name: str, rule: Any) -> str:
            if name == "char":
                rule = type(rule)(_JSON_CHAR, [])
            return str(super()._add_primitive(name, rule))

    converter = Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    try:
        resolved = converter.resolve_refs(json.loads(json.dumps(schema)), "input")
        converter.visit(resolved, "")
        return str(converter.format_grammar())
    except (AssertionError, ValueError, KeyError, TypeError, RecursionError, NotImplementedError) as err:
        raise UsageError(f"llama.cpp's converter cannot turn this schema into a grammar: {err}; simplify it") from None


def check_enforceable(schema: Any, where: str = "") -> None:
    """Refuse every keyword the grammar would skip, naming it and its place (a JSON pointer)."""
    _held(schema, where, None)


def held_schema(schema: Any) -> tuple[dict[str, Any], list[str]]:
    """A copy of `schema` without the keywords the grammar cannot hold, and what was dropped
    ("minimum at /properties/count"). For a tool's parameters: its arguments are still validated
    against the whole schema after sampling, so a dropped keyword widens the grammar, never the check."""
    dropped: list[str] = []
    return _held(schema, "", dropped), dropped


def _held(schema: Any, where: str, dropped: list[str] | None) -> dict[str, Any]:
    """The schema as the grammar holds it. `dropped` None: the first keyword it cannot hold is a
    UsageError; else each such keyword is left out of the copy and named in `dropped`."""
    at = where or "the top level"
    if not isinstance(schema, dict):
        if dropped is None:
            raise UsageError(f"the schema at {at} must be an object, got {json.dumps(schema)}; use {{}} for any value")
        if schema is not True:
            dropped.append(f"the schema {json.dumps(schema)} at {where or '/'}")
        return {}
    node = dict(schema)

    def refuse(message: str, *keys: str) -> None:
        if dropped is None:
            raise UsageError(message)
        for key in keys:
            if key in node:
                del node[key]
                dropped.append(f"{key} at {where or '/'}")

    for key in list(node):
        if key not in _ENFORCED and key not in _ANNOTATIONS:
            refuse(f"the JSON Schema keyword {key!r} at {at} cannot be enforced by llama.cpp's grammar; remove it", key)
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    for name in kinds:
        if name not in _TYPES:
            refuse(f"unknown type {name!r} at {at}; use one of {', '.join(sorted(_TYPES))}", "type")
    if "properties" in node and ("anyOf" in node or "oneOf" in node):
        refuse(
            f"at {at}, 'properties' beside 'anyOf'/'oneOf' is not supported by the grammar; nest them", "anyOf", "oneOf"
        )
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        refuse(
            f"at {at}, 'pattern' with 'minLength'/'maxLength' is not supported; put the length in the pattern",
            "minLength",
            "maxLength",
        )
    if "format" in node and node["format"] not in _FORMATS:
        refuse(
            f"format {node['format']!r} at {at} cannot be enforced by the grammar; use one of {', '.join(sorted(_FORMATS))}",
            "format",
        )
    if "pattern" in node:
        pattern = node["pattern"]
        if not (isinstance(pattern, str) and pattern.startswith("^") and pattern.endswith("$")):
            refuse(f"the pattern at {at} must be anchored, ^...$ (the grammar matches the whole string)", "pattern")
    bounds = [key for key in _BOUNDS if key in node]
    if bounds:
        if kinds != ["integer"]:
            refuse(
                f"{bounds[0]} at {at}: the grammar can bound integers only; use type integer, or drop the bound",
                *bounds,
            )
        else:
            try:
                integer_bounds(node, at)
            except UsageError as err:
                refuse(str(err), *bounds)
    properties = node.get("properties", {})
    if not isinstance(properties, dict):
        refuse(f"'properties' at {at} must be an object", "properties")
        properties = {}
    required = node.get("required", [])
    for name in required if isinstance(required, list) else []:
        if name not in properties:
            if dropped is None:
                raise UsageError(f"required property {name!r} at {at} has no schema under 'properties'; add one")
            properties = {**properties, name: {}}  # any value: the grammar may write it, validation checks it
    if properties or "properties" in node:
        node["properties"] = {
            name: _held(sub, f"{where}/properties/{name}", dropped) for name, sub in properties.items()
        }
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        node["additionalProperties"] = _held(extra, f"{where}/additionalProperties", dropped)
    items = node.get("items")
    if isinstance(items, list):
        node["items"] = [_held(sub, f"{where}/items/{i}", dropped) for i, sub in enumerate(items)]
    elif items is not None:
        node["items"] = _held(items, f"{where}/items", dropped)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in node:
            node[key] = [_held(sub, f"{where}/{key}/{i}", dropped) for i, sub in enumerate(node[key])]
    for key in ("$defs", "definitions"):
        if key in node:
            node[key] = {name: _held(sub, f"{where}/{key}/{name}", dropped) for name, sub in node[key].items()}
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
        refuse(f"$ref {ref!r} at {at}: only references inside the schema (#/...) are supported", "$ref")
    return node


def integer_bounds(schema: dict[str, Any], at: str = "the schema") -> tuple[int | None, int | None]:
    """The inclusive integer range the bounds keywords allow (None: unbounded on that side)."""
    values: dict[str, int] = {}
    for key in _BOUNDS:
        if key not in schema:
            continue
        value = schema[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise UsageError(f"{key} at {at} must be a number (draft-4 boolean exclusive bounds are not supported)")
        values[key] = math.ceil(value) if "inimum" in key else math.floor(value)
        if key == "exclusiveMinimum":
            values[key] = math.floor(value) + 1
        elif key == "exclusiveMaximum":
            values[key] = math.ceil(value) - 1
    lows = [values[k] for k in ("minimum", "exclusiveMinimum") if k in values]
    highs = [values[k] for k in ("maximum", "exclusiveMaximum") if k in values]
    low, high = (max(lows) if lows else None), (min(highs) if highs else None)
    if low is not None and high is not None and low > high:
        raise UsageError(f"the bounds at {at} allow no integer ({low} > {high})")
    return low, high


def integer_range_rule(low: int | None, high: int | None) -> str:
    """A GBNF expression for the integers in [low, high], written without leading zeros.

    An open side is bounded by what a 16-digit integer can hold, as the converter's own rule is."""
    limit = 10**MAX_INTEGER_DIGITS - 1
    low = -limit if low is None else low
    high = limit if high is None else high
    parts = []
    if low < 0:
        negatives = _digit_ranges(max(1, -high) if high < 0 else 1, -low)
        parts.append('"-" (' + " | ".join(negatives) + ")")
    if high >= 0:
        parts.extend(_digit_ranges(max(low, 0), high))
    return " | ".join(parts)


def _digit_ranges(low: int, high: int) -> list[str]:
    """Split [low, high] (non-negative) into runs that a prefix, one digit range and k free digits spell."""
    rules = []
    if low == 0:
        rules.append('"0"')
        low = 1
    while low <= high:
        step = 1
        while low % (step * 10) == 0 and low + step * 10 - 1 <= high:
            step *= 10
        count = min((high - low + 1) // step, 10 - (low // step) % 10)
        first = (low // step) % 10
        prefix = str(low // (step * 10)) if low >= step * 10 else ""
        digits = f"[{first}-{first + count - 1}]" if count > 1 else f'"{first}"'
        free = " [0-9]" * len(str(step)[1:])
        rules.append((f'"{prefix}" ' if prefix else "") + digits + free)
        low += count * step
    return rules


# --- GBNF files ---------------------------------------------------------------------------------------
def load_gbnf(path: Path) -> Grammar:
    """A `--grammar FILE`; its syntax is checked against the model's vocabulary once it is loaded
    (llmchat.engine.grammar_gate.check_grammar)."""
    try:
        text = read_file(path.expanduser(), f"--grammar {path}", ANY_TEXT, advice="pass a .gbnf file").decode("utf-8")
    except FileNotFoundError:
        raise UsageError(f"--grammar {path}: no such file; pass a .gbnf file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UsageError(f"--grammar {path}: cannot read it as UTF-8 text ({err})") from None
    if not text.strip():
        raise UsageError(f"--grammar {path} is empty; write a GBNF grammar with a root rule")
    return Grammar(text, f"--grammar {path}")
