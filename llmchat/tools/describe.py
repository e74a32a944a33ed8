"""A tool's arguments as lines a person reads: what `llmchat tools list` and the chat's /tools print.

It lives with the tools, below both the command line and the chat UI, so that each of them shows
a tool's arguments the same way without one importing the other.
"""

from __future__ import annotations

import json
from typing import Any


def describe_parameters(schema: Any) -> list[str]:
    """One line per argument: name, type, required or optional, and its description."""
    required = set(schema.get("required", []))
    lines = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        kind = prop.get("type")
        if "enum" in prop:
            kind = "one of " + ", ".join(json.dumps(v) for v in prop["enum"])
        elif isinstance(kind, list):
            kind = " | ".join(str(k) for k in kind)
        elif kind == "array" and isinstance(prop.get("items"), dict) and prop["items"].get("type"):
            kind = f"array of {prop['items']['type']}"
        text = f"{name}: {kind or 'any'}" + (" (required)" if name in required else "")
        if "default" in prop:
            text += f" (default {json.dumps(prop['default'])})"
        if prop.get("description"):
            text += f" - {prop['description']}"
        lines.append(text)
    return lines
