"""A rendered prompt's pieces to token ids: the one set of rules for every engine.

The local engine (llmchat.engine.core) and llama-server (llmchat.engine.remote.llama_server) must
build exactly the same ids from the same pieces, or a conversation's KV reuse would depend on
where the model runs; so the rules live here, and each engine only says how it tokenizes and which
tokens are control tokens.

- Trusted text (the template's own markup) is tokenized with special-token parsing, so
  `<|im_start|>` becomes the control token.
- Message content is untrusted: where it contains text that would parse as a control token, that
  piece is tokenized as plain text, so a user typing `<|im_end|>` cannot end their own turn.
- Runs of pieces are otherwise joined and tokenized together, which keeps tokenization identical
  to that of the whole string and therefore stable from turn to turn (the KV-cache reuse depends
  on it).
- An earlier assistant reply may come with the ids it was sampled as. A sampled reply is often not
  the tokenizer's own tokenization of its text (" Amethiac" sampled as three tokens tokenizes to
  one), and re-tokenizing it would make the prompt diverge from the KV cache right there,
  re-prefilling everything after. The ids are used where the template's text after the reply
  starts with a control token (`<|im_end|>`, `<end_of_turn>`): the reply then ends a token run
  exactly as it ended generation. Elsewhere the text is tokenized as usual.
- Exactly one BOS: the template may already have written it as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# (text, trusted) or (text, trusted, an earlier reply's sampled ids).
PromptPiece = tuple[str, bool] | tuple[str, bool, Sequence[int] | None]


class PieceTokenizer(Protocol):
    @property
    def add_bos(self) -> bool: ...
    @property
    def bos_id(self) -> int: ...
    def tokenize(self, text: str, *, special: bool) -> list[int]: ...
    def is_control(self, token_id: int) -> bool: ...


def tokens_for_pieces(tokenizer: PieceTokenizer, pieces: Sequence[PromptPiece]) -> list[int]:
    tokenize = tokenizer.tokenize
    tokens: list[int] = []
    run: list[str] = []
    for position, piece in enumerate(pieces):
        text, trusted = piece[0], piece[1]
        reply_ids = piece[2] if len(piece) > 2 else None
        if reply_ids and _starts_with_control(tokenizer, pieces, position + 1):
            tokens += tokenize("".join(run), special=True) if run else []
            tokens += reply_ids
            run = []
        elif not trusted and tokenize(text, special=True) != tokenize(text, special=False):
            tokens += tokenize("".join(run), special=True) if run else []
            tokens += tokenize(text, special=False)
            run = []
        else:
            run.append(text)
    if run:
        tokens += tokenize("".join(run), special=True)
    if tokenizer.add_bos and tokenizer.bos_id >= 0 and (not tokens or tokens[0] != tokenizer.bos_id):
        tokens.insert(0, tokenizer.bos_id)
    return tokens


def _starts_with_control(tokenizer: PieceTokenizer, pieces: Sequence[PromptPiece], start: int) -> bool:
    """Whether the template text from `pieces[start]` on begins with a control token."""
    following = pieces[start][0] if start < len(pieces) and pieces[start][1] else ""
    if not following:
        return start >= len(pieces)  # the reply ends the prompt (no generation prompt)
    first = tokenizer.tokenize(following[:64], special=True)[:1]
    return bool(first) and tokenizer.is_control(first[0])
