"""What a chat's commands change in a session: the conversation they start anew, load, cut or
undo, and the settings and tools they set for the next turns.

`ChatSession` (llmchat.turn.session) inherits these methods, so the session stays the one owner of its
fields: the commands call the methods and never write the fields. They live in a module of their
own so that llmchat.turn.session keeps to the turn.

Each is marked `interrupts.changes_state`: inside a chat command, calling one begins the command's
change, and a Ctrl-C from then on waits until the command is over (llmchat.interrupts.Command), so
no change is left half made: a conversation loaded under the old one's id, a saved prompt's system
prompt set without its sampling, an exchange gone from the conversation but not from the history.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from llmchat import interrupts
from llmchat.turn.branches import fork_point
from llmchat.turn.conversation import Conversation

if TYPE_CHECKING:
    from llmchat.engine.sampling import SamplingParams
    from llmchat.store.records import StoredConversation
    from llmchat.tools.offer import ToolOffer
    from llmchat.turn.record import TurnResult
    from llmchat.turn.sink import TurnSink


class SessionChanges:
    """The changes a chat's commands make; the fields are ChatSession's (a dataclass)."""

    conversation: Conversation
    conversation_id: str | None  # the sink's: the stored conversation the next turn is saved to
    last_result: TurnResult | None
    fork_from: tuple[str, int] | None
    sampling: SamplingParams
    origins: dict[str, str]
    tools: ToolOffer | None
    sink: TurnSink

    @interrupts.changes_state
    def new_conversation(self) -> None:
        """`/clear`: a fresh conversation with the same model, template and system prompt."""
        self.conversation = Conversation(system=self.conversation.system)
        self.conversation_id = None
        self.last_result = None
        self.fork_from = None

    @interrupts.changes_state
    def load_conversation(self, stored: StoredConversation) -> None:
        """Continue a conversation from the history store."""
        self.conversation = Conversation.from_stored(stored)
        self.conversation_id = stored.id
        self.last_result = None
        self.fork_from = None

    @interrupts.changes_state
    def keep_turns(self, turns: int) -> None:
        """/branch N and /edit: cut the conversation in memory to its first `turns` turns, and make
        the next saved turn fork the stored conversation there (nothing is written until then). An
        unsaved conversation (history off, or no reply yet) is only cut."""
        self.conversation.keep_turns(turns)
        self.fork_from = fork_point(self.conversation_id, self.fork_from, turns)
        self.conversation_id = None
        self.last_result = None

    @interrupts.changes_state
    def set_sampling(self, sampling: SamplingParams) -> None:
        self.sampling = sampling

    @interrupts.changes_state
    def set_origin(self, value: str, source: str) -> None:
        """Say where a value the session holds came from (`-p NAME`, `/prompt NAME`), for /show."""
        self.origins[value] = source

    @interrupts.changes_state
    def use_tools(self, offer: ToolOffer | None) -> None:
        """Offer these tools (llmchat.tools.offer) from the next turn on; None: no tools."""
        self.tools = offer

    @interrupts.changes_state
    def with_system(self, system: str | None) -> None:
        self.conversation = replace(self.conversation, system=system or None)
        if self.sink.history is not None and self.conversation_id is not None:
            self.sink.history.update_system_prompt(self.conversation_id, system or None)

    @interrupts.changes_state
    def drop_last_exchange(self, *, keep_in_history: bool = False) -> dict[str, Any] | None:
        """Remove the last exchange (`Conversation.drop_last_exchange`: the last user message and
        everything after it, a tool turn's calls and results or an interrupted reply included).
        Returns its user message; None when there was none.

        /undo and /retry: a saved exchange leaves the history too; a store that fails raises
        HistoryError once the conversation has changed. /edit (`keep_in_history`): the stored
        conversation keeps it, and the next saved turn starts a branch that shares the turns before
        it (llmchat.turn.branches). A branch not saved yet shares at most the turns that are left."""
        user = self.conversation.drop_last_exchange()
        if user is None:
            return None
        self.last_result = None
        if keep_in_history or self.conversation_id is None:
            turns_left = sum(1 for message in self.conversation.messages if message["role"] == "user")
            self.fork_from = fork_point(self.conversation_id, self.fork_from, turns_left)
            self.conversation_id = None
        elif self.sink.history is not None:
            self.sink.history.delete_last_exchange(self.conversation_id)
        return user

    @interrupts.changes_state
    def offer_tools(self, on: bool) -> None:
        """/tool on|off: offer the tools to the model from the next turn, or not. Switched on after
        `--tool-choice none`, the model chooses (`auto`)."""
        if self.tools is None:
            return
        self.tools.enabled = on
        if on and self.tools.choice.mode == "none":
            from llmchat.tools.choice import ToolChoice

            self.tools.choice = ToolChoice("auto")
