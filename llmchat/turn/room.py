"""The room a message's files have in the context: one rule for every way a file comes in (`-f` on
ask and chat, `/file` in the chat), counted the way the turn will fit the message.

A turn makes room before it refuses a message: with `--overflow drop` (the default) it trims the
older exchanges (llmchat.turn.conversation.fit_to_context), and with `compact = "auto"` (the default)
it summarises them first (llmchat.turn.compaction). So files fit when they fit in the room the
turn can make, not only in the room free now: in a long chat a file is taken although the window
is full, and the line that says so also says how room will be made. A refusal says what is free
now, what trimming would leave and about what `/compact` would free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable

from llmchat.errors import UsageError
from llmchat.turn.attachments import tokens_of
from llmchat.turn.compaction import CompactionSettings, would_free

if TYPE_CHECKING:
    from collections.abc import Sequence

    from llmchat.store.attachment_records import Attachment
    from llmchat.turn.compaction import Compactable


@dataclass
class Room:
    """The prompt tokens a message's files may take, each way the turn has of making room."""

    n_ctx: int
    reply_reserve: int
    free_now: int  # with the window as it is
    free_trimmed: int | None  # with every older exchange trimmed; None: the turn does not trim (--overflow error)
    exchanges: bool  # the window holds exchanges: something to trim or to compact
    compact_auto: bool  # the turn compacts first when its prompt passes the threshold (compact = "auto")
    _frees: Callable[[], int] = field(repr=False)

    @cached_property
    def compact_frees(self) -> int:
        """About what `/compact` would free now (a summary at its cap); measured only when asked."""
        return self._frees() if self.exchanges else 0

    @property
    def most(self) -> int:
        """The most the turn itself makes: trimming frees every older exchange, more than a summary
        of them; without trimming, what automatic compaction frees."""
        if self.free_trimmed is not None:
            return self.free_trimmed
        return self.free_now + (self.compact_frees if self.compact_auto else 0)


def measure(session: Compactable, typed: str = "") -> Room:
    """The room for files in the next message, `typed` being its words."""
    budget = session.budget()
    conversation = session.conversation
    now = len(session.tokenize_messages(conversation.prompt_messages(typed)))
    trimmed = None
    if session.overflow == "drop":
        alone = conversation.prompt_messages(typed, start=len(conversation.messages))
        trimmed = budget.prompt_limit - len(session.tokenize_messages(alone))
    return Room(
        n_ctx=budget.n_ctx,
        reply_reserve=budget.reply_reserve,
        free_now=budget.prompt_limit - now,
        free_trimmed=trimmed,
        exchanges=bool(conversation.exchange_starts()),
        compact_auto=CompactionSettings.of(session.config).mode == "auto",
        _frees=lambda: would_free(session, typed),
    )


@dataclass
class RoomCheck:
    counts: list[int]  # each file's tokens
    note: str | None = None  # how the turn will make room, where the files fit only once it does


def check_room(
    session: Compactable, attachments: Sequence[Attachment], typed: str = "", *, in_chat: bool = True
) -> RoomCheck:
    """Each attachment's tokens, and how room will be made for them; UsageError (exit 2) naming
    the first file that does not fit in the room the turn can make, before anything is sent.
    `in_chat`: the refusal may name `/compact` (else `--compact auto`, for ask)."""
    room = measure(session, typed)
    counts: list[int] = []
    for attachment in attachments:
        spent = sum(counts)
        count, exact = tokens_of(session, attachment, room=room.most - spent)
        if count > room.most - spent:
            raise UsageError(_refusal(attachment, count, exact, room, spent, in_chat))
        counts.append(count)
    return RoomCheck(counts, _making_room(room, sum(counts)))


def _refusal(attachment: Attachment, count: int, exact: bool, room: Room, spent: int, in_chat: bool) -> str:
    free_now = room.free_now - spent
    text = (
        f"{attachment.path} ({attachment.size:,} bytes, {'' if exact else 'at least '}{count:,} tokens) "
        f"does not fit: {max(free_now, 0):,} tokens are free in the context of {room.n_ctx:,} "
        f"({room.reply_reserve:,} kept for the reply)"
    )
    if not room.exchanges:
        return text + "; raise --ctx or attach less"
    if room.free_trimmed is not None:
        text += f", {max(room.free_trimmed - spent, 0):,} with the older exchanges trimmed"
    compact = "/compact" if in_chat else "compacting (--compact auto)"
    text += f", and {compact} would free about {room.compact_frees:,}"
    if room.free_trimmed is None and not room.compact_auto and count <= free_now + room.compact_frees:
        return text + f"; {'run /compact first' if in_chat else 'add --compact auto'}, raise --ctx or attach less"
    return text + "; raise --ctx or attach less"


def _making_room(room: Room, needed: int) -> str | None:
    """The line for files that fit only once the turn makes room; None where they fit as it is."""
    if needed <= room.free_now:
        return None
    if room.compact_auto:
        return "the next message makes room for them: the older exchanges are summarised first (compact = auto)"
    frees = room.compact_frees
    instead = f"; /compact first would free about {frees:,} tokens and keep their gist" if frees else ""
    return f"the next message makes room for them: the older exchanges leave the context (trimmed){instead}"
