"""Speculative decoding: who drafts tokens, how many, and what the verifying model computes.

llama-cpp-python's `Llama.generate` runs the loop: after each sampled token it asks the drafter
for a guess of the next tokens, evaluates the sampled token and the guesses in one pass, samples
at every position, and keeps the drafts up to the first one the model would not have chosen. The
reply is therefore always the model's own; drafting only changes how many passes it takes.

On a CPU a pass over 9 tokens costs far more than a single-token pass (about 4 × on SmolLM2 with
2 threads), so a wrong draft is expensive. The library's own prompt-lookup drafter proposes
whenever any single token of the context recurs, which on free text made `--lookup` 2–3 × slower
than plain decoding (5.7% of drafts accepted). Both drafters here therefore adapt the draft
length to how the previous draft fared: double it after a fully accepted draft (up to
`max_tokens`), shrink it to what was accepted otherwise. Prompt lookup also needs a 3-token match.
Measured on SmolLM2: 1.8 × decode on a copy task, 0.9–1.0 × on free text (bench/results/engine.md).
"""

from __future__ import annotations

from typing import Sequence

import llama_cpp
import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

_NOTHING = np.array([], dtype=np.intc)


class DraftLength:
    """The number of tokens to draft next, from how the last draft fared."""

    def __init__(self, max_tokens: int, start: int = 4):
        self.max_tokens = max_tokens
        self.start = min(start, max_tokens)
        self.current = self.start
        self._last: tuple[int, np.ndarray] | None = None  # (position, drafted tokens)

    def reset(self) -> None:
        self.current = self.start
        self._last = None

    def update(self, ids: np.ndarray) -> None:
        """Judge the previous draft against the context the model has accepted since."""
        if self._last is None:
            return
        start, drafted = self._last
        self._last = None
        got = ids[start : start + len(drafted)]
        accepted = 0
        for ours, final in zip(drafted, got):
            if ours != final:
                break
            accepted += 1
        if accepted == len(drafted) and len(got) == len(drafted):
            self.current = min(self.current * 2, self.max_tokens)
        else:
            self.current = max(1, accepted)

    def proposed(self, position: int, drafted: np.ndarray) -> np.ndarray:
        if len(drafted):
            self._last = (position, drafted)
        return drafted


class PromptLookupDrafter(LlamaDraftModel):
    """Drafts by copying: finds the context's last `min_ngram`..`max_ngram` tokens earlier in the
    context (the most recent occurrence of the longest match) and proposes what followed them."""

    def __init__(self, max_tokens: int, min_ngram: int = 3, max_ngram: int = 4):
        self.length = DraftLength(max_tokens)
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram

    def start_reply(self, prompt_length: int, repeat_penalty: float) -> None:
        self.length.reset()

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        ids = np.asarray(input_ids)
        self.length.update(ids)
        n = len(ids)
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            earlier = np.lib.stride_tricks.sliding_window_view(ids[: n - 1], size)
            hits = np.nonzero((earlier == ids[n - size :]).all(axis=1))[0]
            if len(hits):
                follows = int(hits[-1]) + size
                drafted = ids[follows : follows + self.length.current].astype(np.intc)
                return self.length.proposed(n, drafted)
        return _NOTHING


class DraftModelDrafter(LlamaDraftModel):
    """A small model with the same vocabulary drafts greedily; the main model verifies the drafts.

    The draft model keeps its own KV cache and only evaluates what is new since its last call.
    Its picks follow the main model's greedy choice as closely as it can: the same repeat
    penalty over the same history. The main model's penalty sampler is created for each reply
    and its window holds the last `penalty_last_n` tokens of prompt and reply (as on
    llama-server; engine.parallel's `sampler_chain`), so the drafter applies the penalty to the
    same last tokens plus its own drafts. Without that, every
    place where the penalty changes the main model's pick rejects the draft (acceptance fell
    from 94% to 77% at the default 1.1 in a self-draft test).
    """

    def __init__(self, draft: "llama_cpp.Llama", max_tokens: int, penalty_last_n: int):
        self.draft = draft
        self.length = DraftLength(max_tokens)
        self.penalty_last_n = penalty_last_n
        self.repeat_penalty = 1.0
        self._vocab = llama_cpp.llama_model_get_vocab(draft._model.model)
        self._n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))

    def start_reply(self, prompt_length: int, repeat_penalty: float) -> None:
        del prompt_length  # the penalty window spans the prompt too (see the class docstring)
        self.repeat_penalty = repeat_penalty
        self.length.reset()

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        draft = self.draft
        ids = [int(t) for t in input_ids]
        self.length.update(np.asarray(ids))
        k = self.length.current
        if not ids or len(ids) + k >= draft.n_ctx():
            return _NOTHING
        # Reuse the longest cached prefix; at least one token is evaluated, for fresh logits.
        cached = draft.input_ids[: draft.n_tokens]
        common = 0
        for old, new in zip(cached, ids[:-1]):
            if old != new:
                break
            common += 1
        if not draft._ctx.kv_cache_seq_rm(-1, common, -1):
            draft.reset()  # a cache that cannot drop a suffix (recurrent): start over
            common = 0
        draft.n_tokens = common
        draft.eval(ids[common:])
        history = ids[-self.penalty_last_n :] if self.penalty_last_n > 0 else []
        drafted: list[int] = []
        while True:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(draft._ctx.ctx, -1), shape=(self._n_vocab,))
            if self.repeat_penalty != 1.0 and history:
                logits = logits.copy()
                seen = np.unique(np.asarray(history[-self.penalty_last_n :], dtype=np.intp))
                # llama.cpp's penalties sampler: shrink a positive logit, push a negative one lower.
                logits[seen] = np.where(
                    logits[seen] <= 0, logits[seen] * self.repeat_penalty, logits[seen] / self.repeat_penalty
                )
            token = int(np.argmax(logits))  # the first maximum, as llama.cpp's greedy sampler picks
            drafted.append(token)
            if len(drafted) >= k or llama_cpp.llama_vocab_is_eog(self._vocab, token):
                break
            history.append(token)
            draft.eval([token])
        return self.length.proposed(len(ids), np.array(drafted, dtype=np.intc))


class CountingDrafter(LlamaDraftModel):
    """Wraps a drafter to measure its acceptance rate: each proposal is remembered with the position
    it starts at, and compared with what the main model finally produced."""

    def __init__(self, inner: PromptLookupDrafter | DraftModelDrafter):
        self.inner = inner
        self.proposals: list[tuple[int, np.ndarray]] = []

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        drafted = self.inner(input_ids, **kwargs)
        if len(drafted):
            self.proposals.append((len(input_ids), np.array(drafted, dtype=np.intc)))
        return drafted

    def start_reply(self, prompt_length: int, repeat_penalty: float) -> None:
        self.inner.start_reply(prompt_length, repeat_penalty)

    def acceptance(self, final_ids: Sequence[int]) -> tuple[int, int]:
        """(proposed, accepted) since the last call. Drafts past the reply's end (it stopped at a
        stop string or the token limit) were never judged and are not counted."""
        proposed = accepted = 0
        for start, drafted in self.proposals:
            judged = drafted[: max(0, len(final_ids) - start)]
            proposed += len(judged)
            for offset, token in enumerate(judged):
                if final_ids[start + offset] != token:
                    break
                accepted += 1
        self.proposals.clear()
        return proposed, accepted


class DraftingLlama(llama_cpp.Llama):
    """A Llama that computes logits only where speculative `generate` samples.

    With a drafter set, llama-cpp-python forces `logits_all`: every evaluated position gets an
    output row (n_vocab multiply-adds per embedding dimension) and a copy into a score array of
    n_ctx × n_vocab floats. For a 3,461-token prompt on SmolLM2 that meant peak RSS 1105 MiB
    instead of 264, and prefill 281 instead of 372 tok/s (bench/results/engine.md). Yet
    `generate` samples only at the last token of a prompt and at each position of a verification
    batch (the last sampled token plus the drafts), and it samples through
    `llama_sampler_sample` with negative indices, which llama.cpp counts back from the outputs of
    the last decode. So outputs for the last `output_window` positions of each eval are all it
    needs; llmchat reads neither `scores` nor logprobs. Build it with `logits_all=False`, which
    sizes the library's score array by n_batch instead of n_ctx.
    """

    def __init__(self, *args, output_window: int, **kwargs):
        self.output_window = output_window
        super().__init__(*args, **kwargs)

    def eval(self, tokens: Sequence[int]) -> None:
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        first_needed = max(0, len(tokens) - self.output_window)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            n_past = self.n_tokens
            self._batch.set_batch(batch=chunk, n_past=n_past, logits_all=False)  # marks the chunk's last token
            for i in range(max(0, first_needed - start), len(chunk)):
                self._batch.batch.logits[i] = True
            self._ctx.decode(self._batch)
            self.input_ids[n_past : n_past + len(chunk)] = chunk
            self.n_tokens += len(chunk)
            self._requires_eval = False
