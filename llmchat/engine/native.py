"""One model and its context on llama.cpp's C API: load, tokenize, evaluate, and the decode loop.

This is what `Engine` (llmchat.engine.core) stands on, in place of llama-cpp-python's `Llama`,
which costs a one-shot `ask` numpy and the library's chat formats at import
(llmchat.engine.bindings). It keeps only what llmchat uses:
- the tokens the KV cache of sequence 0 holds (`tokens`), so that `generate` evaluates only what
  follows the longest prefix a new prompt shares with them: a chat prefills only its new turn
  (on a recurrent or hybrid model, from the nearest checkpoint of its state: engine.checkpoints);
- `eval`, which asks llama.cpp for logits only where they are sampled from: the last position, or
  the last `output_window` positions when a drafter's guesses are verified in one pass;
- `generate`, the decode loop: sample through the caller's sampler chain, evaluate, and, with a
  drafter, evaluate the sampled token and the drafted ones together and keep the drafts up to the
  first one the chain would not have picked. The reply is the model's own either way.

A token's index in `tokens` is its KV cell; its position (what RoPE sees) is the same number,
except after an image on a model that places images by M-RoPE (Qwen-VL): such an image takes a
cell per embedding but advances the position by its larger side only (libmtmd's n_pos). Those
gaps are `_gaps`, which only `eval_media` adds to and the cuts trim, and every position handed
to llama.cpp goes through `position`: on every other model it is the index itself.
"""

from __future__ import annotations

import bisect
import ctypes
import operator
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Generator, Protocol, Sequence

from llmchat.engine.bindings import llama_cpp
from llmchat.engine.checkpoints import Checkpoints
from llmchat.engine.driver import common_prefix
from llmchat.engine.media.marks import is_media

_INT32_MAX = 0x7FFFFFFF  # n_gpu_layers: every layer
_backend: dict[str, bool] = {"ready": False}
_gap_end = operator.itemgetter(0)  # of an entry of LoadedModel._gaps


class DecodeError(RuntimeError):
    """llama.cpp returned an error while evaluating or tokenizing (the message says which call and
    its code). Raised out of `generate` mid-reply: the engine makes it a ModelError (engine.core)."""


class Drafter(Protocol):
    """Guesses the tokens that follow `ids` (the context so far); [] for no guess."""

    def __call__(self, ids: Sequence[int], /) -> list[int]: ...


def ensure_backend() -> None:
    """llama.cpp's backend initialisation, once per process, before the first load."""
    if not _backend["ready"]:
        llama_cpp.llama_backend_init()
        _backend["ready"] = True


class LoadedModel:
    """A GGUF model, one context for sequence 0, and the tokens its KV cache holds.

    `n_ctx` 0: the trained context, at most `max_ctx`. Raises ValueError when llama.cpp refuses
    the file or the context (its log says why: llmchat.engine.logs)."""

    def __init__(
        self,
        path: Path,
        *,
        n_ctx: int,
        max_ctx: int,
        n_batch: int,
        threads: int,
        gpu_layers: int,
        mmap: bool,
        mlock: bool,
        flash_attn: bool,
        kv_type: int | None = None,
        extra_buffer_types: bool = True,
        progress_callback: Any = None,
        output_window: int = 1,
        vocab_only: bool = False,
        checkpoints: int = 0,
        checkpoint_bytes: int = 0,
    ):
        ensure_backend()
        self._checkpoint_limits = (checkpoints, checkpoint_bytes)
        self.path = path
        self.output_window = max(1, output_window)
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = _INT32_MAX if gpu_layers == -1 else gpu_layers
        params.vocab_only = vocab_only
        if mmap and mlock:
            params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK
        elif mlock:
            params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MLOCK
        elif mmap:
            params.load_mode = llama_cpp.LLAMA_LOAD_MODE_MMAP
        else:
            params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE
        if progress_callback is not None:
            params.progress_callback = progress_callback
        if not extra_buffer_types:
            params.use_extra_bufts = False
        self.model_params = params
        self.gpu_layers = gpu_layers
        self.ctx: Any = None
        self._batch: Any = None
        # Told each decode call's size and time (engine.threads.ThreadTuner.observe); None: nobody.
        self._step_observer: Callable[[int, float], None] | None = None
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), params)
        if not self.model:
            raise ValueError(f"failed to load model from file: {path}")
        with ExitStack() as undo:  # whatever fails from here on (a Ctrl-C too) frees what was made
            undo.callback(self.close)
            self._start(n_ctx, max_ctx, n_batch, threads, flash_attn, kv_type, vocab_only)
            undo.pop_all()

    def _start(
        self,
        n_ctx: int,
        max_ctx: int,
        n_batch: int,
        threads: int,
        flash_attn: bool,
        kv_type: int | None,
        vocab_only: bool,
    ) -> None:
        """The loaded model's facts, and its context and batch (none for a vocabulary only)."""
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(self.model))
        self.is_recurrent = bool(
            llama_cpp.llama_model_is_recurrent(self.model) or llama_cpp.llama_model_is_hybrid(self.model)
        )
        self.tokens: list[int] = []  # what the KV cache of sequence 0 holds, in order
        # (index where a media chunk ends, where it starts, positions saved by all chunks up to its
        # end), in order: empty unless an M-RoPE image was evaluated (see the module docstring).
        self._gaps: list[tuple[int, int, int]] = []
        self.checkpoints: Checkpoints | None = None
        # Images and audio in the prompt (engine.media.local.MediaContext): set by the engine once
        # media are given; their positions are negative ids that `eval` hands to it.
        self.media: Any = None
        self.logits_fresh = False  # the last eval's logits belong to `tokens` (not a restored state)
        self.n_threads = threads
        if vocab_only:
            self.n_ctx = self.n_batch = 0
            return
        n_ctx = n_ctx or min(self.n_ctx_train or max_ctx, max_ctx)
        self.n_batch = min(n_batch, n_ctx)
        context = llama_cpp.llama_context_default_params()
        context.n_ctx = n_ctx
        context.n_batch = self.n_batch
        context.n_ubatch = self.n_batch
        context.n_threads = threads
        context.n_threads_batch = threads
        context.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        if kv_type is not None:
            context.type_k = kv_type
            context.type_v = kv_type
        self.context_params = context
        self.ctx = llama_cpp.llama_init_from_model(self.model, context)
        if not self.ctx:
            raise ValueError("Failed to create llama_context")
        self.n_ctx = int(llama_cpp.llama_n_ctx(self.ctx))
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        count, max_bytes = self._checkpoint_limits
        # Where the cache cannot drop a suffix, copies of its recurrent state stand in (engine.checkpoints).
        if self.is_recurrent and count > 0:
            self.checkpoints = Checkpoints(self.ctx, count=count, max_bytes=max_bytes)

    def close(self) -> None:
        # Each handle leaves its field before it is freed: a signal landing between a free and the
        # field's clearing would otherwise leave a freed handle for the next close() to free again.
        batch, self._batch = self._batch, None
        if batch is not None:
            llama_cpp.llama_batch_free(batch)
        ctx, self.ctx = self.ctx, None
        if ctx:
            llama_cpp.llama_free(ctx)
        model, self.model = self.model, None
        if model:
            llama_cpp.llama_model_free(model)

    def set_threads(self, threads: int) -> None:
        """Run the next decode calls on `threads` threads, prefill and decode alike."""
        self.n_threads = threads
        if self.ctx:
            llama_cpp.llama_set_n_threads(self.ctx, threads, threads)

    def observe_steps(self, observer: Callable[[int, float], None] | None) -> None:
        """Tell `observer` (tokens, seconds) of every decode call from now on."""
        self._step_observer = observer

    # --- what the file says ------------------------------------------------------------------------
    def metadata(self) -> dict[str, str]:
        """The GGUF header's key-value pairs, values as llama.cpp renders them to text."""
        found: dict[str, str] = {}
        size = 1024
        buffer = ctypes.create_string_buffer(size)

        def read(call: Callable[..., int], index: int) -> str:
            nonlocal buffer, size
            n = call(self.model, index, buffer, size)
            if n >= size:
                size = n + 1
                buffer = ctypes.create_string_buffer(size)
                call(self.model, index, buffer, size)
            return buffer.value.decode("utf-8", errors="replace")

        for index in range(llama_cpp.llama_model_meta_count(self.model)):
            key = read(llama_cpp.llama_model_meta_key_by_index, index)
            found[key] = read(llama_cpp.llama_model_meta_val_str_by_index, index)
        return found

    def describe(self) -> tuple[str, int, int]:
        """(llama.cpp's one-line description, size in bytes, parameter count)."""
        buffer = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.model, buffer, 256)
        return (
            buffer.value.decode("utf-8", errors="replace"),
            int(llama_cpp.llama_model_size(self.model)),
            int(llama_cpp.llama_model_n_params(self.model)),
        )

    # --- vocabulary ----------------------------------------------------------------------------
    def tokenize(self, text: bytes, *, add_bos: bool, special: bool) -> list[int]:
        room = len(text) + 4  # about one token a byte at most, and the specials a vocabulary adds
        ids = (llama_cpp.llama_token * room)()
        n = llama_cpp.llama_tokenize(self.vocab, text, len(text), ids, room, add_bos, special)
        if n < 0:  # a negative result is the room needed
            room = -n
            ids = (llama_cpp.llama_token * room)()
            n = llama_cpp.llama_tokenize(self.vocab, text, len(text), ids, room, add_bos, special)
            if n < 0:
                raise DecodeError(f"llama.cpp could not tokenize {len(text)} bytes of text")
        return ids[:n]

    def token_text(self, token: int) -> str:
        """The token as the vocabulary spells it (control tokens as their markup)."""
        return llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def piece(self, token: int, *, special: bool) -> bytes:
        """The bytes a token stands for; control tokens give b"" unless `special`."""
        size = 64
        while True:
            buffer = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buffer, size, 0, special)
            if n >= 0:
                return buffer.raw[:n]
            size = -n  # a negative result is the size needed

    # --- evaluation ------------------------------------------------------------------------------
    def clear(self) -> None:
        """Forget the whole sequence (the KV cache is empty after this). The cells are marked free,
        not zeroed (as llama-bench clears between runs): zeroing a large cache takes milliseconds."""
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), False)
        self.tokens.clear()
        self._gaps.clear()
        self.logits_fresh = False
        if self.checkpoints is not None:
            self.checkpoints.clear()

    def keep(self, n: int) -> bool:
        """Cut the sequence back to its first `n` tokens. False where the cache cannot drop a
        suffix (a recurrent model): the caller starts over instead."""
        if n >= len(self.tokens):
            return True
        if not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), 0, self.position(n), -1):
            return False
        self._cut(n)
        return True

    def position(self, index: int) -> int:
        """The position of the token at `index` in the sequence (where one would go at its end):
        the index, less the positions that M-RoPE images before it saved. Inside such an image, its
        first position: a cut there drops the whole image (libmtmd encodes an image at once, so
        MediaContext.eval evaluates it again from its start)."""
        if not self._gaps:
            return index
        after = bisect.bisect_right(self._gaps, index, key=_gap_end)  # the first gap ending past index
        saved = self._gaps[after - 1][2] if after else 0
        if after < len(self._gaps) and self._gaps[after][1] < index:
            index = self._gaps[after][1]
        return index - saved

    def eval_media(self, ids: Sequence[int], decode: Callable[[int], int]) -> None:
        """Evaluate one image or audio chunk after the sequence so far: `decode(position)` decodes
        its embeddings from that position on and returns the position after it (libmtmd's new
        n_past); `ids` are its sentinels (llmchat.engine.media.marks), one per KV cell it takes."""
        start = self.position(len(self.tokens))
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), 0, start, -1)
        self.logits_fresh = False
        end = decode(start)
        self.tokens.extend(ids)
        saved = len(ids) - (end - start)
        if saved:
            before = self._gaps[-1][2] if self._gaps else 0
            self._gaps.append((len(self.tokens), len(self.tokens) - len(ids), before + saved))

    def take_restored(self, tokens: Sequence[int], keep: int) -> int | None:
        """After a restore of a saved state of sequence 0 into an empty cache: hold the first `keep`
        of the `tokens` it was saved for, drop the cells after them, and return how many it holds.
        Images there keep the positions they were evaluated at (their M-RoPE gaps, from the media
        context); one this model was not given, or cut by `keep`, goes with everything after it.
        None (the cache cleared) where the cells cannot be dropped, a recurrent state: all or none."""
        keep = min(keep, len(tokens))
        gaps: list[tuple[int, int, int]] = []
        index = saved = 0
        while index < keep:
            if not is_media(tokens[index]):
                index += 1
                continue
            span = self.media.span(tokens[index:keep]) if self.media is not None else None
            if span is None:
                keep = index
                break
            cells, positions = span
            if cells > positions:
                saved += cells - positions
                gaps.append((index + cells, index, saved))
            index += cells
        self._gaps[:] = gaps
        if not llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), 0, self.position(keep), -1):
            self.clear()
            return None
        self.tokens[:] = tokens[:keep]
        self.logits_fresh = False
        return keep

    def _cut(self, n: int) -> None:
        """Forget the tokens from index `n` on (their cells are gone already)."""
        del self.tokens[n:]
        while self._gaps and self._gaps[-1][0] > n:
            self._gaps.pop()
        self.logits_fresh = False

    def reusable(self, prompt: Sequence[int]) -> int:
        """How many leading tokens of `prompt` the next `generate` keeps rather than evaluates."""
        common = common_prefix(self.tokens, prompt)
        reuse = common - 1 if common == len(prompt) else common  # the last token brings the logits
        if reuse >= len(self.tokens) or not self.is_recurrent:
            return max(reuse, 0)
        return self.checkpoints.nearest(reuse) if self.checkpoints is not None else 0

    def rewind(self, n: int) -> int:
        """Cut the sequence back to its first `n` tokens or fewer, and return how many it keeps: a
        recurrent state goes back to the nearest checkpoint (0: none, and the cache is cleared)."""
        if n >= len(self.tokens):
            return len(self.tokens)
        if not self.is_recurrent:
            if n > 0 and self.keep(n):
                return n
            self.clear()
            return 0
        at = self.checkpoints.restore(n) if self.checkpoints is not None else 0
        # The recurrent part is now that of the first `at` tokens: the attention cells after it can go.
        if not (at and llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), 0, self.position(at), -1)):
            self.clear()
            return 0
        self._cut(at)
        return at

    def prefill(self, tokens: Sequence[int], parting: Sequence[int] = ()) -> None:
        """`eval(tokens)`, stopping where a checkpoint of the recurrent state is worth saving
        (`parting`: token counts of the sequence where later prompts are expected to leave it)."""
        done = 0
        # Not around images or audio (negative ids): a cut could split one (llama-server takes none there).
        if self.checkpoints is not None and (not tokens or min(tokens) >= 0):
            start = len(self.tokens)
            for cut in self.checkpoints.cuts(start, start + len(tokens), self.n_batch, parting):
                if cut - start > done:
                    self.eval(tokens[done : cut - start])
                done = cut - start
                self.checkpoints.save(cut)
        self.eval(tokens[done:])

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate `tokens` after the sequence so far, in chunks of `n_batch`. Logits are kept for
        the last `output_window` of them, where sampling reads them."""
        if self.media is not None and tokens and min(tokens) < 0:
            self.media.eval(self, tokens)
            return
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), 0, self.position(len(self.tokens)), -1)
        batch = self._batch
        first_needed = len(tokens) - self.output_window
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            n_past = self.position(len(self.tokens))
            batch.n_tokens = len(chunk)
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = n_past + i
                batch.seq_id[i][0] = 0
                batch.n_seq_id[i] = 1
                batch.logits[i] = start + i >= first_needed
            started = time.perf_counter()
            code = llama_cpp.llama_decode(self.ctx, batch)
            if code != 0:
                self.logits_fresh = False
                raise DecodeError(f"llama_decode returned {code}")
            if self._step_observer is not None:
                self._step_observer(len(chunk), time.perf_counter() - started)
            self.tokens.extend(chunk)
        self.logits_fresh = True

    def generate(
        self, prompt: Sequence[int], sampler: Any, drafter: Drafter | None = None, parting: Sequence[int] = ()
    ) -> Generator[int, None, None]:
        """Sample tokens after `prompt` through the sampler chain `sampler`, without end.

        The cache keeps the longest prefix it shares with `prompt`; at least the last prompt token
        is evaluated again unless the cache holds exactly `prompt` with live logits. `parting`:
        where later prompts are expected to leave this one (a recurrent state is checkpointed there)."""
        if not prompt:
            raise ValueError("an empty prompt has nothing to sample after")
        tokens = list(prompt)
        common = common_prefix(self.tokens, tokens)
        if common == len(tokens) == len(self.tokens) and self.logits_fresh and tokens:
            tokens = []
        else:
            tokens = tokens[self.rewind(self.reusable(tokens)) :]
        sample_at = len(self.tokens) + len(tokens) - 1
        self.prefill(tokens, parting)
        while True:
            while sample_at < len(self.tokens):
                token = int(llama_cpp.llama_sampler_sample(sampler, self.ctx, sample_at - len(self.tokens)))
                sample_at += 1
                yield token
                tokens = [token]
                if sample_at < len(self.tokens) and token != self.tokens[sample_at]:
                    # The drafts from here on were not the chain's picks: drop them. A recurrent
                    # state goes back to the copy held before the batch, and what was accepted is
                    # evaluated again on its own, so the next copy is held after it.
                    accepted = self.tokens[:sample_at]
                    missing = accepted[self.rewind(sample_at) :]
                    if missing:
                        self.eval(missing)
                    break
            if drafter is not None:
                drafted = drafter(self.tokens + tokens)
                tokens.extend(drafted[: max(0, self.n_ctx - len(self.tokens) - len(tokens))])
            if len(tokens) > 1 and self.checkpoints is not None:
                self.checkpoints.hold(len(self.tokens))  # where a rejected draft comes back to
            self.eval(tokens)
