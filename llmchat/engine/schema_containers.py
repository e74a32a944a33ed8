"""Arrays and objects of a flat schema (engine.schema_algebra) as GBNF, held exactly.

Arrays: `prefixItems` (a tuple), then `items` for the rest, within minItems..maxItems; `contains`
counts the items written through its branch (at least minContains; at most maxContains, the
others then held to its complement).
Objects: the named properties first (required, then optional, each once), then the other keys:
those `patternProperties` match, or any key but the named ones (one spelling per character, so
that no escape spells a named key) held to `additionalProperties` and `propertyNames`.
A keyword whose combination the grammar cannot count (uniqueItems, minProperties beside other
keys, two overlapping patterns...) is refused by name.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import TYPE_CHECKING, Any

from llmchat.engine.schema_algebra import Refusal
from llmchat.engine.schema_rules import gbnf_literal

if TYPE_CHECKING:
    from llmchat.engine.schema_rules import RuleBook

COMMA = '"," space'


def _repeat(item: str, low: int, high: int | None) -> str:
    """`item` low..high times (high None: no limit), as one GBNF expression ("" for none)."""
    if high is not None and high <= 0:
        return ""
    if high == low == 1:
        return item
    upper = "" if high is None else str(high)
    return f"({item}){{{low},{upper}}}"


def _items(first: str, rest: str, low: int, high: int | None) -> str:
    """A separated list: `first` then `"," rest` items, low..high in all ("" may be empty)."""
    if high is not None and high <= 0:
        return ""
    tail = _repeat(f"{COMMA} {rest}", max(low - 1, 0), None if high is None else high - 1)
    body = f"{first} {tail}".strip()
    return body if low >= 1 else f"({body})?"


# --- arrays -------------------------------------------------------------------------------------------
def array_rule(c: RuleBook, node: dict[str, Any], where: str, name: str) -> str | None:
    low, high = int(node.get("minItems", 0)), node.get("maxItems")
    high = None if high is None else int(high)
    if node.get("uniqueItems") and (high is None or high > 1):
        raise Refusal("uniqueItems", where, "cannot be held by the grammar (it cannot compare items)")
    if "contains" in node:
        return _contains(c, node, where, name, low, high)
    prefix = node.get("prefixItems", [])
    rest = c.rule(node.get("items", True), f"{where}/items", f"{c.prefix(name)}item")
    limits = [high] if high is not None else []
    if rest is None:
        limits.append(len(prefix))
    rules: list[str] = []
    for i, sub in enumerate(prefix):
        made = c.rule(sub, f"{where}/prefixItems/{i}", f"{c.prefix(name)}tuple-{i}")
        if made is None:
            limits.append(i)
            break
        rules.append(made)
    high = min(limits) if limits else None
    if high is not None and low > high:
        return None
    body = _positions(rules, rest, 0, low, high)
    return f'"[" space {body} "]" space'.replace("  ", " ")


def _positions(rules: list[str], rest: str | None, i: int, low: int, high: int | None) -> str:
    """Items from position i on: the tuple's rules, then `rest`, low..high items in all."""
    if high is not None and i >= high:
        return ""
    sep = "" if i == 0 else f"{COMMA} "
    if i >= len(rules):
        if rest is None:
            return ""
        count_low, count_high = max(low - i, 0), None if high is None else high - i
        if i == 0:
            return _items(rest, rest, count_low, count_high)
        return _repeat(f"{sep}{rest}", count_low, count_high)
    here = f"{sep}{rules[i]} {_positions(rules, rest, i + 1, low, high)}".strip()
    return here if i < low else f"({here})?"


def _contains(c: RuleBook, node: dict[str, Any], where: str, name: str, low: int, high: int | None) -> str | None:
    if "prefixItems" in node or low or high is not None:
        raise Refusal("contains", where, "beside prefixItems, minItems or maxItems cannot be counted by the grammar")
    need = int(node.get("minContains", 1))
    most = node.get("maxContains")
    items = node.get("items", True)
    hit = c.rule(c.both(node["contains"], items), f"{where}/contains", f"{c.prefix(name)}contains")
    if most is None:
        other = c.rule(items, f"{where}/items", f"{c.prefix(name)}item")
    else:
        most = int(most)
        other = c.rule(
            c.both(c.negate(node["contains"], f"{where}/contains"), items),
            f"{where}/contains",
            f"{c.prefix(name)}other",
        )
    if need == 0 and most is None:
        return f'"[" space {_items(other, other, 0, None)} "]" space' if other else '"[" space "]" space'
    if hit is None and need > 0:
        return None
    if most is not None and need > most:
        return None
    top = need if most is None else most
    state = c.add(f"{c.prefix(name)}count", '""')

    def after(j: int) -> str:  # j items counted so far (capped at `need` when there is no maximum)
        return f"{state}-{j}"

    for j in range(top + 1):
        ways = ['""'] if j >= need else []
        if other is not None:
            ways.append(f"{COMMA} {other} {after(j)}")
        if hit is not None and (most is None or j < most):
            ways.append(f"{COMMA} {hit} {after(min(j + 1, top) if most is None else j + 1)}")
        c.rules[after(j)] = " | ".join(ways) or '"]" "["'
    starts = ['""'] if need == 0 else []
    if other is not None:
        starts.append(f"{other} {after(0)}")
    if hit is not None and (most is None or most > 0):
        starts.append(f"{hit} {after(1 if top >= 1 else 0)}")
    return f'"[" space ({" | ".join(starts)}) "]" space'


# --- objects ------------------------------------------------------------------------------------------
def object_rule(c: RuleBook, node: dict[str, Any], where: str, name: str) -> str | None:
    props: dict[str, Any] = node.get("properties", {})
    required: list[str] = list(node.get("required", []))
    patterns: dict[str, Any] = node.get("patternProperties", {})
    names_schema = node.get("propertyNames", True)
    absent: list[str] = node.get("x-absent", [])
    # An object that declares its properties, even none (a tool without parameters: `{}` only),
    # takes no other key unless additionalProperties says so.
    narrowed = ("properties" in node or "patternProperties" in node) and "additionalProperties" not in node
    extra = False if narrowed else node.get("additionalProperties", True)
    named = list(props) + [r for r in required if r not in props]
    named += [a for a in absent if a not in named]
    kvs: list[tuple[str, bool]] = []
    for key in [*[k for k in named if k in required], *[k for k in named if k not in required]]:
        held = props.get(key, True if narrowed else extra)
        for pattern, sub in patterns.items():
            if _search(pattern, key, where):
                held = c.both(held, sub)
        if key in absent:
            held = False
        if names_schema is not True and not c.validator(
            names_schema if isinstance(names_schema, dict) else {"not": {}}
        ).is_valid(key):
            held = False
        value = c.rule(held, f"{where}/properties/{key}", f"{c.prefix(name)}{key}")
        if value is None:
            if key in required:
                return None
            continue
        label = json.dumps(key, ensure_ascii=False)
        kvs.append(
            (c.add(f"{c.prefix(name)}{key}-kv", f'{gbnf_literal(label)} space ":" space {value}'), key in required)
        )
    other = _other_keys(c, node, where, name, named, patterns, extra, names_schema)
    low, high = node.get("minProperties"), node.get("maxProperties")
    if low is not None or high is not None:
        return _counted(c, kvs, other, int(low or 0), None if high is None else int(high), where)
    return f'"{{" space {_sequence(c, kvs, other, name)} "}}" space'.replace("  ", " ")


def _search(pattern: str, key: str, where: str) -> bool:
    try:
        return re.search(pattern, key) is not None
    except re.error as err:
        raise Refusal("patternProperties", where, f"has a pattern Python cannot read ({err})") from None


def _other_keys(
    c: RuleBook,
    node: dict[str, Any],
    where: str,
    name: str,
    named: list[str],
    patterns: dict[str, Any],
    extra: Any,
    names_schema: Any,
) -> str | None:
    """The rule of one key-value pair beyond the named ones, or None when there can be none."""
    if patterns:
        if extra is not False or names_schema is not True:
            keyword = "additionalProperties" if extra is not False else "propertyNames"
            raise Refusal(keyword, where, "beside patternProperties cannot be held by the grammar")
        schemas = list({json.dumps(s, sort_keys=True): s for s in patterns.values()}.values())
        if len(schemas) > 1:
            raise Refusal(
                "patternProperties",
                where,
                "with patterns whose keys may overlap and whose schemas differ cannot be held",
            )
        if any(_search(p, key, where) for p in patterns for key in named):
            raise Refusal("patternProperties", where, "matching a named property cannot be held by the grammar")
        value = c.rule(schemas[0], f"{where}/patternProperties", f"{c.prefix(name)}pattern-value")
        if value is None:
            return None
        keys = [
            c.pattern_rule(p, f"{where}/patternProperties", f"{c.prefix(name)}key-{i}") for i, p in enumerate(patterns)
        ]
        return c.add(f"{c.prefix(name)}pattern-kv", f'({" | ".join(keys)}) ":" space {value}')
    if extra is False or names_schema is False:
        return None
    value = c.rule(extra, f"{where}/additionalProperties", f"{c.prefix(name)}additional")
    if value is None:
        return None
    if names_schema is not True:
        if named:
            raise Refusal("propertyNames", where, "beside named properties cannot be held by the grammar")
        key = c.rule(c.both(names_schema, {"type": "string"}), f"{where}/propertyNames", f"{c.prefix(name)}key")
        if key is None:
            return None
    elif named:
        key = c.add(f"{c.prefix(name)}other-key", c.string_except(named, f"{c.prefix(name)}key"))
    else:
        c.any_value()
        key = "string"
    return c.add(f"{c.prefix(name)}additional-kv", f'{key} ":" space {value}')


def _sequence(c: RuleBook, kvs: list[tuple[str, bool]], other: str | None, name: str) -> str:
    """The pairs in order, commas between the ones written: required ones always, optional ones
    maybe, then any number of other pairs. Built from the end: `after` is what may follow once a
    pair was written (each pair with its comma), `first` what may follow when none was yet."""
    after = f"({COMMA} {other})*" if other else ""
    first = _items(other, other, 0, None) if other else ""
    for kv, needed in reversed(kvs):
        if needed:
            first, after = f"{kv} {after}".strip(), f"{COMMA} {kv} {after}".strip()
        else:
            first = f"({kv} {after} | {first})" if first else f"({kv} {after})?".replace(" )", ")")
            after = f"({COMMA} {kv})? {after}".strip()
        if len(first) > 160:
            first = c.add(f"{c.prefix(name)}first", first)
        if len(after) > 160:
            after = c.add(f"{c.prefix(name)}after", after)
    return first


def _counted(
    c: RuleBook, kvs: list[tuple[str, bool]], other: str | None, low: int, high: int | None, where: str
) -> str | None:
    """min/maxProperties: the subsets of optional pairs written out, or other pairs counted."""
    if other is not None:
        if kvs or low > 0:
            keyword = "minProperties" if low > 0 else "maxProperties"
            raise Refusal(keyword, where, "beside other keys (which may repeat) cannot be counted by the grammar")
        return f'"{{" space {_items(other, other, 0, high)} "}}" space'
    required = [kv for kv, needed in kvs if needed]
    optional = [kv for kv, needed in kvs if not needed]
    ways = []
    for size in range(len(optional) + 1):
        if not (low <= len(required) + size and (high is None or len(required) + size <= high)):
            continue
        for chosen in itertools.combinations(optional, size):
            pairs = required + list(chosen)
            ways.append(f'"{{" space {f" {COMMA} ".join(pairs)} "}}" space'.replace("  ", " "))
            if len(ways) > 64:
                raise Refusal(
                    "minProperties" if low else "maxProperties",
                    where,
                    "allows too many sets of properties to write out",
                )
    return " | ".join(f"( {w} )" for w in ways) or None
