"""A file attached to a user message, and the one text format that carries it to the model.

The format lives with the store because the store keeps each file apart from the typed words and
rebuilds the message the model saw from both; reading files from disk and fitting them in the
context is the job of llmchat.turn.attachments, which builds on these definitions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence


@dataclass(frozen=True)
class Attachment:
    path: str  # as the user named it (a glob or folder member: as found); "<stdin>" for -
    size: int  # bytes
    sha256: str
    text: str  # an image's or audio clip's: its marker (llmchat.engine.media.marks)
    media: str = ""  # "image" or "audio" (llmchat.media.kinds); "" for text
    data: bytes = field(default=b"", repr=False, compare=False)  # a media file's bytes, for the engine

    @property
    def block(self) -> str:
        """The attachment as the model sees it: a text file wrapped with its path, media as its
        marker, which the engine replaces by the media's own tokens."""
        return self.text if self.media else wrap(self.path, self.text)

    def describe(self) -> dict[str, object]:
        described: dict[str, object] = {"path": self.path, "size": self.size, "sha256": self.sha256}
        if self.media:
            described["media"] = self.media
        return described


def wrap(path: str, text: str) -> str:
    body = text if text.endswith("\n") or not text else text + "\n"
    return f'<file path="{path.replace(chr(34), "%22")}">\n{body}</file>'


def prefix(attachments: Sequence[Attachment]) -> str:
    """What comes before the typed text in a message that carries `attachments`."""
    return "".join(a.block + "\n\n" for a in attachments)


def typed_part(content: str, attachments: Sequence[Attachment]) -> str:
    """The typed words of a composed message (the inverse of `llmchat.turn.attachments.compose`)."""
    head = prefix(attachments)
    return content[len(head) :] if attachments and content.startswith(head) else content
