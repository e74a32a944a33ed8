"""The tool list and tool messages in the shape a chat template expects, rendered in the sandbox.

- template_variables(): `tools` (OpenAI-style entries, what Hugging Face templates read), plus
  `functions` and `datetime` for the templates that read them (Firefunction v2);
- assistant_tool_calls() / tool_result(): the messages that carry calls and results, so the
  template writes them the model's own way;
- render_tool_prompt(): one render through llmchat's sandbox (llmchat.prompt.sandbox), the same one every
  chat template goes through. The generic family (a template with no tool support) gets the tools
  in its system message instead, and calls/results as plain JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from llmchat.prompt.sandbox import TemplateRenderError, compile_template, render_compiled
from llmchat.tools import generic
from llmchat.tools.families import GENERIC, Family, call_text, detect_family
from llmchat.tools.spec import EMPTY_OBJECT_SCHEMA, ToolSpec

_PROBE_TOOL = "llmchat_probe_listed"  # the tool in the list
_PROBE_CALL = "llmchat_probe_called"  # the tool in the call: a different name, so the list cannot answer for it


def call_id(index: int) -> str:
    """Call ids of exactly nine letters and digits: Mistral's templates refuse any other shape."""
    return f"call{index:05d}"


def assistant_tool_calls(
    calls: Sequence[tuple[str, Any]], content: str = "", first_index: int = 0, reasoning: str | None = None
) -> dict[str, Any]:
    """The assistant message for calls [(name, arguments)], in the OpenAI shape templates read.
    `reasoning`: the thinking before the calls, as `reasoning_content`: the templates that keep it
    across a turn's rounds (GLM, Kimi K2 Thinking, MiniMax, DeepSeek V3.2+) show it to the next
    round (llmchat.prompt.reasoning_history)."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": call_id(first_index + n), "type": "function", "function": {"name": name, "arguments": arguments}}
            for n, (name, arguments) in enumerate(calls)
        ],
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def tool_result(index: int, name: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id(index), "name": name, "content": text}


@lru_cache(maxsize=1)
def _process_start() -> datetime:
    """One time per process: a clock that moved between rounds would change the system prompt
    and defeat the KV-prefix reuse."""
    return datetime.now(timezone.utc)


def template_variables(family: Family, tools: Sequence[ToolSpec], now: datetime | None = None) -> dict[str, Any]:
    if family is GENERIC or not tools:
        return {}
    entries = [spec.openai_tool() for spec in tools]
    variables: dict[str, Any] = {"tools": entries}
    if family.needs_functions:
        # Firefunction v2 reads the function specs as JSON text and today's date (llama.cpp's format).
        variables["functions"] = json.dumps([entry["function"] for entry in entries], indent=4)
        variables["datetime"] = (now or _process_start()).strftime("%b %d %Y %H:%M:%S GMT")
    return variables


@dataclass(frozen=True)
class Capabilities:
    """What a template does with tools, found by rendering probes (as minja and llama.cpp do):
    whether it prints the tool list, and which assistant content makes it print a call ("" or
    None); `calls_as_text` when it prints neither, so calls go in the content as the model wrote them."""

    renders_tools: bool
    call_content: str | None = ""
    calls_as_text: bool = False


@lru_cache(maxsize=32)
def _capabilities(template_source: str, family: Family) -> Capabilities:
    compiled = compile_template(template_source, "the chat template")
    probe = ToolSpec(_PROBE_TOOL, "probe", EMPTY_OBJECT_SCHEMA, "probe", lambda arguments, timeout_s: "")
    user = {"role": "user", "content": "hi"}

    def renders(messages: list[dict[str, Any]], tools: bool, name: str) -> bool:
        context = {
            **(template_variables(family, [probe]) if tools else {}),
            "messages": _native_shape(messages, family),
            "add_generation_prompt": False,
            "bos_token": "",
            "eos_token": "",
        }
        try:
            return name in render_compiled(compiled, context, "the chat template")
        except TemplateRenderError as err:
            if err.kind in ("refused", "limit"):
                raise
            return False

    renders_tools = renders([user], True, _PROBE_TOOL)
    for content in ("", None):
        call = assistant_tool_calls([(_PROBE_CALL, {})], content="")
        call["content"] = content
        # Followed by its result (not by a user message: Mistral's templates refuse user after user).
        result = tool_result(0, "llmchat_probe_result", "ok")
        if renders([user, call, result], True, _PROBE_CALL):
            return Capabilities(renders_tools, content)
    return Capabilities(renders_tools, "", calls_as_text=True)


def capabilities(template_source: str, family: Family) -> Capabilities:
    if family is GENERIC:
        return Capabilities(renders_tools=False, calls_as_text=True)
    return _capabilities(template_source, family)


def messages_for_template(
    messages: Sequence[Mapping[str, Any]],
    family: Family,
    tools: Sequence[ToolSpec],
    caps: Capabilities | None = None,
) -> list[dict[str, Any]]:
    """Messages as this family's template takes them. Arguments become JSON text where the template
    concatenates them. Where the template does not print the tool list or the calls itself, the
    tools are described in the system message and the calls written into the content, in the
    family's own syntax; the generic family gets plain JSON messages throughout."""
    if family is GENERIC:
        plain = generic.as_plain_messages([dict(m) for m in messages])
        return generic.with_system_text(plain, tools) if tools else plain
    caps = caps or Capabilities(renders_tools=True)
    shaped: list[dict[str, Any]] = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            if caps.calls_as_text:
                calls = [call.get("function", call) for call in message["tool_calls"]]
                written = "".join(call_text(family, c["name"], c["arguments"]) for c in calls)
                message = {"role": "assistant", "content": (message.get("content") or "") + written}
            elif not message.get("content"):
                message["content"] = caps.call_content
        shaped.append(message)
    shaped = _native_shape(shaped, family)
    if tools and not caps.renders_tools:
        shaped = _with_system_text(shaped, _tools_system_text(family, tools))
    return shaped


def _native_shape(messages: list[dict[str, Any]], family: Family) -> list[dict[str, Any]]:
    if not family.arguments_as_text:
        return messages
    return [
        {**m, "tool_calls": [_arguments_as_text(call) for call in m["tool_calls"]]} if m.get("tool_calls") else m
        for m in messages
    ]


def _tools_system_text(family: Family, tools: Sequence[ToolSpec]) -> str:
    described = json.dumps([spec.openai_tool()["function"] for spec in tools], indent=2, ensure_ascii=False)
    example = call_text(family, tools[0].name, {"<argument>": "<value>"})
    return f"You can call these tools:\n{described}\n\nTo call a tool, reply with:\n{example}"


def _with_system_text(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".lstrip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _arguments_as_text(call: Mapping[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function", {}))
    if not isinstance(function.get("arguments"), str):
        function["arguments"] = json.dumps(function.get("arguments", {}), ensure_ascii=False)
    return {**call, "function": function}


def render_tool_prompt(
    template_source: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[ToolSpec],
    *,
    family: Family | None = None,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    variables: Mapping[str, Any] | None = None,
    label: str = "the chat template",
    now: datetime | None = None,
) -> str:
    """The prompt text for a conversation with tools, rendered by the sandboxed renderer."""
    family = family or detect_family(template_source)
    caps = capabilities(template_source, family)
    context = {
        **(variables or {}),
        **template_variables(family, tools, now),
        "messages": messages_for_template(messages, family, tools, caps),
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
    }
    return render_compiled(compile_template(template_source, label), context, label)
