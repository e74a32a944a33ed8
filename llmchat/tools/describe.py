"""A tool's arguments, and its cost in tokens, as lines a person reads: what `llmchat tools list`
and the chat's /tools print.

It lives with the tools, below both the command line and the chat UI, so that each of them shows
a tool's arguments the same way without one importing the other.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmchat.tools.token_cost import ToolCosts


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


def cost_lines(costs: ToolCosts) -> list[str]:
    """The token table `llmchat tools list` and the chat's /tools print: each tool's tokens and
    share of the context window, a total per source (server, file, config tool) and for all, and
    the tool block's fixed wrapper, said once. Its first line names the model whose template counted."""
    lines = [f"prompt tokens each tool adds, counted with {costs.counted_by}:", "  tokens   share  tool"]

    def row(tokens: int, label: str) -> str:
        return f"  {tokens:>6,}  {costs.share(tokens):>6}  {label}"

    by_source = costs.by_source()
    for source, source_total in by_source.items():
        names = [name for name in costs.tokens if costs.sources.get(name, "") == source]
        lines.extend(row(costs.tokens[name], name) for name in names)
        if len(by_source) > 1:
            lines.append(row(source_total, f"= {source or 'no source'} ({_tools(len(names))})"))
    lines.append(row(costs.total, f"= all {_tools(len(costs.tokens))}, of a context of {costs.n_ctx:,} tokens"))
    lines.append(row(costs.wrapper, "+ the template's tool block around them (once, with any tool)"))
    return lines


def _tools(count: int) -> str:
    return f"{count} tool" + ("" if count == 1 else "s")
