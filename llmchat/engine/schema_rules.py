"""What the parts of llmchat's JSON Schema converter share: GBNF literals, the JSON character
rules, and the interface (`RuleBook`) through which arrays, objects and numbers add their rules to
the one grammar engine.schema_grammar builds."""

from __future__ import annotations

import json
from typing import Any, Protocol

SPACE = '" "?'
# A character of a JSON string; an escaped surrogate pair is one character (as JSON Schema counts).
JSON_CHAR = (
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}'
    r' | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}))'
)
# One spelling per character (raw where JSON allows it): a key that must differ from the named
# ones cannot be written as an escape of one of them.
CANONICAL_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\bfnrt] | "u00" ("0" [0-7bef] | "1" [0-9a-f] | "7f"))'


def gbnf_literal(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return f'"{out}"'


def json_text(value: Any) -> str:
    """A JSON value's text; an integral float as an integer (JSON has one number type)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        value = int(value)
    return json.dumps(value, ensure_ascii=False)


def canonical(ch: str) -> str:
    """The one spelling of a character in CANONICAL_CHAR."""
    return "\\u007f" if ch == "\x7f" else json.dumps(ch)[1:-1]


ESCAPES = ['\\"', "\\\\", "\\b", "\\f", "\\n", "\\r", "\\t"] + [
    canonical(chr(c)) for c in [*range(0x20), 0x7F] if c not in (8, 9, 10, 12, 13)
]


class RuleBook(Protocol):
    """The grammar being built (engine.schema_grammar.Compiler), as its parts use it."""

    rules: dict[str, str]

    def add(self, name: str, rule: str) -> str: ...
    def prefix(self, name: str) -> str: ...
    def rule(self, schema: Any, where: str, name: str) -> str | None: ...
    def both(self, a: Any, b: Any) -> Any: ...
    def negate(self, schema: Any, where: str) -> Any: ...
    def validator(self, schema: Any) -> Any: ...
    def pattern_rule(self, pattern: Any, where: str, name: str) -> str: ...
    def string_except(self, names: list[str], name: str) -> str: ...
    def any_value(self) -> str: ...
