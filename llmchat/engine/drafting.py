"""Speculative decoding: who drafts tokens, how many, and what the verifying model computes.

`LoadedModel.generate` (llmchat.engine.native) runs the loop: after each sampled token it asks the drafter
for a guess of the next tokens, evaluates the sampled token and the guesses in one pass, samples
at every position, and keeps the drafts up to the first one the model would not have chosen. The
reply is therefore always the model's own; drafting only changes how many passes it takes.

On a CPU a pass over 9 tokens costs far more than a single-token pass (about 4 × on SmolLM2 with
2 threads), so a wrong draft is expensive. llama-cpp-python's prompt-lookup drafter proposes
whenever any single token of the context recurs, which on free text made `--lookup` 2–3 × slower
than plain decoding (5.7% of drafts accepted). Both drafters here therefore adapt the draft
length to how the previous draft fared: double it after a fully accepted draft (up to
`max_tokens`), shrink it to what was accepted otherwise. Prompt lookup also needs a 3-token match,
and finds it in an index of the context's n-grams that grows with the context (O(1) a step).
Measured on SmolLM2: 1.8 × decode on a copy task, 0.9–1.0 × on free text (bench/results/engine.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from llmchat.engine.bindings import llama_cpp
from llmchat.engine.media.marks import is_media

if TYPE_CHECKING:
    from llmchat.engine.native import LoadedModel


class DraftLength:
    """The number of tokens to draft next, from how the last draft fared."""

    def __init__(self, max_tokens: int, start: int = 4):
        self.max_tokens = max_tokens
        self.start = min(start, max_tokens)
        self.current = self.start
        self._last: tuple[int, list[int]] | None = None  # (position, drafted tokens)

    def reset(self) -> None:
        self.current = self.start
        self._last = None

    def update(self, ids: Sequence[int]) -> None:
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

    def proposed(self, position: int, drafted: list[int]) -> list[int]:
        if drafted:
            self._last = (position, drafted)
        return drafted


class PromptLookupDrafter:
    """Drafts by copying: finds the context's last `min_ngram`..`max_ngram` tokens earlier in the
    context (the most recent occurrence of the longest match) and proposes what followed them.

    The context is indexed as it grows, so a step costs the same at any context length: each
    n-gram that has a token after it maps to that token's position, the most recent occurrence
    winning. (Searching the whole context at every step cost 0.2 ms at 2,000 tokens and 3.5-5.5 ms
    at 32,000, against about 10 ms for a one-token pass of SmolLM2 on 2 threads.) Within a reply
    the context only grows by accepted tokens; the first call of a reply checks it against what
    was indexed and starts over where it is not a continuation (another conversation, an edited
    history). An index that missed a change could only give worse drafts, never another reply:
    the model verifies every draft. Images and audio in the context are ids too
    (llmchat.engine.media.marks), which a draft must not hold: one stops before the first."""

    def __init__(self, max_tokens: int, min_ngram: int = 3, max_ngram: int = 4):
        self.length = DraftLength(max_tokens)
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self._indexed: list[int] = []  # the context whose n-grams are in `_follower`
        self._follower: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest follower is
        self._check_prefix = True

    def start_reply(self, prompt_length: int, repeat_penalty: float) -> None:
        self.length.reset()
        self._check_prefix = True

    def __call__(self, ids: Sequence[int], /) -> list[int]:
        self.length.update(ids)
        self._index(ids)
        n = len(ids)
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            follows = self._follower.get(tuple(ids[n - size :]))
            if follows is None:
                continue
            drafted = list(ids[follows : follows + self.length.current])
            for at, token in enumerate(drafted):
                if is_media(token):
                    del drafted[at:]
                    break
            if drafted:
                return self.length.proposed(n, drafted)
        return []

    def _index(self, ids: Sequence[int]) -> None:
        indexed = self._indexed
        done = len(indexed)
        if self._check_prefix:
            continues = list(ids[:done]) == indexed
            self._check_prefix = False
        else:  # within a reply: a continuation unless something unforeseen happened
            continues = done == 0 or (done <= len(ids) and ids[done - 1] == indexed[-1])
        if not continues:
            indexed.clear()
            self._follower.clear()
            done = 0
        follower = self._follower
        for position in range(done, len(ids)):
            indexed.append(ids[position])
            for size in range(self.min_ngram, min(self.max_ngram, position) + 1):
                follower[tuple(indexed[position - size : position])] = position


class DraftModelDrafter:
    """A small model with the same vocabulary drafts greedily; the main model verifies the drafts.

    The draft model keeps its own KV cache and only evaluates what is new since its last call.
    Its picks follow the main model's greedy choice as closely as it can: the same repeat
    penalty over the same history. The main model's penalty sampler is created for each reply
    and its window holds the last `penalty_last_n` tokens of prompt and reply (as on
    llama-server; engine.sampler's `sampler_chain`), so the drafter applies the penalty to the
    same last tokens plus its own drafts. Without that, every
    place where the penalty changes the main model's pick rejects the draft (acceptance fell
    from 94% to 77% at the default 1.1 in a self-draft test).
    """

    def __init__(self, draft: LoadedModel, max_tokens: int, penalty_last_n: int):
        import numpy  # the argmax over the vocabulary, per drafted token; only with --draft-model

        self._np = numpy
        self.draft = draft
        self.length = DraftLength(max_tokens)
        self.penalty_last_n = penalty_last_n
        self.repeat_penalty = 1.0
        self._n_vocab = draft.n_vocab
        self._context_length = 0  # the context of the last call, which the draft cache then held

    def start_reply(self, prompt_length: int, repeat_penalty: float) -> None:
        del prompt_length  # the penalty window spans the prompt too (see the class docstring)
        self.repeat_penalty = repeat_penalty
        self.length.reset()

    def __call__(self, input_ids: Sequence[int], /) -> list[int]:
        np = self._np
        draft = self.draft
        ids = list(input_ids)
        self.length.update(ids)
        k = self.length.current
        if not ids or len(ids) + k >= draft.n_ctx:
            return []
        # Reuse the longest cached prefix; at least one token is evaluated, for fresh logits. Within
        # a reply the cache holds the previous call's context, which this one continues: that part
        # is compared in one C-level list comparison (0.6 ms at 32,000 tokens, on a busy machine),
        # and only what follows it token by token (a Python loop over all of it took 2.2 ms there).
        cached = draft.tokens
        common = min(self._context_length, len(cached), len(ids) - 1)
        if cached[:common] != ids[:common]:
            common = 0
        for old, new in zip(cached[common:], ids[common:-1]):
            if old != new:
                break
            common += 1
        self._context_length = len(ids)
        if not draft.keep(common):
            draft.clear()  # a cache that cannot drop a suffix (recurrent): start over
            common = 0
        draft.eval(ids[common:])
        history = ids[-self.penalty_last_n :] if self.penalty_last_n > 0 else []
        drafted: list[int] = []
        while True:
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(draft.ctx, -1), shape=(self._n_vocab,))
            if self.repeat_penalty != 1.0 and history:
                logits = logits.copy()
                seen = np.unique(np.asarray(history[-self.penalty_last_n :], dtype=np.intp))
                # llama.cpp's penalties sampler: shrink a positive logit, push a negative one lower.
                logits[seen] = np.where(
                    logits[seen] <= 0, logits[seen] * self.repeat_penalty, logits[seen] / self.repeat_penalty
                )
            token = int(np.argmax(logits))  # the first maximum, as llama.cpp's greedy sampler picks
            drafted.append(token)
            if len(drafted) >= k or llama_cpp.llama_vocab_is_eog(draft.vocab, token):
                break
            history.append(token)
            draft.eval([token])
        return self.length.proposed(len(ids), drafted)


class CountingDrafter:
    """Wraps a drafter to measure its acceptance rate: each proposal is remembered with the position
    it starts at, and compared with what the main model finally produced."""

    def __init__(self, inner: PromptLookupDrafter | DraftModelDrafter):
        self.inner = inner
        self.proposals: list[tuple[int, list[int]]] = []

    def __call__(self, ids: Sequence[int], /) -> list[int]:
        drafted = self.inner(ids)
        if drafted:
            self.proposals.append((len(ids), list(drafted)))
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
