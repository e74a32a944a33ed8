"""The generic tool format, for templates that know nothing of tools (llama.cpp's "generic").

The tools are described in the system message, and the reply must be one JSON object: either
`{"tool_call": {"name": ..., "arguments": {...}}}` or `{"response": "..."}`. reply_schema() is the
JSON schema of that reply, per tool, for the grammar gate to enforce. Earlier calls and results go
back as JSON text in ordinary assistant and user messages, which every template can render.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmchat.tools.spec import ToolSpec


def notice(template_label: str, missing: tuple[str, ...] = ()) -> str:
    """The one line said when a template gets the generic format: which template, and why."""
    why = f" ({'; '.join(missing)})" if missing else ""
    return f"{template_label} shows no tool call format{why}; " + NOTICE.split("; ", 1)[1]


NOTICE = (
    "this model's chat template has no tool format; tools are described in the system message and the "
    'reply is held to {"tool_call": ...} or {"response": ...} (the generic format)'
)


def system_text(tools: Sequence[ToolSpec]) -> str:
    described = json.dumps([spec.openai_tool()["function"] for spec in tools], indent=2, ensure_ascii=False)
    return (
        "You can call tools. Available tools, as JSON schemas:\n"
        f"{described}\n\n"
        "Respond in JSON format, with exactly one object: either with `tool_call` (a request to call a "
        'tool: {"tool_call": {"name": ..., "arguments": {...}}}) or with `response` (your reply to the '
        "user's request, as a string). Once a tool has given you what you need, respond with the answer."
    )


def call_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """A reply that calls one of the tools with valid arguments (a forced call: `--tool-choice required`)."""
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": spec.name}, "arguments": spec.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for spec in tools
    ]
    return {
        "type": "object",
        "properties": {"tool_call": {"oneOf": calls} if calls else False},
        "required": ["tool_call"],
        "additionalProperties": False,
    }


def response_schema() -> dict[str, Any]:
    """A reply that answers the user (the round after the chain limit: no more calls)."""
    return {
        "type": "object",
        "properties": {"response": {"type": "string"}},
        "required": ["response"],
        "additionalProperties": False,
    }


def reply_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """The reply as JSON schema: a call to one of the tools with valid arguments, or a response."""
    return {"oneOf": [call_schema(tools), response_schema()]}


def with_system_text(messages: Sequence[dict[str, Any]], tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """The tools' description added to the system message (a new one first when there is none)."""
    text = system_text(tools)
    shaped = [dict(m) for m in messages]
    if shaped and shaped[0].get("role") == "system":
        shaped[0]["content"] = f"{shaped[0].get('content') or ''}\n\n{text}".lstrip()
        return shaped
    return [{"role": "system", "content": text}, *shaped]


def as_plain_messages(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls as the JSON the model wrote, tool results as user messages holding
    `{"tool_response": {"tool": NAME, "content": TEXT}}` (minja's polyfill, which llama.cpp uses)."""
    plain: list[dict[str, Any]] = []
    for message in messages:
        if message.get("role") == "assistant" and message.get("tool_calls"):
            calls = [call.get("function", call) for call in message["tool_calls"]]
            if len(calls) == 1:
                body: dict[str, Any] = {"tool_call": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}
            else:
                body = {"tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in calls]}
            plain.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif message.get("role") == "tool":
            response = {"tool_response": {"tool": message.get("name", ""), "content": message.get("content", "")}}
            plain.append({"role": "user", "content": json.dumps(response, ensure_ascii=False)})
        else:
            plain.append({"role": message["role"], "content": message.get("content") or ""})
        if message.get("role") == "assistant" and message.get("reasoning_content"):
            plain[-1]["reasoning_content"] = message["reasoning_content"]  # the template decides (render.py)
    return plain
