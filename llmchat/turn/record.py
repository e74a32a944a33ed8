"""The result of one turn and the one JSON record every mode prints (`ask --json`, scripted
`chat --json`, `batch`); docs/json-record.md's table documents its keys, in order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmchat.engine.reply import ServerCall
    from llmchat.store.attachment_records import Attachment
    from llmchat.tools.spec import CallRecord
    from llmchat.turn.metrics import TurnStats


@dataclass
class TurnResult:
    user: str
    reply: str
    finish_reason: str
    stats: TurnStats
    seed: int
    model: str = ""
    template: str = ""
    conversation_id: str | None = None
    saved: bool = False  # written to the history store
    notices: list[str] = field(default_factory=list)  # one line each for stderr: trims, a failed save
    reasoning: str | None = None  # a reasoning model's thinking, apart from `reply` (None: it has none)
    parsed: Any = None  # structured output: the reply's decoded JSON, once it validated
    error: str | None = None  # structured output: why the reply is not what was asked (invalid, cut off)
    token_ids: list[int] | None = None  # the reply as sampled, when they spell it exactly (not in records)
    attachments: tuple[Attachment, ...] = ()  # files sent inside `user` (llmchat.turn.attachments; not in records)
    # A turn with tools offered: each call (llmchat.tools.spec), and the assistant `tool_calls` and
    # `tool` messages that go between the user's message and the reply. None: no tools offered.
    tool_calls: list[CallRecord] | None = None
    tool_messages: list[dict[str, Any]] = field(default_factory=list)
    raw_reply: str = ""  # everything decoded, thinking and markup included (a tool round's parser reads it)
    # The calls a server returned apart from the text (tools sent natively; llmchat.tools.native).
    server_calls: list[ServerCall] = field(default_factory=list)

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == "interrupted"

    def to_record(self, record_id: Any = None) -> dict[str, Any]:
        """The one JSON record of a turn (`ask --json`, scripted `chat --json`, `batch`)."""
        return _record(
            record_id,
            reply=self.reply,
            reasoning=self.reasoning,
            finish_reason=self.finish_reason,
            seed=self.seed,
            model=self.model,
            template=self.template,
            conversation_id=self.conversation_id,
            saved=self.saved,
            stats=self.stats.to_dict(),
            error=self.error,
            parsed=self.parsed,
            tool_calls=None if self.tool_calls is None else [call.as_json() for call in self.tool_calls],
        )


def error_record(record_id: Any, message: str, *, model: str = "", template: str = "") -> dict[str, Any]:
    """The record of a turn that produced no reply: the same keys as `TurnResult.to_record`."""
    return _record(record_id, finish_reason="error", model=model, template=template, error=message.replace("\n", " "))


def _record(
    record_id: Any,
    *,
    reply: str | None = None,
    reasoning: str | None = None,
    finish_reason: str,
    seed: int | None = None,
    model: str,
    template: str,
    conversation_id: str | None = None,
    saved: bool = False,
    stats: dict[str, Any] | None = None,
    error: str | None,
    parsed: Any = None,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Both kinds of record are built here, so they cannot drift apart."""
    return {
        "id": record_id,
        "reply": reply,
        "reasoning": reasoning,
        "finish_reason": finish_reason,
        "seed": seed,
        "model": model,
        "template": template,
        "conversation_id": conversation_id,
        "saved": saved,
        "stats": stats,
        "error": error,
        "parsed": parsed,
        "tool_calls": tool_calls,
    }


RECORD_KEYS = tuple(error_record(None, ""))  # the keys, in order (read from the one builder)
