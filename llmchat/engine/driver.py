"""One sequence's decoding state, the same whichever loop produces its tokens.

Three token sources drive a reply: `Generation` (one sequence through `LoadedModel.generate`),
`ParallelDecoder` (several sequences in one llama.cpp context) and `ServerGeneration` (a
llama-server stream, which returns token ids). Each keeps one `SequenceState` per sequence, and
the state decides what a token means, once:
- the seed (a fresh one per reply unless the user gave one) and the token limit (`--max-tokens`,
  at most the room left in the window);
- the reply rules (`ReplyAssembler`: end tokens, stop strings, the loop stop, the limit);
- the steering: between two tokens a thinking budget may force the close of the thinking block,
  and an end token sampled inside a budgeted block is replaced by that close.
A source only says how tokens are produced and what to do with forced ones: evaluate them and
sample on (locally), or end the stream and continue from prompt + reply so far (a server, whose
`cache_prompt` keeps everything up to there).

Pure Python: no llama_cpp, no numpy, so a remote engine can use it without loading either.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from llmchat.engine.reply import GenerationOutcome, ReplyAssembler
from llmchat.errors import LlmchatError

if TYPE_CHECKING:
    from collections.abc import Sequence

    from llmchat.engine.interface import ChatEngine, GenerateRequest, QueuedRequest
    from llmchat.engine.reply import Vocabulary
    from llmchat.engine.sampling import SamplingParams


def draw_seed(sampling: SamplingParams) -> int:
    """The seed of one reply. llama.cpp's own is fixed by default, which makes every run identical
    even at temperature 1: a fresh seed per reply unless the user gave one."""
    return sampling.seed if sampling.seed is not None else random.randrange(1, 2**31)


def reply_limit(n_ctx: int, prompt_tokens: int, max_tokens: int | None) -> int:
    """The most tokens a reply may take: `max_tokens`, at most the room the window has left."""
    room = n_ctx - prompt_tokens
    return room if max_tokens is None else min(max_tokens, room)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Step:
    """What one sampled token did: `text` to show now; `forced`, tokens put in after it (the end of
    a thinking block) that the source must evaluate before sampling on; `dropped`, the sampled
    token was an end token that the forced ones replace (it is not part of the reply)."""

    text: str
    forced: Sequence[int] = ()
    dropped: bool = False


class SequenceState:
    """One sequence: its request, seed, limit, reply rules and steering.

    `feeds_steering`: give the reply text to the steering as it is decoded (a loop whose caller
    does not see the text: batch); otherwise the caller that reads the events feeds it."""

    def __init__(
        self,
        vocab: Vocabulary,
        request: GenerateRequest,
        n_ctx: int,
        outcome: GenerationOutcome | None = None,
        *,
        feeds_steering: bool = False,
    ):
        self.request = request
        self.outcome = outcome if outcome is not None else GenerationOutcome(prompt_tokens=len(request.prompt))
        self.seed = draw_seed(request.sampling)
        self.limit = reply_limit(n_ctx, len(request.prompt), request.max_tokens)
        self.vocab = vocab
        self.reply = ReplyAssembler(
            vocab,
            self.outcome,
            limit=self.limit,
            stop_strings=request.stops,
            markup=request.markup,
            stop_loops=request.sampling.stop_loops,
        )
        self.steering = request.steering
        self.feeds_steering = feeds_steering and request.steering is not None
        self.fragments: list[str] = []

    @property
    def done(self) -> bool:
        return self.reply.done

    def start(self, now: float) -> bool:
        """The sequence begins (its prefill starts). False when it has no room for a single token."""
        outcome = self.outcome
        outcome.t_start = now
        outcome.finish_reason = "interrupted"  # until the end is known
        if self.limit <= 0:
            self.reply.done = True
            outcome.finish_reason = "length"
            return False
        return True

    def on_token(self, token: int, now: float, piece: bytes | None = None) -> Step:
        """One sampled token through the reply rules. `piece`: the token's text where the source
        knows it and the vocabulary does not (a server's stream). An end token inside a budgeted
        thinking block is replaced by the block's close (`Step.dropped`)."""
        steering = self.steering
        if steering is not None and self.vocab.is_end_of_generation(token):
            forced = steering.forced_tokens(self.outcome.generated_tokens, ending=True)
            if forced:
                return Step(self._shown(self.reply.force(forced, now), now), forced, dropped=True)
        return Step(self._shown(self.reply.add(token, now, piece), now))

    def on_unsent(self, count: int) -> None:
        """`count` tokens the source sampled and never sent (see `ReplyAssembler.count_unsent`)."""
        self.reply.count_unsent(count)

    def steer(self, now: float) -> Step:
        """Between two tokens, once the caller has seen the last one's text: the steering may force
        tokens in now (a thinking budget spent). The source evaluates them before sampling on."""
        steering = self.steering
        if steering is None or self.reply.done:
            return Step("")
        forced = steering.forced_tokens(self.outcome.generated_tokens)
        if not forced:
            return Step("")
        return Step(self._shown(self.reply.force(forced, now), now), forced)

    def end_of_stream(self) -> None:
        """The source ran dry without an end token (the library stopped): a normal stop."""
        self.reply.end_of_stream()

    def tail(self) -> str:
        """What the reply rules held back, released once the reply has ended."""
        return self._shown(self.reply.tail(), self.outcome.t_last_token or 0.0)

    def text(self) -> str:
        """The whole reply as shown (with `feeds_steering`, or where the source kept fragments)."""
        return "".join(self.fragments)

    def _shown(self, text: str, now: float) -> str:
        if text:
            self.fragments.append(text)
            if self.feeds_steering:
                assert self.steering is not None
                self.steering.feed(text, self.outcome.generated_tokens, now)
        return text


@dataclass
class DecodedResult:
    """One finished sequence, whichever backend decoded it: `SerialDecoder`, `ParallelDecoder`
    (engine.parallel) or a server's streams (engine.remote.streams, which adds its retries)."""

    key: Any
    outcome: GenerationOutcome
    seed: int = 0
    text: str = ""
    error: str | None = None
    t_submit: float = 0.0  # the sequence began (its TTFT is measured from here)


class SerialDecoder:
    """The scheduler's N=1 case: one sequence at a time through `engine.generate`, so speculative
    decoding and the KV cache on disk keep working. Its `run` has the shape of `ParallelDecoder.run`
    (several sequences in one context) and `ConcurrentStreams.run` (a server's), so a batch runs one
    road whatever its N and engine.

    `on_start(item)`: before an item decodes (batch restores its prefix from the disk cache there).
    A request the engine refuses (an error the user can act on, llama.cpp refusing a prompt) fails
    that item only."""

    def __init__(self, engine: ChatEngine, on_start: Callable[[QueuedRequest], object] | None = None):
        self.engine = engine
        self.on_start = on_start
        self.generated_total = 0  # tokens generated so far, all items (progress)
        self.items = 0

    def summary(self) -> str:
        return f"batch: {self.items} items one at a time, {self.generated_total} tokens generated"

    def run(
        self,
        items: Iterable[QueuedRequest],
        on_done: Callable[[DecodedResult], None],
        on_step: Callable[[SerialDecoder], None] | None = None,
    ) -> None:
        for item in items:
            self.items += 1
            t_submit = time.perf_counter()
            result = DecodedResult(
                item.key, GenerationOutcome(prompt_tokens=len(item.request.prompt)), t_submit=t_submit
            )
            counted = 0
            try:
                if self.on_start is not None:
                    self.on_start(item)
                generation = self.engine.generate(item.request, feeds_steering=True)
                result.seed, result.outcome = generation.seed, generation.outcome
                fragments = []
                for event in generation:
                    fragments.append(event.text)
                    self.generated_total += generation.outcome.generated_tokens - counted
                    counted = generation.outcome.generated_tokens
                    if on_step is not None:
                        on_step(self)
                result.text = "".join(fragments)
            except LlmchatError as err:
                result.error = str(err)
            except (ValueError, RuntimeError) as err:  # llama.cpp refusing a prompt
                result.error = f"generation failed: {err}"
            on_done(result)
