"""Several sequences decoded together in one llama.cpp context (continuous batching).

`Engine.generate` runs one sequence at a time, so each decode step multiplies the whole weight
matrix by a single token vector and the step is bound by memory bandwidth. Decoding N sequences in
one `llama_decode` call reads the weights once for N tokens: on a CPU the step costs little more
than a single-token step, so the aggregate tokens/s grows with N until the matmuls become
compute-bound.

How it works:
- A second context is created from the already-loaded model with `n_seq_max = N` and
  `kv_unified = False`: each sequence gets its own KV stream of `n_ctx_per_seq` cells. That is what
  makes a greedy item's reply the same as when it is decoded alone. llama.cpp's CPU attention
  accumulates over the cache cells in cell order, and in one shared (unified) buffer a recycled
  sequence lands in the holes other sequences left, out of position order: half of the greedy
  replies then drifted at some near-tie (8 of 16 in a test), while with one stream per sequence
  all 16 matched, at the same tokens/s (190 vs 185-193). (With flash attention off, the CPU
  default, 8 of 8 greedy items up to 128 tokens matched too; with it on, past 256 cached tokens
  llama.cpp's kernel for a lone query row rounds differently from the one for several rows: see
  bench/results/engine.md.)
- Each slot (sequence id 0..N-1) holds one item. Every step builds one batch: the last sampled token
  of each decoding slot, then chunks of pending prompt tokens of the slots still prefilling, up to
  `n_batch` tokens. So a new item's prefill rides along with the others' decode tokens.
- Each slot has its own sampler chain (the same chain `Engine.generate` samples through: repetition
  penalty, then greedy at temperature 0, else top-k / typical / top-p / min-p / temperature / dist(seed)),
  so an item samples as it would alone.
- Sequences finish independently (end-of-generation token, a stop string, max_tokens, the window);
  the freed slot takes the next item at once.
- Prefix reuse: a slot keeps its KV after its item ends. A new item starts from the longest common
  prefix found in any slot: its own leftover (trimmed with `llama_memory_seq_rm`) or another slot's
  (`llama_memory_seq_cp` copies a whole stream, then the copy is trimmed). When the best
  match is a prompt another slot is still prefilling (the first wave of items sharing one system
  prompt), the new item waits for that prefill and then copies it, so a shared prefix is evaluated
  once instead of N times.

Recurrent and hybrid models cannot trim or share part of a sequence; for them every item is
prefilled in full.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Sequence

from llmchat.engine import logs
from llmchat.engine.bindings import llama_cpp
from llmchat.engine.driver import DecodedResult, SequenceState, common_prefix
from llmchat.engine.interface import QueuedRequest, prompt_ids
from llmchat.engine.sampler import grammar_start, sampler_chain
from llmchat.errors import ModelError, UsageError

if TYPE_CHECKING:
    from llmchat.engine.core import Engine

# A new item waits for another slot's prefill only when that saves at least this many tokens.
MIN_WAIT_GAIN = 4
KV_ROUND = 256


class _Slot:
    """One sequence id and the item it is working on."""

    def __init__(self, seq_id: int):
        self.seq_id = seq_id
        self.item: QueuedRequest | None = None
        self.cache: list[int] = []  # tokens whose KV this sequence holds, positions 0..len-1
        self.pending: list[int] = []  # prompt tokens still to evaluate
        self.waiting_on: tuple[_Slot, int] | None = None  # (source slot, prefix length) to copy first
        self.next_token: int | None = None  # sampled, to be evaluated next step
        self.sampler = None
        self.result: DecodedResult | None = None
        self.state: SequenceState | None = None  # the item's reply rules, steering, seed and limit
        self.batch_index = -1  # where this slot's logits are in the current batch

    @property
    def busy(self) -> bool:
        return self.item is not None

    @property
    def planned(self) -> list[int]:
        """What this sequence's KV will hold once its prompt is evaluated."""
        return self.cache + self.pending


class ParallelDecoder:
    """Decode up to `n_seq` items at once in one context sized `n_seq × n_ctx_per_seq`.

    Usage: `ParallelDecoder(engine, 4, 2048).run(items, on_done)`; `on_done(DecodedResult)` is
    called as each item finishes (out of input order). The context is freed when `run` returns.
    """

    def __init__(self, engine: Engine, n_seq: int, n_ctx_per_seq: int, *, n_batch: int | None = None):
        if n_seq < 1:
            raise UsageError(f"--parallel must be at least 1, got {n_seq}")
        self.engine = engine
        self.n_seq = n_seq
        self.n_ctx_per_seq = n_ctx_per_seq
        self.n_batch = max(n_seq, n_batch or engine.model.n_batch)
        model = engine.model.model
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self._vocab))
        self.penalty_last_n = engine.penalty_last_n
        self.can_share = not (llama_cpp.llama_model_is_recurrent(model) or llama_cpp.llama_model_is_hybrid(model))
        self.generated_total = 0
        self.prompt_evaluated = 0  # prompt tokens actually run through the model
        self.prompt_reused = 0  # prompt tokens taken from the KV cache instead
        self.steps = 0
        self._ctx = None
        self._batch = None
        self._mem = None

    def summary(self) -> str:
        return (
            f"parallel: {self.steps} decode steps; prompt tokens: {self.prompt_evaluated} evaluated, "
            f"{self.prompt_reused} reused from the KV cache (shared prefixes)"
        )

    # --- resources -----------------------------------------------------------------------------
    def _open(self) -> None:
        params = llama_cpp.llama_context_params.from_buffer_copy(self.engine.model.context_params)
        # Each stream holds one slot's full window, rounded up to 256 cells as llama.cpp does.
        params.n_ctx = self.n_seq * (-(-self.n_ctx_per_seq // KV_ROUND) * KV_ROUND)
        params.n_batch = self.n_batch
        params.n_ubatch = self.n_batch
        params.n_seq_max = self.n_seq
        params.kv_unified = False  # one stream per sequence: see the module docstring
        # A sliding-window cache drops old positions; a copied or trimmed prefix needs all of them.
        params.swa_full = True
        # The count the engine's tuner (engine.threads) holds now, fixed for this batch: a step's
        # time moves with how many streams it decodes, so it says little about the threads.
        params.n_threads = params.n_threads_batch = self.engine.threads
        logs.recent_errors.clear()
        ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not ctx:
            reason = logs.last_error() or "llama_init_from_model failed"
            raise ModelError(
                f"could not create a {self.n_seq}-sequence context of {params.n_ctx} tokens: {reason}; "
                "try a smaller --parallel or --ctx"
            )
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, self.n_seq)

    # Each handle leaves its field before it is freed. A signal's handler runs between bytecodes,
    # so a SIGTERM landing right after a free but before the field was cleared left a freed
    # handle behind, and the cleanup it started freed it again: a crash (exit -11) instead of 143.
    # Cleared first, the worst a signal can do is leak a handle the exit reclaims anyway.
    def _close(self, slots: list[_Slot]) -> None:
        for slot in slots:
            self._free_sampler(slot)
        batch, self._batch = self._batch, None
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        ctx, self._ctx, self._mem = self._ctx, None, None
        if ctx is not None:
            llama_cpp.llama_free(ctx)

    def _free_sampler(self, slot: _Slot) -> None:
        sampler, slot.sampler = slot.sampler, None
        if sampler is not None:
            llama_cpp.llama_sampler_free(sampler)

    def _make_sampler(self, state: SequenceState, prompt: Sequence[int]):
        """The chain `Engine.generate` samples through, so that one item samples as it would alone;
        each slot gets its own, and so its own grammar state. After forced tokens a new one is made
        over the prompt and the reply so far, as `Engine.generate` restarts its stream."""
        request = state.request
        reply = state.outcome.generated_ids
        return sampler_chain(
            self._vocab,
            self.n_vocab,
            self.penalty_last_n,
            request.sampling,
            state.seed,
            request.grammar,
            start_after=grammar_start(self.engine.model, request.grammar_after, reply),
            history=list(prompt) + reply,
            loop_exit=state.reply.loop_exit,
        )

    # --- the loop ------------------------------------------------------------------------------
    def run(
        self,
        items: Iterable[QueuedRequest],
        on_done: Callable[[DecodedResult], None],
        on_step: Callable[["ParallelDecoder"], None] | None = None,
    ) -> None:
        """Decode every item; `on_done` gets each result as it finishes; `on_step` after each decode."""
        queue: Iterator[QueuedRequest] = iter(items)
        slots = [_Slot(i) for i in range(self.n_seq)]
        self._open()
        try:
            exhausted = False
            while True:
                if not exhausted:
                    exhausted = self._admit(slots, queue, on_done)
                active = [s for s in slots if s.busy]
                if not active:
                    break
                self._step(slots, on_done)
                if on_step is not None:
                    on_step(self)
        finally:
            self._close(slots)

    def _admit(self, slots: list[_Slot], queue: Iterator[QueuedRequest], on_done: Callable) -> bool:
        """Give every free slot the next item. Returns True once the queue is exhausted."""
        for slot in slots:
            while not slot.busy:
                item = next(queue, None)
                if item is None:
                    return True
                self._start(slot, item, slots, on_done)
        return False

    def _start(self, slot: _Slot, item: QueuedRequest, slots: list[_Slot], on_done: Callable) -> None:
        prompt = list(prompt_ids(item.request.prompt))
        now = time.perf_counter()
        state = SequenceState(self.engine, item.request, self.n_ctx_per_seq, feeds_steering=True)
        outcome = state.outcome
        outcome.t_start = now
        result = DecodedResult(key=item.key, outcome=outcome, seed=state.seed, t_submit=now)
        if not prompt or len(prompt) >= self.n_ctx_per_seq:
            outcome.finish_reason = "error"
            result.error = (
                "empty prompt"
                if not prompt
                else f"the prompt is {len(prompt)} tokens but each sequence holds {self.n_ctx_per_seq}"
            )
            on_done(result)
            return
        if not state.start(now):  # no room for a single token
            on_done(result)
            return
        slot.item = item
        slot.result = result
        slot.state = state
        slot.next_token = None
        slot.waiting_on = None
        slot.sampler = self._make_sampler(state, prompt)

        if not self.can_share:
            self._clear(slot)
            slot.pending = prompt
            return
        # The longest prefix already in some sequence's KV (at least one token is evaluated, for logits).
        cap = len(prompt) - 1
        best_len, best_slot = min(common_prefix(slot.cache, prompt), cap), slot
        for other in slots:
            if other is not slot:
                n = min(common_prefix(other.cache, prompt), cap)
                if n > best_len:
                    best_len, best_slot = n, other
        # Or a longer one that another slot is about to evaluate: wait for it rather than compute it twice.
        wait_len, wait_slot = 0, None
        for other in slots:
            if other is not slot and other.busy and other.pending and other.waiting_on is None:
                n = min(common_prefix(other.planned, prompt), cap)
                if n > max(best_len + MIN_WAIT_GAIN, wait_len):
                    wait_len, wait_slot = n, other
        if wait_slot is not None:
            slot.waiting_on = (wait_slot, wait_len)
            slot.pending = prompt
            return
        self._reuse(slot, best_slot, best_len, prompt)

    def _reuse(self, slot: _Slot, source: _Slot, length: int, prompt: list[int]) -> None:
        """Start `slot` on `prompt` with its first `length` tokens taken from `source`'s KV."""
        if source is slot and length > 0:
            if not llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, length, -1):
                self._clear(slot)
                length = 0
            del slot.cache[length:]
        else:
            self._clear(slot)
            if length > 0:
                # Between streams llama.cpp copies only whole sequences (the data moves at the next
                # decode, before the batch runs); the copy's tail beyond the prefix is then dropped.
                llama_cpp.llama_memory_seq_cp(self._mem, source.seq_id, slot.seq_id, -1, -1)
                llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, length, -1)
                slot.cache = prompt[:length]
        slot.pending = prompt[length:]
        assert slot.result is not None  # _start gave the slot its item first
        slot.result.outcome.cached_tokens = length
        self.prompt_reused += length

    def _clear(self, slot: _Slot) -> None:
        llama_cpp.llama_memory_seq_rm(self._mem, slot.seq_id, -1, -1)
        slot.cache = []

    def _resolve_waits(self, slots: list[_Slot]) -> None:
        for slot in slots:
            if slot.waiting_on is None:
                continue
            source, length = slot.waiting_on
            still_coming = source.busy and source.pending and len(source.cache) < length
            if still_coming:
                continue
            prompt = slot.pending
            slot.waiting_on = None
            length = min(length, common_prefix(source.cache, prompt))
            own = min(common_prefix(slot.cache, prompt), len(prompt) - 1)
            if own >= length:
                self._reuse(slot, slot, own, prompt)
            else:
                self._reuse(slot, source, length, prompt)

    def _step(self, slots: list[_Slot], on_done: Callable) -> None:
        self._resolve_waits(slots)
        batch = self._batch
        assert batch is not None  # run() opened the context
        n = 0
        added: list[tuple[_Slot, list[int]]] = []

        def put(slot: _Slot, token: int, pos: int, logits: bool) -> None:
            nonlocal n
            batch.token[n] = token
            batch.pos[n] = pos
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = slot.seq_id
            batch.logits[n] = 1 if logits else 0
            if logits:
                slot.batch_index = n
            n += 1

        for slot in slots:
            slot.batch_index = -1
            if slot.busy and slot.next_token is not None:
                put(slot, slot.next_token, len(slot.cache), True)
                added.append((slot, [slot.next_token]))
        for slot in slots:
            if not slot.busy or slot.next_token is not None or slot.waiting_on is not None or not slot.pending:
                continue
            room = self.n_batch - n
            if room <= 0:
                break
            chunk = slot.pending[:room]
            start = len(slot.cache)
            last = len(chunk) == len(slot.pending)
            for offset, token in enumerate(chunk):
                put(slot, token, start + offset, last and offset == len(chunk) - 1)
            added.append((slot, chunk))
        if n == 0:
            return
        batch.n_tokens = n
        code = llama_cpp.llama_decode(self._ctx, batch)
        now = time.perf_counter()
        self.steps += 1
        if code != 0:
            reason = logs.last_error() or ("no KV-cache room" if code == 1 else f"llama_decode returned {code}")
            for slot, _ in added:
                self._fail(slot, f"decoding failed: {reason}", now, on_done)
            return
        for slot, tokens in added:
            slot.cache.extend(tokens)
            if slot.pending:
                del slot.pending[: len(tokens)]
                self.prompt_evaluated += len(tokens)
        for slot in slots:
            if slot.busy and slot.batch_index >= 0:
                token = llama_cpp.llama_sampler_sample(slot.sampler, self._ctx, slot.batch_index)
                self._on_token(slot, int(token), now, on_done)
        # Before a finished slot takes a new item and trims its KV, let the items waiting on it copy.
        self._resolve_waits(slots)

    def _on_token(self, slot: _Slot, token: int, now: float, on_done: Callable) -> None:
        """The shared reply rules and steering (`SequenceState`): EOG ends (not counted), stop
        strings, the loop stop, the limit, a thinking budget's forced close."""
        state = slot.state
        assert state is not None, "a busy slot has its state"
        before = state.outcome.generated_tokens
        step = state.on_token(token, now)
        if not step.dropped and not state.done:
            step = state.steer(now)
        if step.forced:
            # Forced tokens (the end of a thinking block) are evaluated after the sampled one, as a
            # short prefill of this sequence; the next token is sampled after them. They join the
            # penalty window as a restarted stream's prompt would (`Engine.generate`).
            slot.next_token = None
            slot.pending = ([] if step.dropped else [token]) + list(step.forced)
            self._free_sampler(slot)
            slot.sampler = self._make_sampler(state, prompt_ids(state.request.prompt))
        self.generated_total += state.outcome.generated_tokens - before
        if state.done:
            self._finish(slot, now, on_done)
        elif not step.forced:
            slot.next_token = token

    def _finish(self, slot: _Slot, now: float, on_done: Callable) -> None:
        result, state = slot.result, slot.state
        assert result is not None and state is not None  # only a busy slot finishes
        state.tail()
        result.text = state.text()
        self._release(slot)
        on_done(result)

    def _fail(self, slot: _Slot, message: str, now: float, on_done: Callable) -> None:
        result = slot.result
        assert result is not None  # only a busy slot fails
        result.outcome.finish_reason = "error"
        result.error = message
        result.text = slot.state.text() if slot.state is not None else ""
        self._clear(slot)
        self._release(slot)
        on_done(result)

    def _release(self, slot: _Slot) -> None:
        """The slot is free; its KV (prompt and evaluated reply) stays for prefix reuse."""
        self._free_sampler(slot)
        slot.item = None
        slot.result = None
        slot.state = None
        slot.pending = []
        slot.next_token = None
        slot.waiting_on = None


def context_per_sequence(needed: int, limit: int) -> int:
    """The window each sequence gets: what the longest item needs (prompt + max_tokens), at most `limit`."""
    return max(1, min(limit, needed))
