"""Whether a grammar lets a given text through: llama.cpp's own grammar engine, asked token by token.

This is the engine that decodes (`llama_sampler_init_grammar`, the sampler the grammar gate holds),
so what it accepts here is what a model can write under `--schema`, and what it refuses here no
model can write. No weights are evaluated: the text is tokenized with the model's vocabulary, each
token is offered to the grammar (refused: its logit becomes -inf) and then accepted, and at the
end the vocabulary's end-of-generation token must be allowed (the grammar is complete).

Used by `bench/schema_suite.py` and the tests to measure `--schema` against the JSON Schema Test
Suite: a valid instance the grammar refuses is a wall, an invalid one it lets through a hole.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

from llmchat.errors import UsageError


def check_parses(text: str, source: str) -> None:
    """Parse a grammar with llama.cpp, no model needed (UsageError with llama.cpp's reason)."""
    from llmchat.engine import logs
    from llmchat.engine.bindings import llama_cpp

    logs.ensure_installed()
    logs.recent_errors.clear()
    sampler = llama_cpp.llama_sampler_init_grammar(None, text.encode("utf-8"), b"root")
    if not sampler:
        reason = logs.last_error() or "llama.cpp could not parse it"
        raise UsageError(f"{source}: not a usable GBNF grammar: {' '.join(reason.split())}")
    llama_cpp.llama_sampler_free(sampler)


class GrammarProbe:
    """One parsed grammar over one vocabulary; `accepts(text)` as often as needed, then `close()`."""

    def __init__(self, vocab: Any, gbnf: str):
        from llmchat.engine.bindings import llama_cpp

        self._llama = llama_cpp
        self._vocab = vocab
        self._grammar = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
        if not self._grammar:
            raise UsageError("llama.cpp could not parse the grammar")
        self._end = int(llama_cpp.llama_vocab_eos(vocab))
        self._one = (llama_cpp.llama_token_data * 1)()
        self._array = llama_cpp.llama_token_data_array(self._one, 1, -1, False)

    def accepts(self, text: str) -> bool:
        """Whether the grammar lets exactly `text` be written and then the reply end."""
        llama = self._llama
        probe = llama.llama_sampler_clone(self._grammar)
        try:
            for token in [*self._tokenize(text), self._end]:
                if not self._allowed(probe, token):
                    return False
                if token != self._end:
                    llama.llama_sampler_accept(probe, token)
            return True
        finally:
            llama.llama_sampler_free(probe)

    def _allowed(self, sampler: Any, token: int) -> bool:
        one = self._one[0]
        one.id, one.logit, one.p = token, 0.0, 0.0
        self._array.size, self._array.selected, self._array.sorted = 1, -1, False
        self._llama.llama_sampler_apply(sampler, ctypes.byref(self._array))
        return bool(math.isfinite(self._one[0].logit))

    def _tokenize(self, text: str) -> list[int]:
        llama = self._llama
        data = text.encode("utf-8")
        buffer = (llama.llama_token * (len(data) + 8))()
        n = llama.llama_tokenize(self._vocab, data, len(data), buffer, len(buffer), False, False)
        if n < 0:
            raise ValueError(f"could not tokenize {len(data)} bytes")
        return list(buffer[:n])

    def close(self) -> None:
        if self._grammar:
            self._llama.llama_sampler_free(self._grammar)
            self._grammar = None

    def __enter__(self) -> GrammarProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
