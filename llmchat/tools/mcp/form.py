"""A form-mode elicitation asked on the terminal: one question per field, on stderr.

The requested schema is flat: an object whose properties are strings (with an optional format,
`enum` or titled `oneOf` choices), numbers, integers, booleans, or arrays of such choices (several
picked at once). Anything else (a nested object, a schema that is not JSON Schema) is a FormError:
the server gets an error answer instead of a question nobody could answer.

What the person types is read as the field's type (yes/no for a boolean, a choice by its value,
its title or its number, several choices comma-separated), then checked against the field's own
schema with jsonschema; an invalid answer is said in one line and the field asked again. An empty
answer takes the default, leaves an optional field out, and is asked again for a required one.
Ctrl-C or the end of input at any question (no answer: llmchat.edges.person) cancels the whole form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

FIELD_TYPES = ("string", "number", "integer", "boolean", "array")
YES = ("y", "yes", "true", "1")
NO = ("n", "no", "false", "0")
FIRST_QUESTION = "Answer it? [a]ccept, [d]ecline, [c]ancel (empty: cancel): "


class FormError(ValueError):
    """A requested schema llmchat cannot turn into questions."""


class NotAValue(ValueError):
    """What was typed does not read as the field's type (the message says why)."""


@dataclass(frozen=True)
class Choice:
    value: str
    title: str


@dataclass(frozen=True)
class Field:
    key: str
    schema: Mapping[str, Any]
    required: bool

    @property
    def kind(self) -> str:
        return str(self.schema["type"])

    @property
    def choices(self) -> tuple[Choice, ...]:
        """The values a string (or each item of an array) may take, with their titles."""
        return _choices(self.schema["items"] if self.kind == "array" else self.schema)

    def question(self) -> str:
        """`key (string, email, required, default: x; Title - description): `"""
        details = [self.kind]
        if self.choices:  # numbered, so that a long title need not be typed
            listed = ", ".join(f"{number} {choice.title}" for number, choice in self._numbered())
            details = [("several of" if self.kind == "array" else "one of") + f" {listed}"]
        if "format" in self.schema:
            details.append(str(self.schema["format"]))
        if self.kind == "boolean":
            details.append("yes/no")
        if self.required:
            details.append("required")
        if "default" in self.schema:
            details.append(f"default: {_shown(self.schema['default'])}")
        about = " - ".join(str(self.schema[key]) for key in ("title", "description") if self.schema.get(key))
        return f"  {self.key} ({', '.join(details)}{'; ' + about if about else ''}): "

    def _numbered(self) -> list[tuple[int, Choice]]:
        return list(enumerate(self.choices, start=1))


def _choices(schema: Mapping[str, Any]) -> tuple[Choice, ...]:
    if isinstance(schema.get("enum"), list):
        names = schema.get("enumNames") if isinstance(schema.get("enumNames"), list) else None
        return tuple(
            Choice(str(value), str(names[i]) if names and i < len(names) else str(value))
            for i, value in enumerate(schema["enum"])
        )
    options = schema.get("oneOf") or schema.get("anyOf")
    if isinstance(options, list):
        return tuple(
            Choice(str(option["const"]), str(option.get("title", option["const"])))
            for option in options
            if isinstance(option, Mapping) and "const" in option
        )
    return ()


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return str(value)


def form_fields(requested: Any) -> list[Field]:
    """The fields of a flat requested schema, in its order; FormError for any other schema."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(requested, Mapping) or requested.get("type") != "object":
        raise FormError("the requested schema is not an object schema")
    properties = requested.get("properties", {})
    required = requested.get("required", [])
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        raise FormError("its properties must be an object and required a list")
    try:
        Draft202012Validator.check_schema(dict(requested))
    except SchemaError as err:
        raise FormError(f"it is not a valid JSON schema ({err.message})") from None
    fields = [Field(str(key), schema, key in required) for key, schema in properties.items()]
    for field in fields:
        _check_flat(field)
    return fields


def _check_flat(field: Field) -> None:
    """A field that is one plain value, or an array of choices: nothing nested."""
    if not isinstance(field.schema, Mapping) or field.schema.get("type") not in FIELD_TYPES:
        raise FormError(f"the field {field.key} is not a string, number, integer, boolean or array of choices")
    if field.kind == "array" and not (isinstance(field.schema.get("items"), Mapping) and field.choices):
        raise FormError(f"the field {field.key} is an array whose items are not choices")


def read_value(field: Field, typed: str) -> Any:
    """What was typed, as the field's type; NotAValue when it does not read as one."""
    if field.kind == "array":
        return [_choice(field, part.strip()) for part in typed.split(",") if part.strip()]
    if field.choices:
        return _choice(field, typed)
    if field.kind == "boolean":
        if typed.lower() in YES or typed.lower() in NO:
            return typed.lower() in YES
        raise NotAValue("answer yes or no")
    if field.kind in ("integer", "number"):
        try:
            return int(typed)
        except ValueError:
            pass
        try:
            number = float(typed)
        except ValueError:
            raise NotAValue(f"not a number: {typed}") from None
        if field.kind == "integer":  # 3.0 is an integer; 3.5 is not
            if not number.is_integer():
                raise NotAValue(f"not an integer: {typed}")
            return int(number)
        return number
    return typed


def _choice(field: Field, typed: str) -> str:
    """A choice named by its value, its title (any case) or its number in the list."""
    for number, choice in field._numbered():
        if typed in (choice.value, str(number)) or typed.lower() == choice.title.lower():
            return choice.value
    raise NotAValue(f"not one of the choices: {typed}")


def invalid_reason(field: Field, value: Any) -> str | None:
    """Why the value does not fit the field's schema (jsonschema's message), or None."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(dict(field.schema), format_checker=Draft202012Validator.FORMAT_CHECKER)
    error = next(iter(validator.iter_errors(value)), None)
    return error.message if error is not None else None


Ask = Callable[[str], str | None]  # the question -> the line typed (None: no answer, llmchat.edges.person)


class Cancelled(Exception):
    """The person ended the form (no answer: Ctrl-C, the end of input)."""


def fill_form(message: str, fields: list[Field], ask: Ask, say: Callable[[str], None]) -> tuple[str, dict[str, Any]]:
    """Ask the person: ("accept", the answers), ("decline", {}) or ("cancel", {})."""
    say(message)
    try:
        action = _first_answer(ask)
        if action != "accept":
            return action, {}
        return "accept", _answers(fields, ask, say)
    except Cancelled:
        say("cancelled")
        return "cancel", {}


def _first_answer(ask: Ask) -> str:
    while True:
        typed = ask(FIRST_QUESTION)
        if typed is None:
            raise Cancelled
        word = typed.strip().lower()
        for action in ("accept", "decline", "cancel"):
            if word and action.startswith(word):
                return action
        if not word:
            return "cancel"


def _answers(fields: list[Field], ask: Ask, say: Callable[[str], None]) -> dict[str, Any]:
    answers: dict[str, Any] = {}
    for field in fields:
        value = _answer(field, ask, say)
        if value is not None:
            answers[field.key] = value
    return answers


def _answer(field: Field, ask: Ask, say: Callable[[str], None]) -> Any:
    """One field's value (None: left out), asked until it is valid."""
    while True:
        typed = ask(field.question())
        if typed is None:
            raise Cancelled
        typed = typed.strip()
        if not typed:
            if "default" in field.schema:
                return field.schema["default"]
            if not field.required:
                return None
            say(f"  {field.key} is required")
            continue
        try:
            value = read_value(field, typed)
        except NotAValue as err:
            say(f"  invalid: {err}")
            continue
        reason = invalid_reason(field, value)
        if reason is None:
            return value
        say(f"  invalid: {reason}")
