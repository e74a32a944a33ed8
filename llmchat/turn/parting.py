"""Where the next prompts will leave this one, for an engine that keeps checkpoints of a recurrent
state there (EngineCaps.checkpoints; llmchat.engine.checkpoints).

A hybrid model's cache cannot be cut back: a prompt that leaves the cached one is prefilled from
the nearest checkpoint at or before the token where it leaves. The engine keeps some where any
template's prompts may leave (where a prefill starts; 4 and 4 + a batch of tokens before its
end: llama-server's places). A turn knows two more places exactly, and names them in its request
(`GenerateRequest.parting_points`, token counts of the prompt):
- where the template rewrites the generation prompt once the reply is history. Qwen3.5's
  generation prompt opens a thinking block (closed at once with thinking off), and its render of
  an earlier reply has none, so every next prompt leaves this one where that block begins: 9
  tokens before its end with SmolLM2's tokenizer, beyond llama-server's last place, and the one
  before that is a batch back. Measured on a tiny random-weight Qwen3.5, a 1,700-token first
  message and Qwen3.5's own template without thinking: 548 tokens evaluated a later turn where a
  transformer evaluates 41. The rewrite is derived from the template once per template,
  variables, tools and thinking mode (`Rewrites`): a one-message conversation rendered with the
  generation prompt, and again with a reply and a next message; the tokens from where the two
  part to the end of the first are the generation prompt's tail that a next prompt rewrites, and
  a prompt that ends in that tail gets a point where it begins;
- where the last user message's text begins: `/undo` and `/edit` leave the prompt there
  (llama-server keeps a checkpoint at the last user message too);
- where the reply begins (the prompt's end): a reply that goes back otherwise than it was
  sampled (a tool call, rendered from its parsed form for the next round, tokenizes anew) leaves
  the prompt inside it, and the state at its start is then the nearest (measured: a tool turn's
  second round evaluated 61 tokens from llama-server's last place, 4 before the end, where a
  transformer evaluates 56; 57 from here).
A tool round after the first has only the last: its prompt extends the first round's, whose
places the next prompts leave first.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from llmchat.engine.driver import common_prefix
from llmchat.errors import LlmchatError
from llmchat.prompt.reasoning_history import REASONING_KEY
from llmchat.turn.tokens import tokens_from

if TYPE_CHECKING:
    from llmchat.engine.interface import ChatEngine
    from llmchat.prompt.render import RenderedPrompt

# The probe conversation: a question, a reply (with its thinking where the reply will have some),
# the next question. Plain words, so that no template treats them as anything but messages.
PROBE_ASK, PROBE_THOUGHT, PROBE_REPLY, PROBE_NEXT = "Hello there.", "A greeting.", "Hello.", "Thanks."

RenderTokens = Callable[[list[dict[str, Any]]], list[int]]  # messages + generation prompt -> ids


class Rewrites:
    """The generation prompt's tail that a template rewrites once the reply is history, derived
    once per shape (what decides the render: the template, its variables, the tools, thinking)."""

    def __init__(self) -> None:
        self._tails: dict[Hashable, tuple[int, ...]] = {}

    def tail(self, shape: Hashable, render_tokens: RenderTokens, thinking: bool) -> tuple[int, ...]:
        if shape not in self._tails:
            self._tails[shape] = rewritten_tail(render_tokens, thinking)
        return self._tails[shape]


def rewritten_tail(render_tokens: RenderTokens, thinking: bool) -> tuple[int, ...]:
    """The last tokens of a generation prompt that the next prompt renders otherwise (the reply
    as history); () where it keeps the whole generation prompt, or cannot render the probe."""
    asked = [{"role": "user", "content": PROBE_ASK}]
    reply = {"role": "assistant", "content": PROBE_REPLY} | ({REASONING_KEY: PROBE_THOUGHT} if thinking else {})
    try:
        now = render_tokens(asked)
        later = render_tokens([*asked, reply, {"role": "user", "content": PROBE_NEXT}])
    except LlmchatError:  # a template that refuses so plain a conversation: nothing is known
        return ()
    return tuple(now[common_prefix(now, later) :])


def parting_points(
    engine: ChatEngine,
    prompt: Sequence[int],
    rendered: RenderedPrompt,
    messages: list[dict[str, Any]],
    rewritten: tuple[int, ...] | None,
) -> tuple[int, ...]:
    """The token counts of `prompt` (the tokens of `rendered`, of `messages`) where the next
    prompts are expected to leave it: its end, where its `rewritten` tail begins, and where its last
    user message's text begins (None for `rewritten`: a later tool round, only its end). A place
    whose tokens are not the prompt's own is left out."""
    points = {len(prompt)}
    if rewritten is None:
        return tuple(points)
    if rewritten and len(rewritten) < len(prompt) and tuple(prompt[-len(rewritten) :]) == rewritten:
        points.add(len(prompt) - len(rewritten))
    offset = _last_user_text(rendered)
    if offset is not None:
        tail = tokens_from(engine, rendered, messages, offset)
        if tail and len(tail) < len(prompt) and list(prompt[-len(tail) :]) == tail:
            points.add(len(prompt) - len(tail))
    return tuple(sorted(points))


def _last_user_text(rendered: RenderedPrompt) -> int | None:
    """The character offset where the last user message's text begins in the rendered prompt."""
    offset, at = None, 0
    for piece in rendered.pieces:
        if piece.role == "user" and not piece.trusted:
            offset = at
        at += len(piece.text)
    return offset
