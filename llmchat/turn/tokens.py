"""The prompt a turn sends, as the engine takes it: the template's render, shaped for tools,
tokenized through the trust boundary.

- Tools (llmchat.turn.tool_loop): the tool list and the calls and results go to the template in its
  own shape; an earlier tool turn continued without tools goes back as plain JSON text.
- Earlier replies go back to the model as the ids they were sampled as (exact KV reuse).
- A later round of a tool turn keeps the first round's ids as they are in the KV cache, and only
  what follows them is tokenized (`kept_prefix`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmchat.engine.interface import ChatEngine, Prompt
    from llmchat.engine.prompt_pieces import PromptPiece
    from llmchat.prompt.render import RenderedPrompt
    from llmchat.tools.offer import ToolOffer

Piece3 = tuple[str, bool, "str | None"]  # a rendered piece: text, trusted, the role of its message


def shape_for_template(
    messages: list[dict[str, Any]], tools: ToolOffer | None, variables: dict[str, Any]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The messages and template variables a render takes, with or without the tools on."""
    if tools is not None and tools.active:
        # The tool list and the calls and results in the template's own shape; every content (a
        # tool's output included) still goes through the trust boundary of render_prompt.
        shaped, tool_variables = tools.shape(messages)
        return shaped, {**variables, **tool_variables}
    if any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        # An earlier tool turn, continued without tools (ask -c, /tool off): its calls and results
        # as plain JSON text, which every template can render.
        from llmchat.tools.generic import as_plain_messages

        return as_plain_messages(messages), variables
    return messages, variables


def prompt_of(
    engine: ChatEngine,
    rendered: RenderedPrompt,
    messages: list[dict[str, Any]],
    kept_prefix: tuple[str, list[int]] | None = None,
) -> Prompt:
    """`rendered` (of `messages`) as the engine's prompt. `kept_prefix`: (text, ids) of a prompt
    already in the KV cache that this one extends (a tool turn's first round)."""
    if kept_prefix is not None and rendered.text.startswith(kept_prefix[0]):
        # Tokenizing the joined text again could merge the kept prompt's last token with the call
        # that follows (`[/INST]` + `[TOOL_CALLS]` is `][` in a vocabulary without those control
        # tokens), so only what follows it is tokenized.
        kept_text, kept_ids = kept_prefix
        tail_ids = tokens_from(engine, rendered, messages, len(kept_text))
        if tail_ids is not None:
            return [*kept_ids, *tail_ids]
    return engine.prompt_tokens(_with_sampled(_pieces(rendered), _sampled(messages)))


def tokens_from(
    engine: ChatEngine, rendered: RenderedPrompt, messages: list[dict[str, Any]], offset: int
) -> list[int] | None:
    """The ids of `rendered`'s text from character `offset` on, as they continue the prompt before
    it (no BOS of their own), by the same rules as `prompt_of`; None where the engine cannot say."""
    _, tail = split_pieces(_pieces(rendered), offset)
    return _tokens_after(engine, _with_sampled(tail, _sampled(messages)))


def _pieces(rendered: RenderedPrompt) -> list[Piece3]:
    return [(piece.text, piece.trusted, piece.role) for piece in rendered.pieces]


def _sampled(messages: list[dict[str, Any]]) -> dict[str, list[int]]:
    """Earlier replies' sampled ids, by their text."""
    return {m["content"]: m["token_ids"] for m in messages if m["role"] == "assistant" and m.get("token_ids")}


def _with_sampled(pieces: list[Piece3], sampled: dict[str, list[int]]) -> list[PromptPiece]:
    return [(text, trusted, sampled.get(text) if role == "assistant" else None) for text, trusted, role in pieces]


def _tokens_after(engine: ChatEngine, pieces: list[PromptPiece]) -> list[int] | None:
    """The ids of pieces that continue a prompt (no BOS of their own); None where the engine cannot
    say (its prompts are messages, or its BOS is not one token)."""
    lead = engine.prompt_tokens([])
    if not isinstance(lead, list):
        return None
    if not lead:
        tokens = engine.prompt_tokens(pieces)
        return tokens if isinstance(tokens, list) else None
    # The engine puts a BOS in front of a prompt that lacks one: give it one as text, then drop it.
    marker: PromptPiece = (engine.bos_text, True)
    if not engine.bos_text or engine.prompt_tokens([marker]) != lead:
        return None
    tokens = engine.prompt_tokens([marker, *pieces])
    return tokens[len(lead) :] if isinstance(tokens, list) else None


def split_pieces(pieces: list[Piece3], offset: int) -> tuple[list[Piece3], list[Piece3]]:
    """The pieces before and after character `offset` of their joined text (a piece across it is cut)."""
    head: list[Piece3] = []
    tail: list[Piece3] = []
    at = 0
    for text, trusted, role in pieces:
        if at + len(text) <= offset:
            head.append((text, trusted, role))
        elif at >= offset:
            tail.append((text, trusted, role))
        else:
            head.append((text[: offset - at], trusted, role))
            tail.append((text[offset - at :], trusted, role))
        at += len(text)
    return head, tail
