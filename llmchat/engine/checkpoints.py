"""Checkpoints of a recurrent or hybrid model's recurrent state, so that a prompt that leaves the
cached one is prefilled from near where it leaves, not from the start.

A recurrent state (Mamba, LFM2's short convolutions, Qwen3.5's Gated DeltaNet) holds the whole
sequence folded into one value: llama.cpp cannot drop a suffix of it (`llama_memory_seq_rm`
returns false), so a cache that must be cut back would be thrown away. llama-server keeps copies
of that state at chosen points instead (`tools/server/server-context.cpp`: `--ctx-checkpoints`,
`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`); this is the same idea for sequence 0:
- `save(n)` copies the recurrent part of the state while it holds the first n tokens (the
  attention part of a hybrid can be cut back anyway, so it is not copied);
- `restore(n)` loads the latest copy taken at n tokens or fewer; the caller then drops the
  attention cells after it (`llama_memory_seq_rm` succeeds once the recurrent part is that old)
  and prefills from there;
- `cuts(start, end, parting)`: where a prefill from `start` to `end` stops to save one: where it
  starts, 4 and 4 + batch tokens before the prompt's end (llama-server's places: `/retry` leaves
  the cache 1 token before the end, and a template whose rewrite of the last turn it cannot tell
  leaves it a few tokens before), and the `parting` points the turn names: where the next prompts
  will leave this one, found from the template (llmchat.turn.parting: where it rewrites the
  generation prompt when it renders the reply as history, where the last user message begins);
- `hold(n)`: one more copy, outside the list, taken before each batch of drafted tokens is
  verified (`--lookup`, `--draft-model`), so that a rejected draft costs its batch, not the reply.

The list is capped by count and by bytes; when full, llama-server's rule first drops a checkpoint
within `min_step` tokens of the one before it, then the oldest. A checkpoint belongs to the tokens
the sequence held when it was taken: `drop_after(n)` and `clear()` are called whenever those
change (LoadedModel), which is the one place that changes them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

from llmchat.defaults import DEFAULT_CTX_CHECKPOINTS, DEFAULT_CTX_CHECKPOINTS_MIB
from llmchat.engine.bindings import llama_cpp

PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
MIN_STEP = 8192  # llama-server's --checkpoint-min-step default
END_OFFSET = 4  # llama-server's: checkpoints 4 and 4 + batch tokens before the prompt's end


@dataclass
class Checkpoint:
    n_tokens: int  # the state is that of the sequence's first n_tokens tokens
    data: ctypes.Array  # llama_state_seq_get_data_ext(..., PARTIAL_ONLY)


class Checkpoints:
    """The recurrent-state checkpoints of sequence 0 of one context, in order of `n_tokens`."""

    def __init__(
        self, ctx: object, *, count: int = DEFAULT_CTX_CHECKPOINTS, max_bytes: int = DEFAULT_CTX_CHECKPOINTS_MIB << 20
    ):
        self.ctx = ctx
        self.count = count
        self.max_bytes = max_bytes
        self.saved: list[Checkpoint] = []
        self.fresh: set[int] = set()  # n_tokens of those taken during the current prefill: kept
        # The state before a batch of drafted tokens (one at a time, outside the count): a rejected
        # draft goes back there, not to the prompt.
        self.held: Checkpoint | None = None

    @property
    def bytes(self) -> int:
        return sum(len(checkpoint.data) for checkpoint in self._all())

    def cuts(self, start: int, end: int, n_batch: int, parting: Sequence[int] = ()) -> list[int]:
        """Where a prefill of the tokens from `start` to `end` stops to save a checkpoint; `parting`:
        the token counts where the caller expects later prompts to leave this one."""
        self.fresh.clear()
        if end - start <= END_OFFSET:  # a few tokens (a thinking budget's forced end): nothing to gain
            return []
        wanted = {start, end - END_OFFSET - n_batch, end - END_OFFSET, *parting}
        return sorted(n for n in wanted if 0 < n <= end and n >= start and n not in self._positions())

    def save(self, n_tokens: int) -> None:
        """Copy the recurrent state now, while the sequence holds its first `n_tokens` tokens."""
        data = self._copy()
        if data is None:
            return
        self.saved = [checkpoint for checkpoint in self.saved if checkpoint.n_tokens != n_tokens]
        self._make_room(len(data))
        self.saved.append(Checkpoint(n_tokens, data))
        self.saved.sort(key=lambda checkpoint: checkpoint.n_tokens)
        self.fresh.add(n_tokens)

    def hold(self, n_tokens: int) -> None:
        """Copy the state before drafted tokens are verified (replacing the last such copy)."""
        data = self._copy()
        self.held = Checkpoint(n_tokens, data) if data is not None else None

    def nearest(self, n_tokens: int) -> int:
        """The latest checkpoint at `n_tokens` or fewer (0: none)."""
        found = self._latest(n_tokens)
        return found.n_tokens if found else 0

    def restore(self, n_tokens: int) -> int:
        """Load the latest checkpoint at `n_tokens` or fewer into the context; the tokens it holds
        (0: none fits, or llama.cpp refused it). Later checkpoints are dropped."""
        found = self._latest(n_tokens)
        self.drop_after(found.n_tokens if found else 0)
        if found is None:
            return 0
        if llama_cpp.llama_state_seq_set_data_ext(self.ctx, found.data, len(found.data), 0, PARTIAL) == 0:
            self.drop_after(found.n_tokens - 1)
            return 0
        return found.n_tokens

    def drop_after(self, n_tokens: int) -> None:
        """Forget the checkpoints past `n_tokens`: the sequence no longer holds their tokens."""
        self.saved = [checkpoint for checkpoint in self.saved if checkpoint.n_tokens <= n_tokens]
        if self.held is not None and self.held.n_tokens > n_tokens:
            self.held = None

    def clear(self) -> None:
        self.saved.clear()
        self.held = None

    def _all(self) -> list[Checkpoint]:
        return self.saved + ([self.held] if self.held is not None else [])

    def _latest(self, n_tokens: int) -> Checkpoint | None:
        found = [checkpoint for checkpoint in self._all() if 0 < checkpoint.n_tokens <= n_tokens]
        return max(found, key=lambda checkpoint: checkpoint.n_tokens) if found else None

    def _copy(self) -> ctypes.Array | None:
        """The recurrent part of sequence 0's state now (None: empty, or over the byte cap)."""
        size = llama_cpp.llama_state_seq_get_size_ext(self.ctx, 0, PARTIAL)
        if size <= 0 or size > self.max_bytes:
            return None
        data = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self.ctx, data, size, 0, PARTIAL) != size:
            return None
        return data

    def _positions(self) -> set[int]:
        return {checkpoint.n_tokens for checkpoint in self.saved}

    def _make_room(self, size: int) -> None:
        """Drop checkpoints until one more of `size` bytes fits the count and the byte cap."""
        if len(self.saved) + 1 >= self.count:
            # llama-server's thinning: a checkpoint close behind an older one goes first, unless
            # it was taken during this prefill.
            kept: list[Checkpoint] = []
            for checkpoint in self.saved:
                close = kept and checkpoint.n_tokens <= kept[-1].n_tokens + MIN_STEP
                if close and checkpoint.n_tokens not in self.fresh:
                    continue
                kept.append(checkpoint)
            self.saved = kept
        while self.saved and (len(self.saved) >= self.count or self.bytes + size > self.max_bytes):
            self.saved.pop(0)
