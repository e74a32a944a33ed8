"""Image and audio files pasted or dropped into the chat prompt, as llama.cpp's tools and aider take them.

A terminal that a file is dropped on types its path: bare, quoted ('...' or "..."), with its
spaces escaped (`My\\ Photos/a.png`), or as a `file://` URI. A message that is only such a path
attaches the file to the next message, as `/file PATH` does; a quoted, absolute or `~/` path inside
a message attaches it to that message, whose text stays as typed. Only existing image and audio
files count (recognised by their bytes, llmchat.media.kinds): a path to a text file, or a word that
merely looks like a path, is left alone as text.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from llmchat.attachments import MAX_FILE_BYTES
from llmchat.media.kinds import sniff

_QUOTED = re.compile(r"""(['"])(.+?)\1""")
_HEAD_BYTES = 32  # enough for every signature sniff reads


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
    file = Path(path).expanduser()
    try:
        if not file.is_file() or file.stat().st_size > MAX_FILE_BYTES:
            return False
        with open(file, "rb") as handle:
            return sniff(handle.read(_HEAD_BYTES)) is not None
    except OSError:
        return False
