"""Images and audio for a server that renders its own chat template: OpenAI-style content parts.

In a message an attached image or audio clip is its marker (llmchat.engine.media.marks). An
OpenAI-compatible server (llama-server started with `--mmproj`, vLLM, Ollama's /v1) takes media as
content parts instead: an image as `{"type": "image_url", "image_url": {"url": "data:image/png;
base64,..."}}`, audio as `{"type": "input_audio", "input_audio": {"data": BASE64, "format":
"wav"}}`. `RemoteMedia` keeps the bytes the engine was given, by their SHA-256, and turns a
message whose text holds their markers into parts, in the markers' order: the server then puts
each where the template puts the user message, as the local engine does. A marker of media the
engine was not given stays text, as it does locally.

How many positions an image takes is the server's projector's business: until the server's
`usage` says, the prompt is counted with `ESTIMATE` per media part (on the high side, so that
trimming runs early rather than the server refusing the prompt).
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any, Protocol

from llmchat.engine.media.marks import MARKER

# Positions counted for a media part before the server says: a 448-pixel image on most projectors
# (Gemma 3 makes 256 of any image, Qwen-VL up to about 1,000 of a large one).
ESTIMATE = {"image": 256, "audio": 750}
_MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "BMP": "image/bmp"}


@dataclass(frozen=True)
class MediaPart:
    kind: str  # image | audio
    format: str  # PNG, JPEG, GIF, BMP, WAV, MP3, FLAC (llmchat.media.kinds)
    data: bytes = b""

    def encoded(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def part(self) -> dict[str, Any]:
        encoded = self.encoded()
        if self.kind == "audio":
            return {"type": "input_audio", "input_audio": {"data": encoded, "format": self.format.lower()}}
        return {
            "type": "image_url",
            "image_url": {"url": f"data:{_MIME.get(self.format, 'image/png')};base64,{encoded}"},
        }


class RemoteMedia:
    """The media a server engine was given, by SHA-256; the engine owns it."""

    def __init__(self) -> None:
        self.items: dict[str, MediaPart] = {}

    def add(self, data: bytes, kind: str, format: str) -> int:
        """Keep these bytes for the messages whose markers name them; the positions they are counted at."""
        self.items.setdefault(hashlib.sha256(data).hexdigest(), MediaPart(kind, format, data))
        return ESTIMATE.get(kind, ESTIMATE["image"])

    def wire(self, message: dict[str, Any]) -> dict[str, Any]:
        """The message with its text cut into text and media parts where it holds markers of known media."""
        content = message.get("content")
        if not self.items or not isinstance(content, str) or "<__media__ " not in content:
            return message
        parts: list[dict[str, Any]] = []
        at = 0
        for found in MARKER.finditer(content):
            item = self.items.get(found.group(1))
            if item is None:
                continue
            if found.start() > at:
                parts.append({"type": "text", "text": content[at : found.start()]})
            parts.append(item.part())
            at = found.end()
        if not parts:
            return message
        if at < len(content):
            parts.append({"type": "text", "text": content[at:]})
        return {**message, "content": parts}


class TakesRemoteMedia(Protocol):
    """A server's engine that takes media (OpenAI-compatible, or llama-server's token-id path,
    llmchat.engine.media.server): what llmchat.media.use hands them to."""

    @property
    def media(self) -> RemoteMedia: ...
    def add_media(self, data: bytes, kind: str, format: str) -> int: ...


def text_of(content: Any) -> str:
    """A message content's text: the string, or its text parts joined."""
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content or "")


def estimated_media(messages: list[dict[str, Any]]) -> int:
    """The positions counted for the messages' media parts (`ESTIMATE` each)."""
    total = 0
    for message in messages:
        content = message.get("content")
        for part in content if isinstance(content, list) else ():
            kind = {"image_url": "image", "input_audio": "audio"}.get(str(part.get("type")))
            total += ESTIMATE[kind] if kind else 0
    return total
