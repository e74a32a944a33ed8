"""The markers some chat templates wrap a plain reply in: Command R7B's `<|START_RESPONSE|>…
<|END_RESPONSE|>`, Cohere2's `<|START_TEXT|>…<|END_TEXT|>`, Kimi K3's `<|open|>response<|sep|>…`.

The template writes them itself around every earlier assistant message, so they are no part of the
reply: not shown, not recorded, not sent back (the next prompt would hold them twice).
`reply_content` is the one rule for a finished reply (the format analysis' `ChatFormat.unwrap`):
a plain turn's result (llmchat.turn.stats), each tool round once its calls are found and
`template parse` (llmchat.turn.reading) all read through it. `MarkerFilter` shows a reply as it
streams the way `reply_content` will read it once it has ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmchat.prompt.format_analysis import analyze

if TYPE_CHECKING:
    from llmchat.prompt.layout import ChatFormat


def reply_content(template_source: str, answer: str) -> str:
    """A reply's answer without the markers `template_source` wraps a reply in (unchanged where
    it wraps none, or where the reply does not carry them)."""
    return analyze(template_source).unwrap(answer)


class MarkerFilter:
    """A reply's answer as it streams, less the template's content markers.

    The opening marker can only come first (after whitespace): while the text so far could still
    be its beginning, it is held; once it is the marker, the marker goes, and once it cannot be,
    the held text goes out as it came. The closing marker is never shown: a tail that could be its
    beginning waits for the next fragment, and from the marker on nothing is shown. At the end
    (`flush`) the reply is read whole with `reply_content`'s rule and what it keeps beyond the text
    shown goes out, so the stream ends as the recorded reply does. A template without markers
    passes every fragment through as it came, with no delay."""

    def __init__(self, chat_format: ChatFormat):
        self._format = chat_format
        self._opening = chat_format.content_start
        self._closing = chat_format.content_end
        self._opened = not self._opening  # past the place where the opening marker can stand
        self._closed = False  # the closing marker came: the rest is held
        self._held = ""
        self._fed: list[str] = []
        self._shown: list[str] = []

    @classmethod
    def of_template(cls, template_source: str) -> MarkerFilter:
        return cls(analyze(template_source))

    @property
    def passes_through(self) -> bool:
        return not (self._opening or self._closing)

    def feed(self, fragment: str) -> str:
        """What can be shown now of `fragment`, with what was held before it."""
        if self.passes_through:
            return fragment
        self._fed.append(fragment)
        text = self._held + fragment
        if not self._opened:
            text = self._past_opening(text)
        if not self._opened or self._closed:
            self._held = text
            return ""
        shown, self._held = self._before_closing(text)
        self._shown.append(shown)
        return shown

    def flush(self) -> str:
        """The end of the reply: what the whole reply's reading keeps that is not shown yet."""
        if self.passes_through:
            return ""
        shown = "".join(self._shown)
        content = self._format.unwrap("".join(self._fed))
        # The reading also trims the whitespace around a wrapped reply and cuts a turn's end
        # marker; where it differs from the text shown so far, what was shown stands.
        rest = content[len(shown) :] if content.startswith(shown) else ""
        self._shown.append(rest)
        self._held = ""
        return rest

    def _past_opening(self, text: str) -> str:
        """`text` from the reply's start, less the opening marker once it is certain; the opening
        stays undecided (`_opened` False) while `text` could still become it."""
        lead = text.lstrip()
        if self._opening.startswith(lead):
            return text  # whitespace, or the marker's beginning: wait for more
        self._opened = True
        return lead[len(self._opening) :] if lead.startswith(self._opening) else text

    def _before_closing(self, text: str) -> tuple[str, str]:
        """(what can be shown, what to hold): the text before the closing marker, less a tail
        that could be the marker's beginning."""
        if not self._closing:
            return text, ""
        at = text.find(self._closing)
        if at >= 0:
            self._closed = True
            return text[:at], text[at:]
        tail = next((n for n in range(len(self._closing) - 1, 0, -1) if text.endswith(self._closing[:n])), 0)
        return text[: len(text) - tail], text[len(text) - tail :]
