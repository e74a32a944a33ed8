"""`--tools FILE` for `llmchat template render|show`: the tool list to render a prompt with.

A `.py` file is read like `--functions` (its public functions; this imports and runs it). Any
other file is JSON: a list of OpenAI-style entries (`{"type": "function", "function": {...}}`)
or of plain `{"name", "description", "parameters"}` objects. Tools declared in JSON are for
rendering only: they have nothing to run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llmchat.edges.bounded_input import ANY_TEXT, read_file
from llmchat.errors import UsageError
from llmchat.tools.functions import load_functions
from llmchat.tools.spec import EMPTY_OBJECT_SCHEMA, ToolFailure, ToolSpec


def read_tools_file(path: str) -> list[ToolSpec]:
    file = Path(path).expanduser()
    if file.suffix == ".py":
        return load_functions(file)
    where = f"--tools {path}"
    try:
        data = json.loads(read_file(file, where, ANY_TEXT, advice="pass a JSON file of tools").decode("utf-8"))
    except OSError as err:
        raise UsageError(f"{where}: cannot read it ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise UsageError(f"{where}: not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]  # also accept the {"tools": [...]} request shape
    if not isinstance(data, list) or not data:
        raise UsageError(f'{where}: expected a non-empty JSON list of tools ({{"name", "description", "parameters"}})')
    return [_declared(entry, number, where) for number, entry in enumerate(data, start=1)]


def _declared(entry: Any, number: int, where: str) -> ToolSpec:
    if isinstance(entry, dict) and isinstance(entry.get("function"), dict):
        entry = entry["function"]
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
        raise UsageError(f"{where}: tool {number} has no name")
    parameters = entry.get("parameters", EMPTY_OBJECT_SCHEMA)
    if not isinstance(parameters, dict):
        raise UsageError(f"{where}: tool {entry['name']}: parameters must be a JSON schema object")

    def declared_only(arguments: dict[str, Any], timeout_s: float) -> str:
        raise ToolFailure(f"{entry['name']} is declared for rendering only; it has nothing to run")

    return ToolSpec(
        name=entry["name"],
        description=str(entry.get("description", "")),
        parameters=parameters,
        source=f"file:{Path(where.split(' ', 1)[1]).name}",
        run=declared_only,
    )
