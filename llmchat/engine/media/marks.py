"""How media stand in a message's text and in a prompt's token ids (pure Python, no llama_cpp).

- In a message, an attached image or audio clip is its marker, `<__media__ SHA256>`: the text the
  chat template renders where the user message has it. The engine replaces a marker whose media it
  was given (`Engine.add_media`) by the media's tokens; any other text, a marker typed by hand
  included, stays text. The hash names the bytes, so a conversation re-rendered each turn renders
  the same marker in the same place.
- In a prompt's token ids, each position of a media chunk is a negative id derived from the
  media's hash and the position (`sentinels`). The KV cache's token list holds them like any
  other id, so the longest common prefix of two prompts covers an image only when both hold the
  same image at the same place: the turn after an image turn does not encode it again. The ids
  stay within int32, as the KV cache on disk stores them, and never reach llama.cpp as tokens.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"<__media__ ([0-9a-f]{64})>")
_SPAN = 1 << 30  # sentinels lie in [-2^31, -2^30): no real token id and not -1 ("none")


def marker(sha256: str) -> str:
    """The text that stands for the media with this SHA-256 (hex) in a message."""
    return f"<__media__ {sha256}>"


def sentinels(sha256: str, count: int, first: int = 0) -> list[int]:
    """The ids that stand for positions `first` to `first + count` of one media's chunks in a prompt."""
    base = int(sha256[:15], 16) % _SPAN
    return [-_SPAN - ((base + first + i) % _SPAN) for i in range(count)]


def is_media(token: int) -> bool:
    return token <= -_SPAN


def count_media(tokens: list[int]) -> int:
    """How many of a prompt's positions are media (image or audio embeddings), not text tokens."""
    return sum(1 for token in tokens if token <= -_SPAN)
