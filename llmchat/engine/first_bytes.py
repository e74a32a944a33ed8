"""Each token's first byte, so that the grammar gate can skip, in bulk, the tokens a grammar refuses.

Why: llama.cpp's grammar sampler decodes and checks every candidate it is given, about 0.2 µs each:
a pass over Gemma 3's 262,144 tokens costs 40-60 ms, several decode steps of a 270M model. Where
the grammar allows only a few characters next (after `{ `, only a quote), nearly all of that pass
is spent refusing tokens one by one. But llama.cpp's grammar reads a token character by
character and refuses it at the first character no rule accepts, so a grammar that refuses a
one-byte token refuses every token that starts with that byte. The gate asks the grammar about
one token per byte (`probe`), keeps the tokens whose first byte is not refused, and lets
llama.cpp check only those: the same allowed set, for a few hundred checks instead of 262,144.

Where that reasoning does not hold, a byte is never skipped:
- a byte that starts a multi-byte character when the grammar has a negated class holding a
  non-ASCII character (llama.cpp refuses a partial character that could complete to an excluded
  one even where it could also complete to an allowed one), and 0xC0/0xC1 (overlong sequences);
- a byte that no one-byte token spells (there is nothing to ask the grammar about);
- a grammar that names tokens (`<[id]>`, `<|tok|>`, `!<...>`): there a token is held by its id,
  not its text, and no byte is skipped at all (`usable` is False).
End-of-generation tokens are refused by llama.cpp only where the grammar cannot end; they are
always passed to it when it can (`end_tokens`).

The table is built once per vocabulary in a process, from one `llama_detokenize` call over every
token with a separator token between them (10-20 ms on Gemma 3), instead of 262,144 calls.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from typing import Any

import numpy

# Tables of the vocabularies seen in this process, by the vocabulary's address (checked on reuse).
_tables: dict[int, FirstBytes] = {}
_KEPT_TABLES = 4
# A grammar that is complete from the start: with it llama.cpp keeps exactly the end-of-generation tokens.
_ENDED = b'root ::= ""'


@dataclass
class FirstBytes:
    """The first byte of each token's text (as llama.cpp's grammar reads it), grouped by byte."""

    n_vocab: int
    first: numpy.ndarray  # int16 per token: its first byte, -1 for an empty text
    by_byte: numpy.ndarray  # token ids ordered by first byte, then id
    bounds: numpy.ndarray  # by_byte[bounds[b + 1]:bounds[b + 2]] start with byte b; [bounds[0]:bounds[1]] are empty
    probe_ids: numpy.ndarray  # one one-byte token (not an end-of-generation one) per byte that has one
    probe_bytes: numpy.ndarray  # the byte each of them spells
    sound: numpy.ndarray  # bool per byte: a refused probe speaks for every token starting with it
    eos: int  # an end-of-generation token, asked with the probes: allowed where the grammar can end
    _end_tokens: numpy.ndarray | None = field(default=None, repr=False)

    def end_tokens(self, llama: Any, vocab: Any) -> numpy.ndarray:
        """Every end-of-generation token, found once: among the tokens llama.cpp can mark so (the
        end, end-of-turn and fill-in-the-middle ids, and tokens whose text is on its list, each
        starting with `<`, `[` or `_`), those a grammar complete from the start keeps."""
        if self._end_tokens is None:
            named = [llama.llama_vocab_eos(vocab), llama.llama_vocab_eot(vocab)]
            named += [
                llama.llama_vocab_fim_pad(vocab),
                llama.llama_vocab_fim_rep(vocab),
                llama.llama_vocab_fim_sep(vocab),
            ]
            marked = numpy.isin(self.first, numpy.frombuffer(b"<[_", dtype=numpy.uint8))
            marked[[token for token in named if 0 <= token < self.n_vocab]] = True
            candidates = numpy.flatnonzero(marked).astype(numpy.int32)
            ended = llama.llama_sampler_init_grammar(vocab, _ENDED, b"root")
            try:
                logits = apply(llama, ended, candidates)
            finally:
                llama.llama_sampler_free(ended)
            self._end_tokens = candidates[numpy.isfinite(logits)]
        return self._end_tokens


def grammar_traits(text: str) -> tuple[bool, bool]:
    """(whether a GBNF grammar names tokens, whether a negated class of it holds a non-ASCII
    character): the two cases where a byte's probe does not speak for all tokens starting with it."""
    names_tokens = wide_negation = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end + 1
        elif c == '"' or c == "[":
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < n and text[j] != close:
                j += 2 if text[j] == "\\" else 1
            body = text[i + 1 : j]
            if c == "[" and body.startswith("^") and _non_ascii(body):
                wide_negation = True
            i = j + 1
        else:
            names_tokens = names_tokens or c in "<!"
            i += 1
    return names_tokens, wide_negation


def _non_ascii(body: str) -> bool:
    return any(ord(ch) >= 0x80 for ch in body) or re.search(r"\\(x[89a-fA-F]|[uU])", body) is not None


class Candidates:
    """A llama.cpp candidate array of fixed token ids, for asking a sampler about them again and
    again without building the array each time (the gate's probes, at every refusal)."""

    def __init__(self, llama: Any, ids: numpy.ndarray):
        self._llama = llama
        size = len(ids)
        self._data = (llama.llama_token_data * size)()
        rows = numpy.ctypeslib.as_array(ctypes.cast(self._data, ctypes.POINTER(ctypes.c_int32)), shape=(size, 3))
        rows[:, 0] = ids
        self.logits = rows[:, 1].view(numpy.float32)
        self._array = llama.llama_token_data_array(self._data, size, -1, False)
        self._ref = ctypes.byref(self._array)

    def allowed(self, sampler: Any) -> numpy.ndarray:
        """Which of the ids `sampler` (a grammar) leaves a finite logit, from logits 0."""
        self.logits[:] = 0.0
        self._array.selected, self._array.sorted = -1, False
        self._llama.llama_sampler_apply(sampler, self._ref)
        return numpy.isfinite(self.logits)


def apply(llama: Any, sampler: Any, ids: numpy.ndarray) -> numpy.ndarray:
    """`sampler` applied once to the candidates `ids` (logits 0): the logits it leaves (-inf: refused)."""
    candidates = Candidates(llama, ids)
    candidates.allowed(sampler)
    return candidates.logits.copy()


def first_bytes(llama: Any, vocab: Any, n_vocab: int) -> FirstBytes | None:
    """The table for `vocab`, built on first use in this process; None where it cannot be built."""
    key = vocab if isinstance(vocab, int) else int(ctypes.cast(vocab, ctypes.c_void_p).value or 0)
    table = _tables.get(key)
    if table is not None and _still_matches(llama, vocab, n_vocab, table):
        return table
    table = _build(llama, vocab, n_vocab)
    _tables.pop(key, None)
    if table is not None:
        while len(_tables) >= _KEPT_TABLES:
            _tables.pop(next(iter(_tables)))
        _tables[key] = table
    return table


def forget() -> None:
    """Drop the tables built so far (a benchmark that measures a new process's first reply)."""
    _tables.clear()


def _piece(llama: Any, vocab: Any, token: int) -> bytes:
    buffer = ctypes.create_string_buffer(256)
    n = llama.llama_token_to_piece(vocab, token, buffer, 256, 0, True)
    if n < 0:
        buffer = ctypes.create_string_buffer(-n)
        n = llama.llama_token_to_piece(vocab, token, buffer, -n, 0, True)
    return buffer.raw[:n]


def _head(piece: bytes) -> int:
    return piece[0] if piece else -1


def _still_matches(llama: Any, vocab: Any, n_vocab: int, table: FirstBytes) -> bool:
    """Whether a table kept for this address is this vocabulary's (another model may sit there now)."""
    if table.n_vocab != n_vocab:
        return False
    sample = range(0, n_vocab, max(1, n_vocab // 16))
    return all(_head(_piece(llama, vocab, token)) == table.first[token] for token in sample)


def _build(llama: Any, vocab: Any, n_vocab: int) -> FirstBytes | None:
    for separator in (llama.llama_vocab_eos(vocab), llama.llama_vocab_eot(vocab), llama.llama_vocab_bos(vocab)):
        if not 0 <= separator < n_vocab:
            continue
        text = _piece(llama, vocab, separator)
        if len(text) < 3 or any(text[:k] == text[-k:] for k in range(1, len(text))):
            continue  # too short, or it could overlap itself: its places would be ambiguous
        found = _split(llama, vocab, n_vocab, separator, text)
        if found is None:
            continue
        first, second, lengths = found
        if not _checks(llama, vocab, first, lengths):
            return None
        return _table(llama, vocab, n_vocab, first, second, lengths)
    return None


def _split(
    llama: Any, vocab: Any, n_vocab: int, separator: int, text: bytes
) -> tuple[numpy.ndarray, numpy.ndarray, numpy.ndarray] | None:
    """(first byte, second byte, length) of every token's text (-1: none), from one detokenized run of `separator, 0,
    separator, 1, ...`; None where the separator's text also turns up inside another token's."""
    run = numpy.empty(2 * n_vocab, dtype=numpy.int32)
    run[0::2] = separator
    run[1::2] = numpy.arange(n_vocab, dtype=numpy.int32)
    tokens = run.ctypes.data_as(ctypes.POINTER(llama.llama_token))
    capacity = n_vocab * (len(text) + 16)
    while True:
        room = numpy.empty(capacity, dtype=numpy.uint8)
        text_at = ctypes.cast(room.ctypes.data, ctypes.c_char_p)
        total = llama.llama_detokenize(vocab, tokens, len(run), text_at, capacity, False, True)
        if total >= 0:
            break
        capacity = -total
    joined = room[:total]
    width = len(text)
    places = numpy.flatnonzero(joined[: total - width + 1] == text[0])
    for k in range(1, width):
        places = places[joined[places + k] == text[k]]
    # One place per separator, and one more: the separator token's own text, right after its separator.
    if len(places) != n_vocab + 1 or places[separator + 1] != places[separator] + width:
        return None
    places = numpy.delete(places, separator + 1)
    starts = places + width
    lengths = numpy.append(places[1:], total) - starts
    first = numpy.where(lengths > 0, joined[numpy.minimum(starts, total - 1)], -1).astype(numpy.int16)
    second = numpy.where(lengths > 1, joined[numpy.minimum(starts + 1, total - 1)], -1).astype(numpy.int16)
    first[separator], second[separator], lengths[separator] = text[0], text[1], width
    return first, second, lengths


def _checks(llama: Any, vocab: Any, first: numpy.ndarray, lengths: numpy.ndarray) -> bool:
    """Spot checks against llama.cpp's own pieces. A vocabulary that cleans up spaces when it
    detokenizes drops the space of a token " ." (and " ?", " '"...): where it does, the tokens
    whose text seems to start with one of `?!.,'` are read one by one and corrected."""
    n_vocab = len(first)
    sample = range(0, n_vocab, max(1, n_vocab // 64))
    if any(_head(_piece(llama, vocab, token)) != first[token] for token in sample):
        return False
    cleaned = numpy.flatnonzero(numpy.isin(first, numpy.frombuffer(b"?!.,'", dtype=numpy.uint8)))
    space, dot = (numpy.flatnonzero((lengths == 1) & (first == ord(c))) for c in " .")
    if len(space) and len(dot) and _joined(llama, vocab, [int(space[0]), int(dot[0])]) == b" .":
        return True
    for token in cleaned:
        piece = _piece(llama, vocab, int(token))
        first[token], lengths[token] = _head(piece), len(piece)
    return True


def _joined(llama: Any, vocab: Any, tokens: list[int]) -> bytes:
    ids = (llama.llama_token * len(tokens))(*tokens)
    buffer = ctypes.create_string_buffer(64)
    n = llama.llama_detokenize(vocab, ids, len(tokens), buffer, 64, False, True)
    return buffer.raw[: max(n, 0)]


def _table(
    llama: Any, vocab: Any, n_vocab: int, first: numpy.ndarray, second: numpy.ndarray, lengths: numpy.ndarray
) -> FirstBytes:
    by_byte = numpy.argsort(first, kind="stable").astype(numpy.int32)
    bounds = numpy.concatenate(([0], numpy.cumsum(numpy.bincount(first + 1, minlength=257)))).astype(numpy.int64)
    single = numpy.flatnonzero(lengths == 1)
    single = numpy.array([t for t in single.tolist() if not llama.llama_vocab_is_eog(vocab, t)], dtype=numpy.int32)
    spelled, at = numpy.unique(first[single], return_index=True)
    eos = llama.llama_vocab_eos(vocab)
    # llama.cpp reads a lone lead byte as the range of characters it can begin, but decodes an
    # overlong sequence (0xC0/0xC1, 0xE0 then < 0xA0, 0xF0 then < 0x90) to a character outside it;
    # 0xF5 and up begin no character.
    sound = numpy.ones(256, dtype=bool)
    sound[[0xC0, 0xC1]] = False
    sound[0xF5:] = False
    sound[0xE0] = not bool(((first == 0xE0) & (second >= 0) & (second < 0xA0)).any())
    sound[0xF0] = not bool(((first == 0xF0) & (second >= 0) & (second < 0x90)).any())
    return FirstBytes(
        n_vocab=n_vocab,
        first=first,
        by_byte=by_byte,
        bounds=bounds,
        probe_ids=single[at],
        probe_bytes=spelled.astype(numpy.uint8),
        sound=sound,
        eos=eos if 0 <= eos < n_vocab and llama.llama_vocab_is_eog(vocab, eos) else -1,
    )
