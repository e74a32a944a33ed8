"""Where a finished turn goes: the history store and the KV cache on disk, under one failure policy.

A failed write never raises after the reply: it turns that store off for the rest of the session
and puts one warning in the result's notices (`saved=False` for the history). The KV cache on disk
is the conversation in another form: it goes wherever the history goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmchat.errors import HistoryError

if TYPE_CHECKING:
    from llmchat.engine.kv_store import KVStore
    from llmchat.store.history import HistoryStore
    from llmchat.turn.record import TurnResult


@dataclass
class ConversationFacts:
    """What the history stores about a conversation when its first turn is saved."""

    model: str
    model_path: str
    template: str
    system_prompt: str | None
    sampling: dict[str, Any]


class TurnSink:
    def __init__(self, history: HistoryStore | None = None, kv_store: KVStore | None = None):
        self.history = history
        self.kv_store = kv_store
        self.conversation_id: str | None = None

    def save(
        self,
        result: TurnResult,
        facts: ConversationFacts,
        sampling: dict[str, Any],
        *,
        fork_from: tuple[str, int] | None = None,
    ) -> None:
        """Write the turn to the history (a conversation is created with its first turn; with
        `fork_from`, as a branch of that conversation sharing that many turns: llmchat.turn.branches)."""
        if self.history is None:
            return
        try:
            if self.conversation_id is None and fork_from is not None:
                self.conversation_id = self.history.fork(*fork_from)
            if self.conversation_id is None:
                self.conversation_id = self.history.new_conversation(
                    model=facts.model,
                    model_path=facts.model_path,
                    template=facts.template,
                    system_prompt=facts.system_prompt,
                    sampling=facts.sampling,
                )
            self.history.add_turn(
                self.conversation_id,
                result.user,
                result.reply,
                interrupted=result.interrupted,
                finish_reason=result.finish_reason,
                stats=result.stats.to_dict(),
                sampling=sampling | {"seed": result.seed},
                reasoning=result.reasoning,
                attachments=result.attachments,
                tool_messages=stored_tool_messages(result),
                model=result.model or None,
            )
            result.saved = True
        except HistoryError as err:
            result.notices.append(self.disable_history(err, "this reply was not saved, and nothing more will be"))

    def save_kv(self, result: TurnResult) -> None:
        """Write this turn's KV cache to disk for the next process. A failed write costs only speed
        later: it turns the disk cache off with one notice, and never fails the turn."""
        if self.kv_store is None:
            return
        try:
            self.kv_store.save(result.conversation_id)
        except OSError as err:
            self.kv_store = None
            result.notices.append(f"warning: KV cache not saved ({err.strerror or err}); the disk cache is off now")

    def use_kv_store(self, kv_store: KVStore | None) -> None:
        """Another engine's KV cache on disk (`/model NAME`: a file is used only by the engine
        that can read it, llmchat.engine.kv_store)."""
        self.kv_store = kv_store

    def disable_history(self, err: Exception, consequence: str) -> str:
        """A history write failed (locked, disk full, read-only): stop using the store for the rest
        of the session. Returns the one warning line to show; once the store is gone nothing writes
        to it again, so the warning cannot repeat."""
        store, self.history = self.history, None
        self.kv_store = None  # the conversation in another form: it goes wherever history goes
        if store is not None:
            try:
                store.close()
            except Exception:  # the store is already broken; closing is a courtesy
                pass
        return f"warning: {err}; {consequence}"

    def close(self) -> None:
        if self.history is not None:
            self.history.close()


def stored_tool_messages(result: TurnResult) -> list[dict[str, Any]]:
    """A tool turn's messages as the history keeps them: each result with how its call went."""
    calls = iter(result.tool_calls or [])
    stored = []
    for message in result.tool_messages:
        message = dict(message)
        if message.get("role") == "tool":
            call = next(calls, None)
            if call is not None:
                message.update(approved=call.approved, duration_s=round(call.duration_s, 6))
                if call.error is not None:
                    message["error"] = True
        stored.append(message)
    return stored
