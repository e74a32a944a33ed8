"""The rules that turn one sequence's sampled tokens into a reply, and decide when it ends.

One `ReplyAssembler` per sequence, held by its `SequenceState` (llmchat.engine.driver) in every
decoding loop: `Generation` (one sequence through `LoadedModel.generate`), `ParallelDecoder` (several
sequences in one context) and `ServerGeneration` (a llama-server stream of token ids). Only how
tokens are produced differs; what a token means is decided here, once:
- an end-of-generation token ends the reply and is not counted or shown;
- text is decoded incrementally (a multi-byte character may span tokens) and passed through the
  stop-string matcher, which holds back a possible partial stop string;
- the reply ends at `limit` generated tokens (`length`);
- when the reply ends, the held-back text and any undecoded bytes are released as the tail.
- `markup`: control tokens whose text must reach the reasoning parser (gpt-oss's `<|channel|>`
  and the like print as nothing otherwise); `force` adds tokens the caller decided on (the end of
  a thinking block whose budget is spent, llmchat.reasoning.formats), counted like sampled ones.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from llmchat import interrupts
from llmchat.engine.loop_exit import LoopExit
from llmchat.engine.stopping import LoopDetector, StopMatcher

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class Vocabulary(Protocol):
    def is_end_of_generation(self, token_id: int) -> bool: ...
    def token_bytes(self, token_id: int) -> bytes: ...


class Steering(Protocol):
    """Asked between two sampled tokens: token ids to force into the reply now (none: go on).
    llmchat.reasoning.thinking.ThinkingTracker ends a thinking block this way when its budget is spent.
    `ending`: the model just sampled an end-of-generation token (dropped if tokens are forced)."""

    def forced_tokens(self, generated: int, *, ending: bool = False) -> Sequence[int]: ...


class ThinkingSteering(Steering, Protocol):
    """A Steering that must see the reply's text as it is decoded (the parallel loop feeds it;
    the serial one leaves that to its caller, which reads the same text from the events)."""

    def feed(self, text: str, generated: int, now: float) -> object: ...
    def restart(self) -> None: ...  # forget what was fed: the reply starts again (a retry)


@dataclass(frozen=True)
class ServerCall:
    """A tool call an OpenAI-compatible server returned apart from the text (`delta.tool_calls`),
    assembled from its stream: the arguments are the JSON text the server sent."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class GenerationOutcome:
    """What one sequence's decoding produced, filled in as it runs (complete once it ends)."""

    finish_reason: str = "stop"  # stop | length | loop | interrupted | error
    prompt_tokens: int = 0
    cached_tokens: int = 0
    media_tokens: int = 0  # prompt positions that are image or audio embeddings, not text tokens
    generated_tokens: int = 0
    t_start: float = 0.0  # perf_counter when the sequence began (its prefill starts)
    t_first_token: float | None = None  # the first sampled token, end-of-generation included
    t_first_shown: float | None = None  # the first token that belongs to the reply
    t_last_token: float | None = None
    draft_proposed: int = 0
    draft_accepted: int = 0
    loop_steered: int = 0  # loops closed under a grammar instead of ending the reply (engine.loop_exit)
    generated_ids: list[int] = field(default_factory=list)
    # A server's own timings (llama-server's `timings`: prompt_ms, cache_n, predicted_per_second...);
    # None for a local reply, or a server that sends none.
    server: dict[str, float] | None = None
    # Calls a server returned in its own `tool_calls` field (tools sent natively); the reply's text
    # holds none of them.
    server_calls: list[ServerCall] = field(default_factory=list)


class ReplyAssembler:
    """Feed sampled tokens one at a time; `add` returns the text that may be shown now."""

    def __init__(
        self,
        vocab: Vocabulary,
        outcome: GenerationOutcome,
        *,
        limit: int,
        stop_strings: Sequence[str] = (),
        markup: Mapping[int, bytes] | None = None,
        stop_loops: bool = True,
    ):
        self.vocab = vocab
        # A reply stuck repeating itself ends with finish_reason "loop" (--no-loop-stop: off).
        self.loops = LoopDetector() if stop_loops else None
        # Under a grammar a loop is steered out of instead: the sequence's grammar gate attaches
        # itself to `loop_exit` (pass it to the sampler chain); without one the loop ends the reply.
        self.loop_exit = LoopExit() if stop_loops else None
        self.markup = markup or {}
        self.outcome = outcome
        self.limit = limit
        self.stops = StopMatcher(tuple(stop_strings))
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.done = False

    def add(self, token: int, now: float, piece: bytes | None = None) -> str:
        """Account for one sampled token. Sets `done` (and the finish reason) when the reply ends.
        `piece`: the token's text as its source gave it (a server's stream), instead of the vocabulary's."""
        interrupts.raise_pending()  # a Ctrl-C that landed in one of llama.cpp's callbacks meanwhile
        outcome = self.outcome
        if outcome.t_first_token is None:
            outcome.t_first_token = now
        if self.vocab.is_end_of_generation(token):
            self._end("stop")
            return ""
        if outcome.t_first_shown is None:
            outcome.t_first_shown = now
        outcome.t_last_token = now
        outcome.generated_tokens += 1
        outcome.generated_ids.append(token)
        # A marker's text, whatever its source printed for it (a server prints a control token as nothing).
        piece = self.markup.get(token, piece)
        text = self.stops.feed(self._decoder.decode(self.vocab.token_bytes(token) if piece is None else piece))
        if self.stops.stopped:
            self._end("stop")
        elif self.loops is not None and self.loops.feed(token):
            if self.loop_exit is not None and self.loop_exit.request(self.loops.period):
                self.loops = LoopDetector()  # the repeated span is behind it now
            else:
                self._end("loop")
        elif outcome.generated_tokens >= self.limit:
            self._end("length")
        return text

    def count_unsent(self, count: int) -> None:
        """Tokens the source sampled but never sent: llama-server streams nothing for a token that
        ends inside a UTF-8 character, and the token that completes it brings the whole character's
        text. They count toward the reply and its limit like any other; their ids are unknown."""
        if not self.done:
            self.outcome.generated_tokens += count

    def force(self, tokens: Sequence[int], now: float) -> str:
        """Tokens put into the reply by the caller, not sampled: counted, decoded and checked like
        sampled ones (the limit may end the reply here)."""
        text = ""
        for token in tokens:
            if self.done:
                break
            text += self.add(token, now)
        return text

    def end_of_stream(self) -> None:
        """The token source ran dry without an end token (the library stopped): a normal stop."""
        if not self.done:
            self._end("stop")

    def tail(self) -> str:
        """What was held back (a possible stop string that never completed, undecoded bytes)."""
        tail = self.stops.flush() + self._decoder.decode(b"", final=True)
        return "" if self.stops.stopped else tail

    def _end(self, reason: str) -> None:
        self.done = True
        self.outcome.finish_reason = reason
        if self.loop_exit is not None:
            self.outcome.loop_steered = self.loop_exit.steered
