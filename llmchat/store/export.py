"""A stored conversation written out for people and other programs: `llmchat history export`.

JSON is the record itself with a format name and version on top, so a reader can tell what it
holds and every field (attachments' text, tool calls, stats) survives; Markdown is for reading,
with reasoning, attachments, tool calls and interruptions marked rather than dumped. A reply
whose model differs from the one before it (`/model NAME` in the chat) names it in its heading;
the JSON has every message's `model` (null: not recorded, before llmchat kept it).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from llmchat.store.records import StoredConversation, StoredMessage

EXPORT_FORMAT = "llmchat-conversation"
EXPORT_VERSION = 1


def export_json(conv: StoredConversation) -> str:
    document = {"format": EXPORT_FORMAT, "version": EXPORT_VERSION, **asdict(conv)}
    return json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n"


def export_markdown(conv: StoredConversation) -> str:
    parts = [_markdown_header(conv)]
    if conv.system_prompt:
        parts.append(f"## System prompt\n\n{conv.system_prompt}\n")
    writer = conv.model  # the model the conversation started on: its replies need no name
    for message in conv.messages:
        switched = message.model is not None and message.model != writer
        parts.append(_markdown_message(message, message.model if switched else None))
        writer = message.model or writer
    return "\n".join(parts)


def _markdown_header(conv: StoredConversation) -> str:
    title = conv.name or f"Conversation {conv.id}"
    lines = [
        f"# {title}",
        "",
        f"- **ID:** `{conv.id}`",
        f"- **Model:** {conv.model} (`{conv.model_path}`)",
        f"- **Template:** {conv.template}",
        f"- **Created:** {conv.created_at}",
        f"- **Updated:** {conv.updated_at}",
    ]
    if conv.parent_id is not None:
        lines.append(f"- **Branch of:** `{conv.parent_id}` at turn {conv.branch_at} (shares turns 1..{conv.branch_at})")
    for child, at in conv.children:
        lines.append(f"- **Branch:** `{child}` at turn {at}")
    if conv.sampling:
        lines.append(f"- **Sampling:** {_key_values(conv.sampling)}")
    return "\n".join(lines) + "\n"


def _markdown_message(message: StoredMessage, new_model: str | None = None) -> str:
    heading = message.role.capitalize() + (f" ({new_model})" if new_model else "")
    lines = [f"## {heading}", "", f"*{message.created_at}*", ""]
    if message.role == "summary":  # a compaction's (llmchat.turn.compaction); the messages it stands for stay
        lines += [
            f"> 🗜 **compacted:** the model's summary of messages 1–{message.summarised} (kept above); "
            "from here on the model saw it in their place",
            "",
        ]
    if message.reasoning:
        # Marked as reasoning, quoted apart from the answer that follows.
        quoted = "\n".join(f"> {line}" if line else ">" for line in message.reasoning.splitlines())
        lines += ["### Reasoning", "", quoted, "", "### Answer", ""]
    for attached in message.attachments:  # marked, not dumped: the files' text is in `export --format json`
        lines += [
            f"> 📎 attached **{attached['path']}** ({attached['size']:,} bytes, sha256 `{attached['sha256'][:16]}…`)",
            "",
        ]
    tool = message.tool or {}
    for call in tool.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = json.dumps(function.get("arguments"), ensure_ascii=False, sort_keys=True)
        lines += [f"> 🔧 tool call `{function.get('name')}({arguments})`", ""]
    if message.role == "tool":
        how = "refused" if tool.get("approved") is False else ("error" if tool.get("error") else "result")
        lines += [f"> 🔧 {how} of `{tool.get('name')}`", ""]
    text = message.typed if message.typed is not None else message.content
    if text or not tool:
        lines += [text, ""]
    if message.interrupted:
        lines += ["> **[interrupted]** this reply was cut off before it finished.", ""]
    details = dict(message.stats)
    if message.finish_reason:
        details = {"finish_reason": message.finish_reason, **details}
    if details:
        lines += [f"<sub>{_key_values(details)}</sub>", ""]
    return "\n".join(lines)


def _key_values(values: dict[str, Any]) -> str:
    return ", ".join(f"{key}={_format_value(value)}" for key, value in values.items())


def _format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
