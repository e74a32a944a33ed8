"""What every slash command handler takes and returns.

A handler gets a `CommandContext` (the session, a rich Console for what the user asked to see,
functions for one-line errors and confirmations, the files pending for the next message) and
returns an `Outcome` telling the chat loop to go on, to exit, to run a turn with some text
(/retry), or to put text back at the prompt (/edit). Nothing here needs a terminal.

Command output is user-facing content, so it goes to stdout; errors and hints go to stderr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from rich.console import Console

    from llmchat.errors import HistoryError
    from llmchat.store.attachment_records import Attachment
    from llmchat.tools.mcp.sources import McpSources
    from llmchat.turn.session import ChatSession

HISTORY_OFF = "history is off for this chat (--no-history, `history = false`, or the store failed); nothing is saved"


class Action(Enum):
    CONTINUE = "continue"  # back to the prompt
    EXIT = "exit"  # leave the chat
    TURN = "turn"  # send `Outcome.text` to the model
    EDIT = "edit"  # put `Outcome.text` back at the prompt, to change and send (/edit)


@dataclass(frozen=True)
class Outcome:
    action: Action = Action.CONTINUE
    text: str | None = None
    # The files a TURN's text goes with (/retry: those of the message sent again); None: the pending ones.
    attachments: tuple[Attachment, ...] | None = None


CONTINUE = Outcome()
EXIT = Outcome(Action.EXIT)


@dataclass
class CommandContext:
    session: ChatSession
    out: Console  # on stdout
    error: Callable[[str], None]  # one line on stderr: errors and hints
    info: Callable[[str], None] = field(default=lambda message: None)  # one dim line on stderr: confirmations
    attachments: list[Attachment] = field(default_factory=list)  # /file: for the next message
    mcp: McpSources | None = None  # the MCP servers /file mcp:..., /resources and /prompt read (chat --mcp, [mcp.*])

    def history_failed(self, err: HistoryError) -> None:
        """A history write failed: the history is off for the rest of the chat, said once."""
        self.error(self.session.disable_history(err, "this chat goes on without saving to the history"))


def one_line(text: str, width: int = 70) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
