"""A file attached to a user message, and the one text format that carries it to the model.

The format lives with the store because the store keeps each file apart from the typed words and
rebuilds the message the model saw from both; reading files from disk and fitting them in the
context is the job of llmchat.attachments, which builds on these definitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Attachment:
    path: str  # as the user named it (a glob or folder member: as found); "<stdin>" for -
    size: int  # bytes
    sha256: str
    text: str

    @property
    def block(self) -> str:
        """The attachment as the model sees it."""
        return wrap(self.path, self.text)

    def describe(self) -> dict[str, object]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


def wrap(path: str, text: str) -> str:
    body = text if text.endswith("\n") or not text else text + "\n"
    return f'<file path="{path.replace(chr(34), "%22")}">\n{body}</file>'


def prefix(attachments: Sequence[Attachment]) -> str:
    """What comes before the typed text in a message that carries `attachments`."""
    return "".join(a.block + "\n\n" for a in attachments)


def typed_part(content: str, attachments: Sequence[Attachment]) -> str:
    """The typed words of a composed message (the inverse of `llmchat.attachments.compose`)."""
    head = prefix(attachments)
    return content[len(head) :] if attachments and content.startswith(head) else content
