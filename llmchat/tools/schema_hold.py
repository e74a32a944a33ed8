"""What of a tool's parameters schema the call grammar holds, and which tools can be offered at all.

A tool's schema comes from whoever wrote the tool (an MCP server, a config table, a function), not
from the user, so it is taken as far as it goes instead of refused (a user's own `--schema` stays
strict: llmchat.turn.structured):
- a keyword the grammar cannot hold (`minimum` on a `number`, `uniqueItems`, an unanchored
  `pattern`...) is left out of that tool's grammar only, with one notice per tool naming it. The
  arguments the model writes are still validated against the whole schema before the call
  (llmchat.tools.execute), and a failing check is the usual error text for the model;
- a schema llama.cpp's converter still cannot take holds the arguments to any JSON object;
- a schema that is not a valid JSON Schema (per its own `$schema` dialect, 2020-12 by default)
  leaves its tool out, with one notice; the other tools of its source stay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from llmchat.engine.grammar import held_schema, schema_to_gbnf
from llmchat.errors import UsageError
from llmchat.tools.spec import ToolSpec

ANY_OBJECT: dict[str, Any] = {"type": "object"}


def schema_problem(schema: dict[str, Any]) -> str | None:
    """Why `schema` is not a valid JSON Schema in its dialect, or None."""
    from jsonschema.exceptions import SchemaError
    from jsonschema.validators import Draft202012Validator, validator_for

    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as err:
        where = "/".join(str(part) for part in err.absolute_path)
        return err.message + (f" at /{where}" if where else "")
    return None


def grammar_parameters(spec: ToolSpec) -> tuple[dict[str, Any], str | None]:
    """The schema the call grammar holds this tool's arguments to, and the notice saying what it
    leaves out (None: the whole schema is held)."""
    held, dropped = held_schema(spec.parameters)
    try:
        schema_to_gbnf(held)
    except UsageError as err:
        return ANY_OBJECT, (
            f"tool {spec.name} ({spec.source}): the call grammar holds its arguments to any JSON object ({err}); "
            "they are checked against its schema before it runs"
        )
    if not dropped:
        return held, None
    return held, (
        f"tool {spec.name} ({spec.source}): the call grammar cannot hold {_grouped(dropped)}; "
        "its arguments are checked against the whole schema before it runs"
    )


def grammar_spec(spec: ToolSpec) -> ToolSpec:
    """The tool as its call grammar sees it (the schema the grammar holds)."""
    return replace(spec, parameters=grammar_parameters(spec)[0])


def offered_tools(specs: Sequence[ToolSpec], notice: Callable[[str], None], *, grammar: bool) -> list[ToolSpec]:
    """The tools that can be offered: one whose schema is not valid JSON Schema is left out, with
    a notice. `grammar`: calls are held to a grammar, so say once per tool what it leaves out."""
    usable = []
    for spec in specs:
        problem = schema_problem(spec.parameters)
        if problem is not None:
            notice(
                f"tool {spec.name} ({spec.source}) is left out: its parameters schema is not valid JSON Schema ({problem})"
            )
            continue
        usable.append(spec)
        if grammar:
            said = grammar_parameters(spec)[1]
            if said is not None:
                notice(said)
    return usable


def _grouped(dropped: Sequence[str]) -> str:
    """`minimum at /x`, `maximum at /x` -> `minimum, maximum at /x`; places in first-seen order."""
    by_place: dict[str, list[str]] = {}
    for label in dropped:
        what, _, place = label.rpartition(" at ")
        by_place.setdefault(place, []).append(what)
    return "; ".join(f"{', '.join(whats)} at {place}" for place, whats in by_place.items())
