"""JSON Schema as alternatives of plain conjunctions: what `--schema` compiles to a grammar.

A grammar can write a union but not an intersection or a complement, so before a schema becomes
GBNF (engine.schema_grammar) every applicator is taken apart here into a list of *flat* schemas,
one per alternative (disjunctive normal form), none holding `allOf`, `anyOf`, `oneOf`, `not`,
`if`, `dependentSchemas` or `dependentRequired`:
- `allOf` merges its parts keyword by keyword (`merge`): types intersect, bounds tighten,
  `required` unites, properties merge (a name one side leaves to `additionalProperties` or a
  pattern gets that schema too);
- `anyOf` is the union of its branches, each merged with the rest of the schema;
- `not S`, `if`/`then`/`else`, `oneOf` and `maxContains` need a complement: `negate` writes
  one by De Morgan, keyword by keyword, where each keyword's complement is itself a schema
  (a type's is the other types, `minimum`'s an `exclusiveMaximum` or another type, `required`'s
  a `false` property...); `oneOf` is each branch with the complements of the others;
- `dependentSchemas {k: S}` is "k absent, or k present and S", `dependentRequired` likewise.
Two keywords of llmchat's own stand for what complements need: `x-except` (none of these
values) and `x-absent` (none of these property names); the user's schema never holds them.
A keyword that cannot be taken apart or merged exactly is refused (`Refusal`, naming it and
where it is), never dropped: the grammar holds exactly what the schema says, or nothing.
Nothing here loads llama.cpp.
"""

from __future__ import annotations

import json
import math
from typing import Any

from llmchat.errors import UsageError

TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")
ANNOTATIONS = {
    "title", "description", "$schema", "$id", "$comment", "default", "examples", "readOnly",
    "writeOnly", "deprecated", "$defs", "definitions", "$anchor", "$dynamicAnchor", "$vocabulary",
    "contentEncoding", "contentMediaType", "contentSchema",
}  # fmt: skip
APPLICATORS = ("allOf", "anyOf", "oneOf", "not", "if", "dependentSchemas", "dependentRequired")
MAX_ALTERNATIVES = 64  # more and the grammar (and its compile) grows past use
OWN_KEYWORDS = ("x-except", "x-absent")
# Dialects whose keywords mean here what they mean to the validator; another one's may not.
DIALECTS = {
    f"{scheme}://json-schema.org/{draft}{end}"
    for scheme in ("http", "https")
    for draft in ("draft/2020-12/schema", "draft/2019-09/schema", "draft-07/schema", "draft-06/schema")
    for end in ("", "#")
}


class Refusal(UsageError):
    """A keyword the grammar cannot hold exactly: its name and where it is, for one clear line."""

    def __init__(self, keyword: str, where: str, why: str):
        at = where or "the top level"
        super().__init__(f"the JSON Schema keyword {keyword!r} at {at} {why}; remove or simplify it")
        self.keyword = keyword
        self.where = where


class Schemas:
    """One root schema: its `$ref`s resolved, its parts expanded into flat alternatives."""

    def __init__(self, root: Any):
        self.root = root
        _check_own_keywords(root, "")
        dialect = root.get("$schema") if isinstance(root, dict) else None
        if dialect is not None and dialect not in DIALECTS:
            raise Refusal("$schema", "", f"names the dialect {dialect!r}, whose keywords llmchat does not know")

    def resolve(self, ref: Any, where: str) -> Any:
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise Refusal("$ref", where, f"is {json.dumps(ref)}: only references inside the schema (#/...) are held")
        node = self.root
        for part in ref[2:].split("/") if ref != "#" else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise Refusal("$ref", where, f"points at {ref}, which the schema does not have")
        return node

    def expand(self, schema: Any, where: str, depth: int = 0) -> list[dict[str, Any]]:
        """The flat alternatives whose union is exactly `schema` (an empty list: nothing is valid)."""
        if depth > 32:
            raise Refusal("$ref", where, "recurses without consuming input")
        if schema is True:
            return [{}]
        if schema is False:
            return []
        if not isinstance(schema, dict):
            raise UsageError(f"the schema at {where or 'the top level'} must be an object or a boolean")
        node = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
        flats: list[dict[str, Any]] = [{}]
        if "$ref" in node:
            target = self.resolve(node.pop("$ref"), where)
            flats = self._and(flats, self.expand(target, where, depth + 1), where)
        parts: list[list[dict[str, Any]]] = []
        if "allOf" in node:
            for i, part in enumerate(node.pop("allOf")):
                parts.append(self.expand(part, f"{where}/allOf/{i}", depth + 1))
        if "anyOf" in node:
            branches = node.pop("anyOf")
            parts.append([f for i, b in enumerate(branches) for f in self.expand(b, f"{where}/anyOf/{i}", depth + 1)])
        if "oneOf" in node:
            parts.append(self._one_of(node.pop("oneOf"), f"{where}/oneOf", depth))
        if "not" in node:
            parts.append(self.expand(negate(node.pop("not"), f"{where}/not", self), where, depth + 1))
        if "if" in node:
            condition, then, otherwise = node.pop("if"), node.pop("then", True), node.pop("else", True)
            if then is not True or otherwise is not True:
                yes = self.expand({"allOf": [condition, then]}, f"{where}/then", depth + 1)
                no = self.expand(
                    {"allOf": [negate(condition, f"{where}/if", self), otherwise]}, f"{where}/else", depth + 1
                )
                parts.append(yes + no)
        node.pop("then", None), node.pop("else", None)
        for name, dependent in (node.pop("dependentSchemas", None) or {}).items():
            absent = {"x-absent": [name]}
            present = {"allOf": [{"required": [name]}, dependent]}
            parts.append(self.expand({"anyOf": [absent, present]}, f"{where}/dependentSchemas", depth + 1))
        for name, needed in (node.pop("dependentRequired", None) or {}).items():
            either = {"anyOf": [{"x-absent": [name]}, {"required": [name, *needed]}]}
            parts.append(self.expand(either, f"{where}/dependentRequired", depth + 1))
        if "const" in node:  # one value: an enum of one (intersected with an enum beside it)
            value = node.pop("const")
            node["enum"] = [v for v in node.get("enum", [value]) if same_value(v, value)]
        flats = self._and(flats, [node], where)
        for part in parts:
            flats = self._and(flats, part, where)
        return flats

    def _one_of(self, branches: list[Any], where: str, depth: int) -> list[dict[str, Any]]:
        """Exactly one branch: their union where no value can match two of them (told apart by
        type, value or a property's value), else each branch with the complement of every other."""
        expanded = [self.expand(b, f"{where}/{i}", depth + 1) for i, b in enumerate(branches)]
        if all(
            self.disjoint(f, g, where)
            for i, left in enumerate(expanded)
            for right in expanded[i + 1 :]
            for f in left
            for g in right
        ):
            return [f for alternatives in expanded for f in alternatives]
        out: list[dict[str, Any]] = []
        for i, branch in enumerate(branches):
            try:
                others = [negate(b, f"{where}/{j}", self) for j, b in enumerate(branches) if j != i]
            except Refusal:
                raise Refusal("oneOf", where, "has branches that may overlap and cannot be told apart") from None
            out += self.expand({"allOf": [branch, *others]}, f"{where}/{i}", depth + 1)
        return out

    def disjoint(self, f: dict[str, Any], g: dict[str, Any], where: str) -> bool:
        """Whether no value satisfies both flat schemas, as far as types, values and the values of
        properties both require can tell."""
        try:
            merged = merge(f, g, where, self)
        except Refusal:
            return False
        if merged is None or merged.get("enum") == []:
            return True
        if type_set(merged) != {"object"}:
            return False
        import re

        if any(_for_name(g, n, re) is False for n in f.get("required", [])):
            return True  # f requires a key g forbids
        if any(_for_name(f, n, re) is False for n in g.get("required", [])):
            return True
        both_required = set(f.get("required", [])) & set(g.get("required", []))
        for name in both_required:
            sub = merged.get("properties", {}).get(name, True)
            try:
                if not self.expand(sub, where, 1):
                    return True
            except Refusal:
                continue
        return False

    def _and(self, lefts: list[dict[str, Any]], rights: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
        out = []
        for left in lefts:
            for right in rights:
                merged = merge(left, right, where, self)
                if merged is not None and merged not in out:
                    out.append(merged)
        if len(out) > MAX_ALTERNATIVES:
            raise Refusal("anyOf", where, f"expands to more than {MAX_ALTERNATIVES} alternatives")
        return out


def _check_own_keywords(schema: Any, where: str) -> None:
    """Refuse a schema that spells one of llmchat's own keywords: it would be read as llmchat's."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in OWN_KEYWORDS:
                raise Refusal(key, where, "is a name llmchat's converter uses for itself")
            if key not in ("enum", "const", "default", "examples"):
                _check_own_keywords(value, f"{where}/{key}")
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            _check_own_keywords(item, f"{where}/{i}")


# --- merging two flat schemas (allOf) -----------------------------------------------------------------
_LOWER = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains"}
_UPPER = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains"}


def type_set(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if kind is None:
        return set(TYPES)
    kinds = set(kind if isinstance(kind, list) else [kind])
    if "number" in kinds:
        kinds.add("integer")
    return kinds


def both(a: Any, b: Any) -> Any:
    """allOf of two subschemas, kept lazy (expanded where it is compiled)."""
    if a is True or a == {}:
        return b
    if b is True or b == {} or a == b:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def merge(a: dict[str, Any], b: dict[str, Any], where: str, schemas: Schemas) -> dict[str, Any] | None:
    """The flat schema holding exactly what both hold, or None when nothing can."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key == "type":
            kinds = type_set(a) & type_set(b)
            if not kinds:
                return None
            out["type"] = sorted(kinds - {"integer"} if "number" in kinds else kinds)
        elif key in _LOWER:
            out[key] = max(out[key], value)
        elif key in _UPPER:
            out[key] = min(out[key], value)
        elif key in ("enum", "const"):
            mine = out[key] if key == "enum" else [out[key]]
            theirs = value if key == "enum" else [value]
            kept = [v for v in mine if any(same_value(v, w) for w in theirs)]
            out.pop(key)
            out["enum"] = kept
        elif key in ("required", "x-absent", "x-except"):
            out[key] = list(dict.fromkeys([*out[key], *value])) if key != "x-except" else [*out[key], *value]
        elif key in ("items", "additionalProperties", "propertyNames", "contains"):
            if key == "contains" and out[key] != value:
                raise Refusal("contains", where, "appears twice with different schemas")
            out[key] = both(out[key], value)
        elif key == "multipleOf":
            if out[key] != value:
                if not (isinstance(out[key], int) and isinstance(value, int)):
                    raise Refusal("multipleOf", where, "appears twice with different non-integer values")
                out[key] = out[key] * value // math.gcd(out[key], value)
        elif key == "uniqueItems":
            out[key] = bool(out[key]) or bool(value)
        elif key in ("properties", "patternProperties", "prefixItems"):
            continue  # below, with what each side leaves to the other's additional schemas
        elif out[key] != value:
            raise Refusal(key, where, "appears in two parts of an allOf with different values")
    if "const" in out and "enum" in out:
        out["enum"] = [v for v in out.pop("enum") if same_value(v, out["const"])]
    if out.get("enum") == []:
        return None  # no value is in both
    _merge_properties(out, a, b)
    _merge_prefix(out, a, b, where)
    return out


def _merge_properties(out: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> None:
    import re

    names = list(dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]))
    if names or "properties" in a or "properties" in b:
        merged = {}
        for name in names:
            merged[name] = both(_for_name(a, name, re), _for_name(b, name, re))
        out["properties"] = merged
    patterns = {**a.get("patternProperties", {})}
    for pattern, sub in b.get("patternProperties", {}).items():
        patterns[pattern] = both(patterns[pattern], sub) if pattern in patterns else sub
    if patterns:
        out["patternProperties"] = patterns


def _for_name(schema: dict[str, Any], name: str, re: Any) -> Any:
    """The schema a side holds the property `name` to: its own, its patterns', or its additional one."""
    if name in schema.get("x-absent", []):
        return False
    if name in schema.get("properties", {}):
        return schema["properties"][name]
    matching = [sub for pattern, sub in schema.get("patternProperties", {}).items() if re.search(pattern, name)]
    if matching:
        held: Any = True
        for sub in matching:
            held = both(held, sub)
        return held
    return schema.get("additionalProperties", True)


def _merge_prefix(out: dict[str, Any], a: dict[str, Any], b: dict[str, Any], where: str) -> None:
    left, right = a.get("prefixItems"), b.get("prefixItems")
    if left is None and right is None:
        return
    size = max(len(left or []), len(right or []))
    merged = []
    for i in range(size):
        mine = left[i] if left is not None and i < len(left) else a.get("items", True)
        theirs = right[i] if right is not None and i < len(right) else b.get("items", True)
        merged.append(both(mine, theirs))
    out["prefixItems"] = merged


def same_value(a: Any, b: Any) -> bool:
    """JSON Schema's equality: 1 == 1.0, but true != 1, and objects and arrays compared deeply."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# --- complements (not, if/else, oneOf, maxContains) ---------------------------------------------------
def _other_types(kinds: set[str]) -> list[str]:
    return [t for t in TYPES if t not in kinds and t != "integer" or (t == "integer" and "number" not in kinds)]


def _only(kind: str, schema: dict[str, Any]) -> dict[str, Any]:
    """Values of other types than `kind` (each keyword below applies to one type only), or `schema`."""
    others = [t for t in TYPES if t not in (kind, "integer")] if kind == "number" else [t for t in TYPES if t != kind]
    return {"anyOf": [{"type": others}, {"type": kind, **schema}]}


def negate(schema: Any, where: str, schemas: Schemas) -> Any:
    """A schema that holds exactly the values `schema` does not, or a Refusal naming the keyword
    whose complement the grammar cannot write."""
    if schema is True:
        return False
    if schema is False:
        return True
    if not isinstance(schema, dict):
        raise UsageError(f"the schema at {where} must be an object or a boolean")
    ways: list[Any] = []  # a value fails the schema when it fails any one keyword
    for key, value in schema.items():
        if key in ANNOTATIONS or key in ("then", "else"):
            continue
        ways.append(_negate_keyword(key, value, schema, where, schemas))
    if not ways:
        return False
    return ways[0] if len(ways) == 1 else {"anyOf": ways}


def _negate_keyword(key: str, value: Any, schema: dict[str, Any], where: str, schemas: Schemas) -> Any:
    at = f"{where}/{key}"
    if key == "type":
        kinds = type_set({"type": value})
        if "integer" in kinds and "number" not in kinds:
            raise Refusal("not", where, "would need numbers that are not integers, which the grammar cannot single out")
        return {"type": _other_types(kinds)}
    if key == "$ref":
        return negate(schemas.resolve(value, where), at, schemas)
    if key == "allOf":
        return {"anyOf": [negate(part, f"{at}/{i}", schemas) for i, part in enumerate(value)]}
    if key == "anyOf":
        return {"allOf": [negate(part, f"{at}/{i}", schemas) for i, part in enumerate(value)]}
    if key == "not":
        return value
    if key == "if":
        then, otherwise = schema.get("then", True), schema.get("else", True)
        return {
            "anyOf": [
                {"allOf": [value, negate(then, at, schemas)]},
                {"allOf": [negate(value, at, schemas), negate(otherwise, at, schemas)]},
            ]
        }
    bound = {
        "minimum": "exclusiveMaximum",
        "exclusiveMinimum": "maximum",
        "maximum": "exclusiveMinimum",
        "exclusiveMaximum": "minimum",
    }
    if key in bound:
        return _only("number", {bound[key]: value})
    if key in ("minLength", "maxLength"):
        if key == "minLength":
            return _only("string", {"maxLength": value - 1}) if value > 0 else False
        return _only("string", {"minLength": value + 1})
    if key in ("minItems", "maxItems"):
        if key == "minItems":
            return _only("array", {"maxItems": value - 1}) if value > 0 else False
        return _only("array", {"minItems": value + 1})
    if key in ("minProperties", "maxProperties"):
        if key == "minProperties":
            return _only("object", {"maxProperties": value - 1}) if value > 0 else False
        return _only("object", {"minProperties": value + 1})
    if key == "required":
        return _only("object", {"anyOf": [{"x-absent": [name]} for name in value]}) if value else False
    if key == "properties":
        ways = [
            {"required": [name], "properties": {name: negate(sub, f"{at}/{name}", schemas)}}
            for name, sub in value.items()
        ]
        return _only("object", {"anyOf": ways}) if ways else False
    if key in ("const", "enum"):
        values = [value] if key == "const" else value
        return {"x-except": values}
    if key == "items" and "prefixItems" not in schema:
        return _only("array", {"contains": negate(value, at, schemas)})
    if key == "contains" and "minContains" not in schema and "maxContains" not in schema:
        return _only("array", {"items": negate(value, at, schemas)})
    raise Refusal("not", where, f"would need the complement of {key!r}, which the grammar cannot write")
