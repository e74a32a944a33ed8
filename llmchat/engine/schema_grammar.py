"""JSON Schema -> GBNF, held exactly: llmchat's own converter (engine.schema_algebra takes the
applicators apart; this module writes each flat alternative as grammar rules).

Why it is llmchat's own and not llama-cpp-python's `SchemaConverter`: that port skips keywords it
cannot express without a word, reads `{}` as "an object", merges `allOf` by its properties only,
and writes property names with a backslash into grammar literals llama.cpp cannot parse. Measured
against the JSON Schema Test Suite (bench/schema_suite.py, docs/structured-output.md) it let
invalid instances through and refused valid ones. Here every keyword is held exactly or refused
(engine.schema_algebra.Refusal); only regular expressions are still translated by the port's
`_visit_pattern`, wrapped for search semantics.

Narrowing, on purpose and documented (the reply is always valid; the model may write less):
- an object schema that names its properties (`properties`, `patternProperties`, `required`)
  takes no other keys unless `additionalProperties` says so (JSON Schema allows any);
- `format` date, time, date-time and uuid are held as assertions (2020-12 makes them annotations);
- a number is written without an exponent where it is bounded or a multiple; keys are written once.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llmchat.engine.schema_algebra import ANNOTATIONS, Refusal, Schemas, both, negate, same_value, type_set
from llmchat.engine.schema_containers import array_rule, object_rule
from llmchat.engine.schema_numbers import bounds, multiple_rule, number_range_rule
from llmchat.engine.schema_numbers import integer_range_rule as int_range
from llmchat.engine.schema_rules import CANONICAL_CHAR, ESCAPES, JSON_CHAR, SPACE, canonical, gbnf_literal, json_text
from llmchat.errors import UsageError

PATTERN_DOT = r'[^"\\\x7F\x00-\x1F] | "\\" ["\\/bft]'  # a regex `.`: no line break, no raw quote
INTEGRAL = '("0" | [1-9] [0-9]{0,15})'
FRACTION = '("." [0-9]{1,16})?'
NUMBER = f'"-"? {INTEGRAL} {FRACTION} ([eE] [-+]? [0-9]{{1,3}})? space'
FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
MAX_INTEGER_DIGITS = 16
MAX_ENUMERATED = 256  # values of a bounded multipleOf written out one by one
MAX_MULTIPLE_STATES = 600  # remainder states of an unbounded multipleOf
MAX_SUBSETS = 64  # optional-property subsets written out for min/maxProperties
_FLAT_KEYS = {
    "type", "enum", "x-except", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
    "pattern", "minLength", "maxLength", "format", "items", "prefixItems", "minItems", "maxItems", "contains",
    "minContains", "maxContains", "uniqueItems", "properties", "required", "additionalProperties",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "x-absent",
}  # fmt: skip
# The names of the shared rules (and the top one): a part's rule never takes one of them.
RESERVED = {"root", "space", "char", "cchar", "string", "number", "integer", "boolean", "null", "array", "object"}
RESERVED |= {"value", "dot", "date", "time"}


class Compiler:
    """The rules of one schema's grammar; `compile()` gives the GBNF text (root rule `root`)."""

    def __init__(self, root: Any):
        self.schemas = Schemas(root)
        self.root = root
        self.rules: dict[str, str] = {"space": SPACE}
        self._memo: dict[str, str | None] = {}
        self._patterns: Any = None
        self._validator: Any = None

    def compile(self) -> str:
        top = self.rule(self.root, "", "root")
        if top is None:
            raise UsageError("no JSON value satisfies this schema; check its constraints")
        if top != "root":
            self.rules["root"] = top
        return "\n".join(f"{name} ::= {rule}" for name, rule in sorted(self.rules.items()))

    # --- naming and sharing rules -----------------------------------------------------------------
    def add(self, name: str, rule: str, *, top: bool = False) -> str:
        base = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        if base in RESERVED and not top:
            base += "-"  # a property named `integer` must not become the integer rule
        key, i = base, 0
        while key in self.rules and self.rules[key] != rule:
            i += 1
            key = f"{base}{i}"
        self.rules[key] = rule
        return key

    @staticmethod
    def prefix(name: str) -> str:
        """The start of a part's rule name: the top level's parts are named by themselves."""
        return "" if name in ("", "root") else f"{name}-"

    def primitive(self, name: str, rule: str) -> str:
        self.rules.setdefault(name, rule)
        return name

    def rule(self, schema: Any, where: str, name: str) -> str | None:
        """A rule name holding exactly `schema`, or None when no value satisfies it."""
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False:
            return None
        if isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
            key = "$ref " + str(schema["$ref"])
            target = self.schemas.resolve(schema["$ref"], where)
            if key not in self._memo:
                slot = self.add(
                    name or "ref", "", top=not where and name == "root"
                )  # named first: a recursive schema refers to itself
                self._memo[key] = slot
                body = self._body(target, where, slot)
                if body is None:
                    self._memo[key] = None
                    del self.rules[slot]
                else:
                    self.rules[slot] = body
            return self._memo[key]
        key = json.dumps(schema, sort_keys=True)
        if key not in self._memo:
            body = self._body(schema, where, name or "root")
            top = not where and name == "root"
            self._memo[key] = None if body is None else self.add(name or "root", body, top=top)
        return self._memo[key]

    def _body(self, schema: Any, where: str, name: str) -> str | None:
        alternatives = []
        for i, flat in enumerate(self.schemas.expand(schema, where)):
            body = self.flat(flat, where, f"{self.prefix(name)}{i}" if i else name)
            if body is not None and body not in alternatives:
                alternatives.append(body)
        return " | ".join(f"( {a} )" if "|" in a and len(alternatives) > 1 else a for a in alternatives) or None

    # --- one flat alternative -------------------------------------------------------------------
    def flat(self, node: dict[str, Any], where: str, name: str) -> str | None:
        for key in node:
            if key not in _FLAT_KEYS:
                raise Refusal(key, where, "cannot be held by the grammar")
        kinds = type_set(node)
        if "enum" in node:
            return self._enumerated(node, where)
        excluded = node.get("x-except", [])
        parts = []
        if "null" in kinds and not any(v is None for v in excluded):
            parts.append(self.primitive("null", '"null" space'))
        if "boolean" in kinds:
            left = [b for b in (True, False) if not any(same_value(b, v) for v in excluded)]
            if left:
                parts.append("(" + " | ".join(gbnf_literal(json_text(b)) for b in left) + ") space")
        if "number" in kinds or "integer" in kinds:
            number = self.number(node, where, name, integer="number" not in kinds)
            if number is not None:
                parts.append(number)
        if "string" in kinds:
            string = self.string(node, where, name)
            if string is not None:
                parts.append(string)
        for kind, build in (("array", self.array), ("object", self.object)):
            if kind in kinds:
                if any(isinstance(v, (list, dict)) for v in excluded):
                    raise Refusal(
                        "not", where, "would exclude one array or object value, which the grammar cannot write"
                    )
                built = build(node, where, name)
                if built is not None:
                    parts.append(built)
        return " | ".join(parts) or None

    def _enumerated(self, node: dict[str, Any], where: str) -> str | None:
        rest = {k: v for k, v in node.items() if k not in ("enum", "x-except")}
        validator = self.validator(rest)
        kept = [
            v
            for v in node["enum"]
            if validator.is_valid(v) and not any(same_value(v, x) for x in node.get("x-except", []))
        ]
        literals = list(dict.fromkeys(self.literal(v) for v in kept))
        return " | ".join(f"( {lit} )" for lit in literals) or None

    def validator(self, schema: dict[str, Any]) -> Any:
        if self._validator is None:
            from jsonschema.validators import Draft202012Validator

            root = self.root if isinstance(self.root, dict) else {}
            self._validator = Draft202012Validator(root)
        return self._validator.evolve(schema=schema)

    def literal(self, value: Any) -> str:
        """Exactly `value`, with the optional spaces the rest of the grammar allows."""
        if isinstance(value, dict):
            pairs = [f'{gbnf_literal(json_text(k))} space ":" space {self.literal(v)}' for k, v in value.items()]
            return '"{" space ' + ' "," space '.join(pairs) + (" " if pairs else "") + '"}" space'
        if isinstance(value, list):
            items = [self.literal(v) for v in value]
            return '"[" space ' + ' "," space '.join(items) + (" " if items else "") + '"]" space'
        return f"{gbnf_literal(json_text(value))} space"

    def any_value(self) -> str:
        char = self.primitive("char", JSON_CHAR)
        string = self.primitive("string", f'"\\"" {char}* "\\"" space')
        self.primitive("number", NUMBER)
        self.primitive("boolean", '("true" | "false") space')
        self.primitive("null", '"null" space')
        self.primitive("array", '"[" space ( value ("," space value)* )? "]" space')
        self.primitive(
            "object", f'"{{" space ( {string} ":" space value ("," space {string} ":" space value)* )? "}}" space'
        )
        return self.primitive("value", "object | array | string | number | boolean | null")

    # --- numbers ----------------------------------------------------------------------------------
    def number(self, node: dict[str, Any], where: str, name: str, integer: bool) -> str | None:
        low, high = bounds(node, where, integer)
        if low is not None and high is not None and (low[0] > high[0] or (low[0] == high[0] and (low[1] or high[1]))):
            return None
        excluded = [v for v in node.get("x-except", []) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        step = node.get("multipleOf")
        if step is not None:
            return multiple_rule(self, step, low, high, integer, excluded, where, name)
        if excluded and not integer:
            raise Refusal("not", where, "would exclude one number from all numbers, which the grammar cannot write")
        if integer:
            lo = None if low is None else int(low[0]) + (1 if low[1] else 0)
            hi = None if high is None else int(high[0]) - (1 if high[1] else 0)
            if lo is not None and hi is not None and lo > hi:
                return None
            if low is None and high is None and not excluded:
                return self.primitive("integer", f'"-"? {INTEGRAL} space')
            pieces, start = [], lo
            for value in sorted({int(v) for v in excluded if float(v).is_integer()}):
                if (lo is None or value >= lo) and (hi is None or value <= hi):
                    if start is None or value - 1 >= start:
                        pieces.append(int_range(start, value - 1))
                    start = value + 1
            if start is None or hi is None or start <= hi:
                pieces.append(int_range(start, hi))
            return f"({' | '.join(pieces)}) space" if pieces else None
        if low is None and high is None:
            return self.primitive("number", NUMBER)
        return number_range_rule(low, high)

    # --- strings ------------------------------------------------------------------------------------
    def string(self, node: dict[str, Any], where: str, name: str) -> str | None:
        excluded = [v for v in node.get("x-except", []) if isinstance(v, str)]
        shaped = [k for k in ("pattern", "format", "minLength", "maxLength") if k in node]
        if excluded:
            if shaped:
                raise Refusal("not", where, f"beside {shaped[0]!r} cannot be held by the grammar")
            return self.string_except(excluded, name)
        if "format" in node:
            if node["format"] not in FORMATS or len(shaped) > 1:
                raise Refusal(
                    "format",
                    where,
                    f"is {node['format']!r}, which the grammar cannot hold (it holds {', '.join(sorted(FORMATS))})",
                )
            return self.format_rule(node["format"])
        if "pattern" in node:
            if "minLength" in node or "maxLength" in node:
                raise Refusal(
                    "pattern", where, "beside minLength/maxLength cannot be held; put the length in the pattern"
                )
            return self.pattern_rule(node["pattern"], where, f"{self.prefix(name)}pattern")
        low, high = int(node.get("minLength", 0)), node.get("maxLength")
        if high is not None and low > high:
            return None
        char = self.primitive("char", JSON_CHAR)
        count = "*" if low == 0 and high is None else f"{{{low},{'' if high is None else int(high)}}}"
        return f'"\\"" {char}{count} "\\"" space'

    def string_except(self, names: list[str], name: str) -> str:
        """A JSON string, one spelling per character, that is none of `names`."""
        self.primitive("cchar", CANONICAL_CHAR)
        trie: dict[str, Any] = {}
        for text in names:
            node = trie
            for ch in text:
                node = node.setdefault(ch, {})
            node[""] = {}
        return f'"\\"" {self._except_node(trie, name)} "\\"" space'

    def _except_node(self, node: dict[str, Any], name: str) -> str:
        children = [ch for ch in node if ch]
        spelled = {ch: canonical(ch) for ch in children}
        raw = "".join("\\" + ch if ch in "]\\^-" else ch for ch in children if spelled[ch] == ch)
        ways = [] if "" in node else ['""']  # the string may end here unless a name does
        ways.append(f'[^"\\\\\\x7F\\x00-\\x1F{raw}] cchar*')
        escapes = [e for e in ESCAPES if e not in spelled.values()]
        ways.append("(" + " | ".join(gbnf_literal(e) for e in escapes) + ") cchar*")
        for ch in children:
            ways.append(f"{gbnf_literal(spelled[ch])} {self._except_node(node[ch], name)}")
        return self.add(f"{self.prefix(name)}except", " | ".join(ways))

    def format_rule(self, fmt: str) -> str:
        hex_ = "[0-9a-fA-F]"
        rules = {
            "date": '[0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1])',
            "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ([zZ] | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
        }
        if fmt.startswith("uuid"):
            body = ' "-" '.join(f"{hex_}{{{n}}}" for n in (8, 4, 4, 4, 12))
        elif fmt == "date-time":
            body = f"{self.primitive('date', rules['date'])} [tT] {self.primitive('time', rules['time'])}"
        else:
            body = self.primitive(fmt, rules[fmt])
        return self.add(f"{fmt}-string", f'"\\"" {body} "\\"" space')

    def pattern_rule(self, pattern: Any, where: str, name: str, *, key: bool = False) -> str:
        """A JSON string matching the regular expression (found anywhere in it, as JSON Schema says)."""
        if not isinstance(pattern, str):
            raise Refusal("pattern", where, "must be a string")
        core = pattern
        start, end = core.startswith("^"), core.endswith("$") and not core.endswith("\\$")
        core = core[1 if start else 0 : len(core) - (1 if end else 0)]
        bare = re.sub(r"\[(?:\\.|[^\]\\])*\]|\\.", "", core)
        if "^" in bare or "$" in bare or "\\" in core or '"' in core:
            raise Refusal(
                "pattern", where, f"{pattern!r} uses anchors inside, escapes or quotes the grammar cannot hold"
            )
        wrapped = "^" + ("" if start else ".*") + (f"({core})" if core else "") + ("" if end else ".*") + "$"
        if self._patterns is None:
            from llmchat.engine.bindings import library_module

            converter = library_module("llama_grammar").SchemaConverter
            self._patterns = converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        try:
            made = str(self._patterns._visit_pattern(wrapped, f"pat-{name}"))
        except (AssertionError, ValueError, KeyError, IndexError) as err:
            raise Refusal("pattern", where, f"{pattern!r} cannot be turned into a grammar ({err})") from None
        for rule_name, rule in self._patterns._rules.items():
            if rule_name == "dot":
                rule = PATTERN_DOT
            self.rules.setdefault(rule_name, rule)
        return made

    # --- arrays and objects live in engine.schema_containers ----------------------------------------
    def array(self, node: dict[str, Any], where: str, name: str) -> str | None:
        return array_rule(self, node, where, name)

    def object(self, node: dict[str, Any], where: str, name: str) -> str | None:
        return object_rule(self, node, where, name)

    def negate(self, schema: Any, where: str) -> Any:
        return negate(schema, where, self.schemas)

    def both(self, a: Any, b: Any) -> Any:
        return both(a, b)
