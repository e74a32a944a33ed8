"""The input history file: every line typed at the chat prompt, tagged with the conversation it
was typed in, so that deleting a conversation deletes its lines there too.

prompt-toolkit's FileHistory format: an entry is a "# <time>" line followed by "+<line>" lines;
any line without a "+" only separates entries, so a tag after the time is read past. The lines
of a conversation are not only its messages: `/system ...`, `/file PATH`, `/search ...` say as
much, and no message holds them. So each entry's time line names its conversation:

    # 2026-12-07 10:00:00.123456 conversation=<id>
    +/system You are my tax adviser

A line typed before its conversation exists (the chat's first lines: the conversation is created
with the first reply) is tagged with the chat's stretch instead, `chat=<random>`, and once the
conversation exists one line ties the stretch to it:

    # chat=<random> conversation=<id>

`forget_typed_lines` removes a conversation's entries by those tags, and, for entries written
before tags (or by a chat whose tie was never written: killed mid-turn), those whose text is one
of its messages.
"""

from __future__ import annotations

import datetime
import re
import secrets
from pathlib import Path
from typing import Callable

from llmchat.private_files import private_umask, write_private_atomic

_ENTRY_TAG = re.compile(rb"^# .* (conversation|chat)=([0-9A-Za-z_-]+)\n?$")
_TIE = re.compile(rb"^# chat=([0-9A-Za-z_-]+) conversation=([0-9A-Za-z_-]+)\n?$")


class TaggedLines:
    """How a chat writes its typed lines to the input history at `path`: each tagged with the
    conversation `owner()` names (None: not created yet)."""

    def __init__(self, path: Path, owner: Callable[[], str | None]):
        self.path = path
        self._owner = owner
        self._stretch: str | None = None  # the tag of lines typed while no conversation existed

    def entry(self, string: str) -> bytes:
        """One entry as the file holds it (what FileHistory.store_string writes, tagged)."""
        lines = "".join(f"+{line}\n" for line in string.split("\n"))
        return f"\n# {datetime.datetime.now()} {self._tag()}\n{lines}".encode("utf-8", errors="replace")

    def _tag(self) -> str:
        conversation = self._owner()
        if conversation is not None:
            return f"conversation={conversation}"
        if self._stretch is None:
            self._stretch = secrets.token_hex(8)
        return f"chat={self._stretch}"

    def settle(self) -> None:
        """Tie the lines typed before the conversation existed to it, once it does (at each
        prompt, and when the chat ends)."""
        conversation = self._owner()
        if self._stretch is None or conversation is None:
            return
        self.append(f"\n# chat={self._stretch} conversation={conversation}\n".encode())
        self._stretch = None

    def append(self, data: bytes) -> None:
        with private_umask(), open(self.path, "ab") as handle:  # a file removed meanwhile comes back 0600
            handle.write(data)


def forget_typed_lines(path: Path, messages: set[str], conversation_id: str | None = None) -> int:
    """Rewrite the input history at `path` without the entries typed in the conversation
    `conversation_id` (by their tags), and without those whose text is one of `messages` (also
    when typed with the `//` escape); returns how many entries went. Written atomically, 0600."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0
    # A block: the separator lines ("", "# <time> <tag>", ties) before an entry, then its "+" lines.
    blocks: list[tuple[list[bytes], list[bytes]]] = []
    header: list[bytes] = []
    body: list[bytes] = []
    # Split on "\n" alone, as prompt-toolkit reads it: a typed "\r" stays inside its line.
    pieces = raw.split(b"\n")
    for line in [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else []):
        if line.startswith(b"+"):
            body.append(line)
            continue
        if body:
            blocks.append((header, body))
            header, body = [], []
        header.append(line)
    blocks.append((header, body))
    owned = {b"conversation=" + conversation_id.encode()} if conversation_id else set()
    for header, _ in blocks:
        for line in header:
            tie = _TIE.match(line)
            if tie and conversation_id and tie.group(2).decode() == conversation_id:
                owned.add(b"chat=" + tie.group(1))
    kept, dropped = [], 0
    for header, body in blocks:
        header = [line for line in header if not _ties(line, conversation_id)]
        if body and (_tag_of(header) in owned or _typed(body, messages)):
            dropped += 1
            kept += [line for line in header if _TIE.match(line)]  # another conversation's ties stay
            continue
        kept += header + body
    if dropped or len(kept) != sum(len(header) + len(body) for header, body in blocks):
        write_private_atomic(path, b"".join(kept))
    return dropped


def _ties(line: bytes, conversation_id: str | None) -> bool:
    tie = _TIE.match(line)
    return bool(tie and conversation_id and tie.group(2).decode() == conversation_id)


def _tag_of(header: list[bytes]) -> bytes | None:
    """An entry's tag: on the last time line before its "+" lines."""
    for line in reversed(header):
        found = _ENTRY_TAG.match(line)
        if found and not _TIE.match(line):
            return found.group(1) + b"=" + found.group(2)
    return None


def _typed(body: list[bytes], messages: set[str]) -> bool:
    typed = b"".join(line[1:] for line in body).decode("utf-8", "replace").removesuffix("\n")
    stripped = typed.lstrip()
    return typed in messages or (stripped.startswith("//") and stripped[1:] in messages)
