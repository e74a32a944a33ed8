"""Structured output: what `--schema`, `--schema-multi`, `--format json` and `--grammar` ask of a reply.

- A `--schema` value is, in this order: a schema named in the config file's `[schemas]` table, a
  JSON Schema file, inline JSON (it starts with `{`), or the concise syntax of simonw/llm,
  `'name, age int, bio: a short bio'`, extended with list types: `'tags list[str]: up to five tags'`,
  and a list's longest length: `'tags list[str] max 5'` (JSON Schema's maxItems, which the grammar
  enforces, so a list the model keeps repeating must close).
  An unknown type word is an error here (llm silently makes it a string).
- `--schema-multi` asks for `{"items": [...]}` of that schema; `--format json` for any JSON object;
  `--grammar FILE.gbnf` for whatever the grammar allows (no schema, so nothing is parsed).
- The reply is decoded under the grammar the schema compiles to (engine.grammar), so it is valid
  by construction; it is still parsed and validated afterwards with `jsonschema`, because a reply
  can be cut short (max_tokens, Ctrl-C) and because checks beat promises. The decoded value is
  the record's `parsed`; a reply that fails gets the record's `error` (ask exits 5).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.edges.bounded_input import ANY_TEXT, read_file
from llmchat.errors import UsageError

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.engine.grammar import Grammar
    from llmchat.options import RunOptions

CONCISE_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
FORMATS = ("json",)
_FIELD = re.compile(
    r"^(?P<name>[A-Za-z_][\w-]*)(?:\s+(?P<type>[A-Za-z_][\w\[\]\s]*?))?\s*(?::\s*(?P<description>.*))?$"
)
_LIST = re.compile(r"^list\s*\[\s*(?P<inner>\w+)\s*\](?:\s+max\s+(?P<max>\d+))?$")


@dataclass(frozen=True)
class StructuredOutput:
    """What a reply is held to: a grammar, and the schema it is validated against (None for a
    raw `--grammar`, which has no schema to parse against)."""

    grammar: Grammar
    schema: dict[str, Any] | None
    source: str  # for messages: "--schema 'title, year int'", "item 7's schema", ...

    def check(self, reply: str, finish_reason: str) -> tuple[Any, str | None]:
        """(parsed value, None) for a valid reply, else (None, one line saying what is wrong)."""
        if self.schema is None:
            return None, None
        cut = {
            "length": "it was cut off by the token limit before the JSON was complete; raise --max-tokens",
            "interrupted": "it was interrupted before the JSON was complete",
        }.get(finish_reason)
        try:
            parsed = json.loads(unfenced(reply))
        except json.JSONDecodeError as err:
            why = cut or f"{err.msg} at line {err.lineno} column {err.colno}"
            return None, f"the reply is not valid JSON: {why}"
        problem = validation_error(parsed, self.schema)
        if problem is not None:
            return None, f"the reply does not match {self.source}: {problem}"
        return parsed, None


_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*\Z", re.DOTALL)


def unfenced(reply: str) -> str:
    """A JSON reply without the Markdown fence a model may put around it (a server that does not
    hold the reply to the grammar lets it through; llama.cpp reads such replies the same way)."""
    match = _FENCE.match(reply)
    return match.group(1).strip() if match else reply


# --- the concise syntax ---------------------------------------------------------------------------
def concise_to_schema(spec: str) -> dict[str, Any]:
    """`'name, age int, tags list[str]: up to five tags'` -> a JSON Schema object, every field required.

    Fields are separated by commas, or by newlines when there is a newline (so a description may
    hold commas). A field is `name [type][: description]`; the type is `str` when omitted."""
    separator = "\n" if "\n" in spec.strip() else ","
    properties: dict[str, Any] = {}
    for raw in spec.split(separator):
        text = raw.strip()
        if not text:
            continue
        match = _FIELD.match(text)
        if match is None:
            raise UsageError(
                f"cannot read the schema field {text!r}: write 'name', 'name type' or 'name type: description' "
                f"(types: {', '.join(CONCISE_TYPES)}, list[...])"
            )
        name = match["name"]
        if name in properties:
            raise UsageError(f"the schema names the field {name!r} twice")
        prop = _concise_type((match["type"] or "str").strip(), name)
        if match["description"]:
            prop["description"] = match["description"].strip()
        properties[name] = prop
    if not properties:
        raise UsageError("the schema has no fields; write e.g. --schema 'name, age int'")
    return {"type": "object", "properties": properties, "required": list(properties)}


def _concise_type(word: str, name: str) -> dict[str, Any]:
    if word in CONCISE_TYPES:
        return {"type": CONCISE_TYPES[word]}
    listed = _LIST.match(word)
    if listed is not None and listed["inner"] in CONCISE_TYPES:
        schema: dict[str, Any] = {"type": "array", "items": {"type": CONCISE_TYPES[listed["inner"]]}}
        if listed["max"] is not None:
            schema["maxItems"] = int(listed["max"])
        return schema
    kinds = ", ".join([*CONCISE_TYPES, *(f"list[{t}]" for t in CONCISE_TYPES)]) + " (a list may end in 'max N')"
    raise UsageError(f"unknown type {word!r} for the field {name!r}; use one of {kinds}")


# --- --schema values --------------------------------------------------------------------------------
def parse_schema_spec(value: str, named: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """A `--schema` value as (JSON Schema, where it came from)."""
    named = named or {}
    if value in named:
        return schema_from_config(value, named[value]), f"the schema {value!r} from the config file"
    text = value.strip()
    if text.startswith("{"):
        return _json_schema(text, "the inline --schema"), "the inline --schema"
    path = Path(value).expanduser()
    if path.is_file() or value.endswith(".json"):
        try:
            content = read_file(path, f"--schema {value}", ANY_TEXT, advice="pass a JSON Schema file").decode("utf-8")
        except FileNotFoundError:
            raise UsageError(
                f"--schema {value}: no such file; pass a JSON Schema file, inline JSON or fields"
            ) from None
        except (OSError, UnicodeDecodeError) as err:
            raise UsageError(f"--schema {value}: cannot read it as UTF-8 text ({err})") from None
        return _json_schema(content, f"--schema {value}"), f"the schema in {value}"
    return concise_to_schema(value), f"--schema {value!r}"


def schema_from_config(name: str, value: Any) -> dict[str, Any]:
    """A `[schemas]` entry: a concise string, an inline JSON string, or a TOML table (the schema)."""
    if isinstance(value, dict):
        return _checked_schema(value, f"the config's schemas.{name}")
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            return _json_schema(text, f"the config's schemas.{name}")
        return concise_to_schema(value)
    raise UsageError(f"the config's schemas.{name} must be a string (fields or JSON) or a table (a JSON Schema)")


def _json_schema(text: str, where: str) -> dict[str, Any]:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise UsageError(f"{where} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    return _checked_schema(schema, where)


def _checked_schema(schema: Any, where: str) -> dict[str, Any]:
    if not isinstance(schema, dict):
        raise UsageError(f"{where} must be a JSON object (a JSON Schema)")
    from jsonschema import exceptions, validators

    try:
        validators.validator_for(schema).check_schema(schema)
    except exceptions.SchemaError as err:
        raise UsageError(f"{where} is not a valid JSON Schema: {err.message}") from None
    return schema


def multi(schema: dict[str, Any]) -> dict[str, Any]:
    """`--schema-multi`: several objects of the schema, as `{"items": [...]}` (simonw/llm's shape)."""
    return {"type": "object", "properties": {"items": {"type": "array", "items": schema}}, "required": ["items"]}


# --- validation ---------------------------------------------------------------------------------------
def validation_error(value: Any, schema: dict[str, Any]) -> str | None:
    """The most relevant way `value` fails `schema`, as one line, or None when it is valid."""
    from jsonschema import exceptions, validators

    validator = validators.validator_for(schema)(schema)
    best = exceptions.best_match(validator.iter_errors(value))
    if best is None:
        return None
    where = "/" + "/".join(str(part) for part in best.absolute_path) if best.absolute_path else "the top level"
    return f"{best.message} (at {where})".replace("\n", " ")


# --- from options to a StructuredOutput -----------------------------------------------------------
def structured_output(
    *,
    schema: str | None = None,
    schema_multi: bool = False,
    output_format: str | None = None,
    grammar_file: Path | None = None,
    named: dict[str, Any] | None = None,
) -> StructuredOutput | None:
    """The flags of ask, chat and batch as one StructuredOutput (None when none was given).

    Raises UsageError (exit 2) for a bad value or a schema the grammar cannot enforce: never a
    silent fallback to looser JSON."""
    from llmchat.engine.grammar import Grammar, load_gbnf, schema_to_gbnf

    given = [
        flag
        for flag, value in (("--schema", schema), ("--format", output_format), ("--grammar", grammar_file))
        if value
    ]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} each set what the reply must be; choose one")
    if schema_multi and not schema:
        raise UsageError("--schema-multi needs --schema (the shape of each item)")
    if output_format is not None:
        if output_format not in FORMATS:
            raise UsageError(f"--format must be json, got {output_format!r}")
        plain: dict[str, Any] = {"type": "object"}
        return StructuredOutput(Grammar(schema_to_gbnf(plain), "--format json"), plain, "--format json (a JSON object)")
    if grammar_file is not None:
        return StructuredOutput(load_gbnf(grammar_file), None, f"--grammar {grammar_file}")
    if schema is None:
        return None
    resolved, source = parse_schema_spec(schema, named)
    if schema_multi:
        resolved, source = multi(resolved), f"{source} (--schema-multi)"
    return StructuredOutput(Grammar(schema_to_gbnf(resolved), source), resolved, source)


def from_options(opts: RunOptions, config: Config) -> StructuredOutput | None:
    """The structured-output flags of ask, chat and batch, with the config's named schemas."""
    if not (opts.schema or opts.schema_multi or opts.output_format or opts.grammar_file):
        return None
    return structured_output(
        schema=opts.schema,
        schema_multi=opts.schema_multi,
        output_format=opts.output_format,
        grammar_file=opts.grammar_file,
        named=config.schemas,
    )


def item_structured(value: Any, named: dict[str, Any] | None = None) -> StructuredOutput:
    """A batch item's own `schema`: a JSON Schema object, or a string as `--schema` takes it."""
    from llmchat.engine.grammar import Grammar, schema_to_gbnf

    if isinstance(value, dict):
        resolved, source = _checked_schema(value, "the item's schema"), "the item's schema"
    elif isinstance(value, str) and value.strip():
        resolved, source = parse_schema_spec(value, named)
    else:
        raise UsageError("'schema' must be a JSON Schema object or a string (fields, JSON, a file or a config name)")
    return StructuredOutput(Grammar(schema_to_gbnf(resolved), source), resolved, source)
