"""`--functions FILE.py`: the public functions of the user's own Python file become tools.

This runs the user's code: importing the file runs its top level, and each call runs the function
in this process, with this user's rights. It is meant for files the user wrote or trusts (the same
contract as llm's --functions).

The schema comes from the type hints (str, int, float, bool, list[...], dict, Optional, Literal),
the description from the docstring's first paragraph, and each parameter's description from its
Google-style `Args:` entry or Sphinx-style `:param name:` line.
"""

from __future__ import annotations

import collections.abc
import hashlib
import importlib.util
import inspect
import json
import re
import sys
import threading
import types
import typing
from pathlib import Path
from typing import Any, Callable

from llmchat.edges.bounded_input import ANY_TEXT, check_file
from llmchat.errors import UsageError
from llmchat.tools.spec import ToolFailure, ToolSpec, ToolTimeout

_SIMPLE_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_GOOGLE_PARAM = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:[\w\[\], |.]+\s+)?(\w+)\s*:\s*(.*)$")


def load_functions(path: str | Path) -> list[ToolSpec]:
    """Import the file and describe each public function defined in it. Any problem (missing file,
    syntax error, an exception at import, an unsupported signature) is one UsageError line."""
    file = Path(path).expanduser()
    where = f"--functions {path}"
    try:
        check_file(file, where, ANY_TEXT, advice="give the path of a Python file")
    except (FileNotFoundError, IsADirectoryError):
        raise UsageError(f"{where}: no such file; give the path of a Python file") from None
    except OSError as err:
        raise UsageError(f"{where}: cannot read it ({err.strerror or err})") from None
    module = _import_file(file, where)
    specs = []
    for name, function in vars(module).items():
        if name.startswith("_") or not inspect.isfunction(function) or function.__module__ != module.__name__:
            continue
        specs.append(function_spec(function, source=f"functions:{file.name}"))
    if not specs:
        raise UsageError(f"{where}: the file defines no public function (names without a leading underscore)")
    return specs


def _import_file(file: Path, where: str) -> types.ModuleType:
    # A name of our own per file, so two files with the same stem do not replace each other.
    digest = hashlib.sha256(str(file.resolve()).encode()).hexdigest()[:12]
    module_name = f"llmchat_user_functions_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"{where}: not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and typing look the module up while it runs
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        sys.modules.pop(module_name, None)
        raise UsageError(f"{where}: syntax error on line {err.lineno}: {err.msg}") from None
    except Exception as err:  # the user's code failed at import: say what, without a traceback
        sys.modules.pop(module_name, None)
        raise UsageError(f"{where}: importing it raised {type(err).__name__}: {err}") from None
    return module


def function_spec(function: Callable[..., Any], source: str) -> ToolSpec:
    """A ToolSpec for one function: schema from its signature and hints, text from its docstring."""
    name = function.__name__
    description, param_docs = parse_docstring(inspect.getdoc(function) or "")
    try:
        hints = typing.get_type_hints(function)
    except Exception:  # unresolvable forward references: fall back to "any value"
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue  # *args/**kwargs cannot be described as named arguments
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise UsageError(
                f"{source}: {name}() has the positional-only parameter {parameter.name}; tools are called "
                "with named arguments"
            )
        schema = type_schema(hints.get(parameter.name, inspect.Parameter.empty))
        if parameter.name in param_docs:
            schema = {**schema, "description": param_docs[parameter.name]}
        if parameter.default is parameter.empty:
            required.append(parameter.name)
        elif parameter.default is not None and _is_json_value(parameter.default):
            schema = {**schema, "default": parameter.default}
        properties[parameter.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return ToolSpec(
        name=name,
        description=description,
        parameters=parameters,
        source=source,
        run=lambda arguments, timeout_s: call_function(function, arguments, timeout_s),
    )


def type_schema(hint: Any) -> dict[str, Any]:
    """JSON schema for a type hint; an unknown or missing hint accepts any value."""
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[hint]}
    if hint is type(None):
        return {"type": "null"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:  # Optional[X]: the value is X; leaving it out is what "optional" means
            return type_schema(members[0])
        return {"anyOf": [type_schema(a) for a in args]}
    if hint in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[int, str]: fixed positions
            return {"type": "array", "prefixItems": [type_schema(a) for a in args], "minItems": len(args)}
        return {"type": "array", **({"items": type_schema(args[0])} if args else {})}
    if hint is dict or origin is dict:
        return {"type": "object"}
    return {}


def _is_json_value(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {parameter: description}). The description is the text before the first
    section or field list, paragraphs joined by a blank line."""
    description_lines: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    entry_indent: int | None = None  # indentation of the section's entries; deeper lines continue one
    for line in doc.splitlines():
        sphinx = _SPHINX_PARAM.match(line)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            continue
        header = _SECTION.match(line)
        if header:
            section, current, entry_indent = header.group(1).lower(), None, None
            continue
        if section is None:
            if line.strip().startswith(":"):  # :returns:, :raises: ... end the description
                section = "fields"
                continue
            description_lines.append(line.rstrip())
            continue
        if section in ("args", "arguments", "parameters", "params"):
            entry = _GOOGLE_PARAM.match(line)
            indent = len(line) - len(line.lstrip())
            if entry and (entry_indent is None or indent <= entry_indent):
                entry_indent = indent if entry_indent is None else entry_indent
                current = entry.group(1)
                params[current] = entry.group(2).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section == "sphinx" and current and line.strip() and not line.strip().startswith(":"):
            params[current] = f"{params[current]} {line.strip()}".strip()
    description = "\n".join(description_lines).strip()
    return description, params


def call_function(function: Callable[..., Any], arguments: dict[str, Any], timeout_s: float) -> str:
    """Run the function with the arguments, in a worker thread so the caller stops waiting after
    timeout_s. Python cannot stop a running function from outside: on a timeout it keeps running in
    the background until it returns (documented), and its result is thrown away."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = function(**arguments)
        except BaseException as err:  # the user's code: any failure becomes text for the model
            outcome["error"] = err

    worker = threading.Thread(target=target, name=f"tool-{function.__name__}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ToolTimeout(f"{function.__name__} did not return within {timeout_s:g} s")
    if "error" in outcome:
        err = outcome["error"]
        raise ToolFailure(f"{type(err).__name__}: {err}")
    return as_text(outcome.get("value"))


def as_text(value: Any) -> str:
    """A function's return value as the text the model reads: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)
