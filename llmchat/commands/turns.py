"""What ask and scripted chat share around a turn: running it with a display, reporting it.

The session owns the turn's outcome (llmchat.turn.session); this module only shows it.
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

from llmchat.errors import UsageError
from llmchat.output import notice

if TYPE_CHECKING:
    from llmchat.output import StreamPrinter
    from llmchat.store.attachment_records import Attachment
    from llmchat.turn.record import TurnResult
    from llmchat.turn.session import ChatSession

OVERFLOW_MODES = ("drop", "error")


def check_overflow(value: str) -> None:
    if value not in OVERFLOW_MODES:
        raise UsageError(f"--overflow must be drop or error, got {value!r}")


def run_turn(
    session: ChatSession, text: str, printer: StreamPrinter, attachments: tuple[Attachment, ...] = ()
) -> TurnResult:
    """One turn with a live display; the display is restored whatever happens, and the turn's
    notices (a trim, a failed save) are shown once, after the reply. `attachments`: files sent
    before `text` (llmchat.turn.attachments)."""
    from llmchat.turn.attachments import compose

    try:
        if attachments:
            result = session.turn(compose(attachments, text), printer, attachments=attachments)
        else:
            result = session.turn(text, printer)
    except BaseException:
        printer.abort()
        raise
    show_notices(result, printer.err)
    return result


def show_notices(result: TurnResult, stderr: IO[str]) -> None:
    """Every mode says the same things on stderr after a turn: what a trim dropped, a failed save."""
    for line in result.notices:
        notice(line, stderr)


def continue_conversation(session: ChatSession, reference: str) -> None:
    if session.history is None:
        raise UsageError("continuing a conversation needs the history; drop --no-history")
    session.load_conversation(session.history.get(reference))
