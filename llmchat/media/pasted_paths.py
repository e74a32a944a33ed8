"""Image and audio files pasted or dropped into the chat prompt, as llama.cpp's tools and aider take them.

A terminal that a file is dropped on types its path: bare, quoted ('...' or "..."), with its
spaces escaped (`My\\ Photos/a.png`), or as a `file://` URI. A message that is only such a path
attaches the file to the next message, as `/file PATH` does. A quoted, absolute or `~/` path inside
a longer message is not attached: the message may only talk about the file ("what does the name
'~/scans/id-card.png' say?"), and an attached picture would go with it, to a server too. The chat
says in one line how to attach it (`/image PATH`). Only existing image and audio files count
(recognised by their bytes, llmchat.media.kinds): a path to a text file, or a word that merely
looks like a path, is left alone as text.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from llmchat.edges.bounded_input import HEAD_BYTES, open_regular
from llmchat.errors import UsageError
from llmchat.media.kinds import sniff

_QUOTED = re.compile(r"""(['"])(.+?)\1""")


def pasted_media(text: str) -> tuple[list[str], bool]:
    """The paths of existing image or audio files in a typed message, and whether the message is
    nothing but one of them."""
    whole = _clean(text.strip())
    if whole and _is_media_file(whole):
        return [whole], True
    found: list[str] = []
    for match in _QUOTED.finditer(text):
        path = _clean(match.group(2))
        if path not in found and _is_media_file(path):
            found.append(path)
    for word in text.split():
        if word.startswith(("/", "~/", "file://")):
            # The word, or the word less a sentence's full stop or question mark after it.
            tried = [_clean(w) for w in (word, word.rstrip(".,;:!?)"))]
            hit = next((path for path in tried if _is_media_file(path)), None)
            if hit is not None and hit not in found:
                found.append(hit)
    return found, False


def _clean(candidate: str) -> str:
    """The path a dropped file's text means: unquoted, unescaped, a file:// URI made a path."""
    text = candidate.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    if text.startswith("file://"):
        text = unquote(urlparse(text).path)
    return re.sub(r"\\(.)", r"\1", text) if "\\ " in text or "\\(" in text else text


def _is_media_file(path: str) -> bool:
    if not path or "\n" in path or len(path) > 4096:
        return False
    try:
        fd, _ = open_regular(Path(path).expanduser(), path)  # a FIFO's path: never waited on
    except (OSError, UsageError):
        return False
    with os.fdopen(fd, "rb") as handle:
        return sniff(handle.read(HEAD_BYTES)) is not None
