"""A reply's thinking parsed apart from its answer, as it streams (the format: llmchat.reasoning.formats).

`ThinkingSplitter` works on the stream of token texts: a tag split over several tokens is held
back until it is complete or cannot be a tag any more, and a block that never closes is
thinking to the end (an empty answer). `ThinkingTracker` adds what a turn needs around it: the
thinking token count, the time of the first answer token, and the budget (`--thinking-budget N`:
after N generated tokens still inside thinking, the format's closing text is forced into the
reply and the model answers; llama.cpp's `--reasoning-budget` does the same). With a budget, an
end-of-generation token inside the block is replaced by the close too: a budget asks for an
answer, and SmolLM2 carrying the R1 template stopped after 10-22 thinking tokens with none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from llmchat.reasoning.formats import (
    ANSWER,
    HARMONY_CHANNEL,
    HARMONY_MESSAGE,
    HARMONY_START,
    HARMONY_THINKING_CHANNELS,
    MESSAGE_KINDS,
    THINKING,
    ReasoningFormat,
)

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass
class Segment:
    kind: str  # THINKING | ANSWER
    text: str


class ThinkingSplitter:
    """Splits a reply's text, fed a token at a time, into thinking and answer segments."""

    def __init__(
        self,
        fmt: ReasoningFormat,
        *,
        start_in_thinking: bool = False,
        call_openers: Sequence[str] = (),
        preface: str = "",
    ):
        self.fmt = fmt
        self.start_in_thinking = start_in_thinking
        self.preface = preface  # what the prompt wrote in the block it opened (`thinking_preface`)
        # The texts that open a tool call (the offered tools' format): once a call has begun after
        # the thinking, the rest is the call's, and a `</think>` inside an argument is text.
        self.call_openers = tuple(opener for opener in call_openers if opener.strip())
        self._in_call = False
        self._pending = ""
        self._at_start = not start_in_thinking  # only whitespace so far: a <think> here opens thinking
        self._strip_answer = False  # drop the whitespace a template puts after the close tag
        self.closed = False  # a thinking block was seen to close (or the answer channel began)
        self._seen_marker = False
        self._header = ""  # harmony: the current header's text (role, recipient)
        self._held_header = ""  # harmony: text before any marker, header or plain answer
        self._reclassify = False  # a close tag came after answer text: that text was thinking
        if fmt.kind in MESSAGE_KINDS:
            self.mode = THINKING if start_in_thinking else "header"
            self._channel = "analysis" if start_in_thinking else ""
        else:
            self.mode = THINKING if start_in_thinking else ANSWER
        self.thinking_parts: list[str] = [preface + "\n"] if start_in_thinking and preface else []
        self.answer_parts: list[str] = []

    @property
    def in_thinking(self) -> bool:
        return self.mode == THINKING

    @property
    def reasoning(self) -> str:
        return "".join(self.thinking_parts).strip()

    @property
    def answer(self) -> str:
        return "".join(self.answer_parts)

    def feed(self, text: str) -> list[Segment]:
        self._pending += text
        return self._drain(final=False)

    def flush(self) -> list[Segment]:
        """The end of the reply: whatever was held back is text of the current phase."""
        out = self._drain(final=True)
        if self._held_header and not self._seen_marker:  # no harmony markup at all: all answer
            self.mode = ANSWER
            self._emit(self._held_header, out)
            self._held_header = ""
        return out

    # --- parsing ---------------------------------------------------------------------------------
    def _drain(self, *, final: bool) -> list[Segment]:
        out: list[Segment] = []
        while self._pending:
            if self._at_start and self.fmt.kind == "tags" and self.mode == ANSWER:
                if not self._opening(final):
                    break
                continue
            markers = self._live_markers()
            found = _earliest(self._pending, markers)
            if found is None:
                keep = 0 if final else _partial_suffix(self._pending, markers)
                cut = len(self._pending) - keep
                text, self._pending = self._pending[:cut], self._pending[cut:]
                self._emit(text, out)
                break
            index, marker = found
            self._emit(self._pending[:index], out)
            self._pending = self._pending[index + len(marker) :]
            self._on_marker(marker, out)
        return out

    def _opening(self, final: bool) -> bool:
        """At the start of a tags reply: does it open with the tag? False: wait for more text."""
        stripped = self._pending.lstrip()
        tag, close = self.fmt.open_tag, self.fmt.close_tag
        stray = _stray_opener(stripped, tag)
        if stray is None and not final:
            return False  # a repeated opener so far: wait for the rest
        if stray:
            # Gemma 4 may write its channel opener twice (`<|channel><|channel>thought`): the first
            # is a stray that llama.cpp drops too, not the answer's text.
            stripped = stripped[stray:]
        if stripped.startswith(tag):
            self._pending = stripped[len(tag) :]
            self.mode = THINKING
            self._at_start = False
        elif stripped.startswith(close):
            # A reply that opens with the closing tag: the block was open and empty (the template
            # opened it where the prompt does not show it); the tag is not part of the answer.
            self._pending = stripped[len(close) :]
            self.closed = True
            self._strip_answer = True
            self._at_start = False
        elif not final and (not stripped or tag.startswith(stripped) or close.startswith(stripped)):
            return False  # whitespace or the start of a tag so far
        else:
            self._at_start = False
        return True

    def _live_markers(self) -> tuple[str, ...]:
        fmt = self.fmt
        if fmt.kind in MESSAGE_KINDS:
            return fmt.markers
        if self._in_call:
            return ()
        if self.mode == THINKING:
            return (fmt.close_tag,)
        # After a closed block both tags stay live: the model may think again, or close again.
        return (fmt.open_tag, fmt.close_tag, *self.call_openers) if self.closed else ()

    def _on_marker(self, marker: str, out: list[Segment]) -> None:
        fmt = self.fmt
        self._seen_marker = True
        if self._held_header:  # the reply began inside a header (the prompt ended with `<|start|>assistant`)
            self._header += self._held_header
            self._held_header = ""
        if fmt.kind not in MESSAGE_KINDS:
            if marker in self.call_openers and marker not in (fmt.open_tag, fmt.close_tag):
                self._emit(marker, out)
                self._in_call = True
                return
            if marker == fmt.open_tag:  # a second block, after a closed one
                self.mode = THINKING
                self.thinking_parts.append("\n")
                return
            if self.mode == ANSWER and self.answer_parts:
                # Another close tag after the answer began: as the templates read a reply
                # (`content.split('</think>')[-1]`), all before the last close tag is reasoning,
                # once text follows it (a stray close tag that ends the reply changes nothing).
                self._reclassify = True
            self.mode = ANSWER
            self.closed = True
            self._strip_answer = True
            return
        # Harmony: <|start|>ROLE<|channel|>NAME<|message|>BODY<|end|>; headers are never shown.
        if marker in (HARMONY_START, HARMONY_CHANNEL):
            if marker == HARMONY_START:
                self._header = ""
            self.mode = "header" if marker == HARMONY_START else "channel"
            self._channel = ""
        elif marker == HARMONY_MESSAGE:
            name = self._channel.split()[0] if self._channel.split() else ""
            if fmt.kind == "recipient":
                recipient = _recipient(self._header)
                self.mode = THINKING if recipient == "self" else ANSWER if recipient in ("user", "") else "call"
            elif " to=" in f" {self._header} {self._channel}":
                # A message to a tool (`to=functions.NAME`, `to=python`): a call, neither thinking
                # nor answer; the format's parser reads it from the raw reply.
                self.mode = "call"
            else:
                self.mode = THINKING if name in HARMONY_THINKING_CHANNELS else ANSWER
            if self.mode == ANSWER:
                self.closed = True
                self._strip_answer = True
            self._header = ""
        else:  # <|end|>, <|return|>, <|call|>: the message is over
            if self.mode == THINKING:
                self.closed = True
            self.mode = "header"

    def _emit(self, text: str, out: list[Segment]) -> None:
        if not text:
            return
        mode = self.mode
        if mode == "channel":
            self._channel += text
            return
        if mode == "call":
            return
        if mode == "header":
            if self._seen_marker:
                self._header += text
            else:  # header or answer: the next marker, or the end, says which
                self._held_header += text
            return
        if mode == ANSWER and self._strip_answer:
            text = text.lstrip()
            if not text:
                return
            self._strip_answer = False
        if mode == ANSWER and self._reclassify and text.strip():
            self._reclassify = False
            self.thinking_parts.extend(["\n", *self.answer_parts])
            self.answer_parts.clear()
        parts = self.thinking_parts if mode == THINKING else self.answer_parts
        parts.append(text)
        if out and out[-1].kind == mode:
            out[-1].text += text
        else:
            out.append(Segment(mode, text))


def _recipient(header: str) -> str:
    """Who a message is to, from its header (`assistant to=NAME`); "" when it names nobody."""
    found = re.search(r"(?:^|\s)to=(\S+)", header)
    return found.group(1) if found else ""


def _stray_opener(text: str, tag: str) -> int | None:
    """The length of a stray start of the opening tag repeated before the tag itself
    (`<|channel>` before `<|channel>thought`): 0 when there is none, None while the text so far
    could still be one."""
    for cut in range(len(tag) - 1, 0, -1):
        stray = tag[:cut]
        if not stray.endswith(">"):
            continue
        if text.startswith(stray + tag):
            return cut
        if len(text) < cut + len(tag) and (stray + tag).startswith(text):
            return None
    return 0


def _earliest(text: str, markers: Sequence[str]) -> tuple[int, str] | None:
    best: tuple[int, str] | None = None
    for marker in markers:
        index = text.find(marker)
        if index >= 0 and (best is None or index < best[0]):
            best = (index, marker)
    return best


def _partial_suffix(text: str, markers: Sequence[str]) -> int:
    """Length of the longest end of `text` that is the beginning of a marker (to hold back)."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def split_reply(fmt: ReasoningFormat, text: str, *, start_in_thinking: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply (batch --parallel, which gets each reply at once)."""
    splitter = ThinkingSplitter(fmt, start_in_thinking=start_in_thinking)
    splitter.feed(text)
    splitter.flush()
    return splitter.reasoning, splitter.answer


@dataclass
class ThinkingTracker:
    """One turn's thinking: the splitter, the counts and times the stats report, and the budget.

    It is the `Steering` the engine asks between two sampled tokens (`forced_tokens`): once the
    reply has `budget` generated tokens and is still thinking, it returns the format's closing
    text as token ids, once."""

    splitter: ThinkingSplitter
    budget: int | None = None
    close_ids: Sequence[int] = ()
    thinking_tokens: int = 0
    t_first: float | None = None  # the first text of any kind
    t_first_answer: float | None = None
    budget_hit: bool = False
    _closed_at: int | None = field(default=None, repr=False)
    _forced: bool = field(default=False, repr=False)
    _fed: bool = field(default=False, repr=False)

    @property
    def fed(self) -> bool:
        """Whether any reply text has been seen (a tracker a decoding loop never fed is unused)."""
        return self._fed

    def restart(self) -> None:
        """Forget every text fed so far: the reply starts again (a retried server request)."""
        old = self.splitter
        fresh = ThinkingSplitter(
            old.fmt, start_in_thinking=old.start_in_thinking, call_openers=old.call_openers, preface=old.preface
        )
        self.__dict__.update(ThinkingTracker(fresh, budget=self.budget, close_ids=self.close_ids).__dict__)

    def feed(self, text: str, generated: int, now: float) -> list[Segment]:
        self._fed = True
        segments = self.splitter.feed(text)
        self._account(segments, generated, now)
        return segments

    def flush(self, generated: int, now: float) -> list[Segment]:
        segments = self.splitter.flush()
        self._account(segments, generated, now)
        if self._closed_at is None:
            # Never closed: every token was thinking if it ever started; otherwise none was.
            self.thinking_tokens = generated if self.splitter.thinking_parts else 0
        return segments

    def _account(self, segments: list[Segment], generated: int, now: float) -> None:
        if segments and self.t_first is None:
            self.t_first = now
        if any(s.kind == ANSWER for s in segments) and self.t_first_answer is None:
            self.t_first_answer = now
        if self._closed_at is None and self.splitter.closed:
            self._closed_at = generated
            self.thinking_tokens = generated

    def forced_tokens(self, generated: int, *, ending: bool = False) -> Sequence[int]:
        """The close ids, once, when a budgeted thinking block reaches its budget, or when the
        model tries to end the reply inside it (a budget asks for an answer; an end token there
        would leave none)."""
        if self.budget is None or self._forced or not self.splitter.in_thinking or not self.close_ids:
            return ()
        if generated >= self.budget:
            self.budget_hit = True
        elif not ending:
            return ()
        self._forced = True
        return self.close_ids
