"""Load a GGUF model with llama.cpp and stream one sequence's tokens.

Generation goes through `LoadedModel.generate` (llmchat.engine.native), which keeps the longest
common prefix of the previous prompt in the KV cache and evaluates only the new suffix: a chat
that re-renders the whole conversation each turn prefills only the new turn. It also runs
speculative decoding when a drafter is set (drafted tokens are verified in one pass).
"""

from __future__ import annotations

import ctypes
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generator, Iterator, Sequence

from llmchat.engine import load_ahead, logs
from llmchat.engine.bindings import llama_cpp
from llmchat.engine.drafting import CountingDrafter, DraftModelDrafter, PromptLookupDrafter
from llmchat.engine.driver import SequenceState, common_prefix
from llmchat.engine.grammar import Grammar
from llmchat.engine.interface import EngineCaps, EngineInfo, GenerateRequest, prompt_ids
from llmchat.engine.media.marks import count_media
from llmchat.engine.model_load import (
    EngineSettings,
    backend_notice,
    open_arguments,
    open_model,
)
from llmchat.engine.native import DecodeError, LoadedModel
from llmchat.engine.prompt_pieces import PromptPiece, tokens_for_pieces
from llmchat.engine.threads import CpuReading, ThreadTuner, thread_tuner
from llmchat.errors import ModelError

if TYPE_CHECKING:
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.media.local import MediaContext

# Token attributes of markup tokens (<|im_end|>, <end_of_turn>): control or user-defined specials.
_CONTROL_ATTRS = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
# How far back the repeat penalty looks: llama-server's default `repeat_last_n` (and llama-cpp-python's
# `last_n_tokens_size`). Like llama-server, the window runs over the prompt and the reply together
# (engine.sampler), so one greedy prompt gives the same reply in this process and on a server.
_PENALTY_LAST_N = 64


@dataclass
class TokenEvent:
    """One sampled token: `text` is what may be shown now (may be empty while held back)."""

    text: str
    token_id: int


class Engine:
    """One loaded model and its context. Load once per session; generate many times."""

    @property
    def caps(self) -> EngineCaps:
        kv_shift, media = self.settings.kv_shift, self.settings.mmproj is not None
        checkpoints = self.model.checkpoints is not None
        return EngineCaps(
            grammar=True,
            kv_shift=kv_shift,
            disk_cache=True,
            renders_template=False,
            token_ids=True,
            media=media,
            checkpoints=checkpoints,
        )

    @property
    def info(self) -> EngineInfo:
        settings = self.settings
        drafting = "prompt lookup" if settings.lookup else ("draft model" if settings.draft_model else "no drafting")
        flash = f"flash attention {'on' if settings.flash_attn else 'off'}"
        rows = [("engine", f"{flash}, KV {settings.kv_type}", drafting)]
        if settings.flash_attn_why:
            rows.append(("", flash, settings.flash_attn_why))
        rows.append(("", f"{self.threads} threads", self.tuner.why))
        return EngineInfo(
            model_path=str(self.model_path),
            rows=tuple(rows),
            flash_attn=settings.flash_attn,
            flash_attn_why=settings.flash_attn_why or None,
            threads=self.threads,
            threads_why=self.tuner.why,
        )

    @property
    def threads(self) -> int:
        """The threads llama.cpp runs now (engine.threads may change them between steps)."""
        return self.tuner.threads

    penalty_last_n = _PENALTY_LAST_N  # the repeat penalty's window (engine.sampler's sampler_chain)

    @property
    def batch_size(self) -> int:
        return self.settings.batch_size

    def check_grammar(self, grammar: Grammar) -> None:
        """UsageError unless llama.cpp can parse `grammar` for this model's vocabulary."""
        from llmchat.engine.grammar_gate import check_grammar

        check_grammar(grammar, self.model.vocab)

    def __init__(
        self,
        model: LoadedModel,
        model_path: Path,
        settings: EngineSettings,
        notices: list[str],
        drafter: CountingDrafter | None,
        tuner: ThreadTuner,
    ):
        self.model = model
        self.model_path = model_path
        self.settings = settings
        self.notices = notices  # things worth a line under --verbose
        self._vocab = model.vocab
        self._pieces: dict[int, bytes] = {}
        self._max_token_bytes: int | None = None
        self._drafter = drafter
        self.metadata: dict[str, str] = model.metadata()
        self.n_ctx: int = model.n_ctx
        self.n_ctx_train: int = model.n_ctx_train
        self.n_layers: int = int(
            self.metadata.get(f"{self.metadata.get('general.architecture', '')}.block_count", 0) or 0
        )
        self.bos_id: int = int(llama_cpp.llama_vocab_bos(self._vocab))
        self.eos_id: int = int(llama_cpp.llama_vocab_eos(self._vocab))
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        self.bos_text: str = self._token_text(self.bos_id)
        self.eos_text: str = self._token_text(self.eos_id)
        self.tuner = tuner  # the owner of the thread count
        model.observe_steps(tuner.observe)
        self.media: MediaContext | None = None  # libmtmd's, opened with the first media (media_eval.add_media)

    # --- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, model_path: Path, settings: EngineSettings) -> "Engine":
        # Other processes' CPU use is read over the load (engine.threads): from here, or from
        # where a load begun ahead began.
        cpu_before = CpuReading.now()
        logs.install(settings.verbose)
        notices: list[str] = []
        # `auto` picks flash attention per backend (engine.calibrate): off on the CPU, where
        # llama-bench prefills faster without it at every chat depth; on with GPU offload; and on
        # with --lookup and --draft-model: llama.cpp's CPU flash-attention kernel computes each
        # query row the same way whatever the batch holds, while without it verifying 9 drafted
        # tokens in one pass differs from decoding them one by one by up to 0.9 in the logits,
        # enough to flip a near-tie and change a greedy reply.
        # (One limit remains: once the cache holds more than 256 tokens, a lone query row takes a
        # kernel that splits the cache across threads and rounds differently; see docs/speed-and-memory.md.)
        # The option values were checked once, before loading (llmchat.startup.loading.validate_options).
        flash_attn = settings.flash_attn
        drafter: PromptLookupDrafter | DraftModelDrafter | None = None
        draft_model: LoadedModel | None = None
        if (settings.lookup or settings.draft_model) and settings.draft_tokens >= settings.batch_size:
            # The verification batch (the last token and the drafts) must be one decode: llama.cpp
            # counts a sampling index back from the outputs of the last decode only, so a batch
            # split in two would sample from a row it no longer has (GGML_ASSERT, abort).
            settings = replace(settings, draft_tokens=max(1, settings.batch_size - 1))
        arguments = open_arguments(settings)
        gpu_layers, threads = arguments["gpu_layers"], arguments["threads"]  # threads at most: the tuner may run fewer
        # Every model opened here is freed if a later step fails (a Ctrl-C too), until the engine owns them.
        with ExitStack() as undo:
            if settings.lookup:
                drafter = PromptLookupDrafter(settings.draft_tokens)
            elif settings.draft_model:
                # The drafter's greedy picks should match the target's: the same attention numerics.
                draft_model = open_model(
                    settings.draft_model,
                    threads=threads,
                    gpu_layers=gpu_layers,
                    settings=settings,
                    flash_attn=flash_attn,
                )
                undo.callback(draft_model.close)
                drafter = DraftModelDrafter(draft_model, settings.draft_tokens, penalty_last_n=_PENALTY_LAST_N)
            # Verification samples at the last sampled token and each drafted one: only those
            # positions need logits (one row of n_vocab floats each).
            arguments["output_window"] = settings.draft_tokens + 1 if drafter else 1
            # A load begun ahead with these very arguments (a one-shot `ask`) is taken, not repeated.
            taken = load_ahead.take(model_path, arguments)
            if taken is None:
                model = open_model(model_path, **arguments)
            else:
                model, cpu_before = taken
            undo.callback(model.close)
            notices.append(f"flash attention {'on' if flash_attn else 'off'}, KV cache {settings.kv_type}")
            if settings.flash_attn_why:
                notices.append(f"flash attention {'on' if flash_attn else 'off'}: {settings.flash_attn_why}")
            if model.checkpoints is not None:
                notices.append(
                    f"recurrent state: up to {settings.ctx_checkpoints} checkpoints, {settings.ctx_checkpoints_mib} MiB"
                )
            if drafter is not None:
                notices.append(
                    f"speculative decoding: {'prompt lookup' if settings.lookup else settings.draft_model}, up to {settings.draft_tokens} drafted tokens per pass"
                )
            contexts = [model] if draft_model is None else [model, draft_model]
            tuner = thread_tuner(settings.threads, model.n_threads, gpu_layers == -1, contexts, cpu_before)
            notices.append(backend_notice(gpu_layers, tuner.threads))
            notices.append(f"threads: {tuner.threads} ({tuner.why})")
            engine = cls(model, model_path, settings, notices, CountingDrafter(drafter) if drafter else None, tuner)
            undo.pop_all()
        return engine

    def close(self) -> None:
        """Free the model and the draft model, each even when freeing the other fails."""
        with ExitStack() as frees:
            frees.callback(self.model.close)
            media, self.media = self.media, None
            if media is not None:  # freed first: it refers to the model
                frees.callback(media.close)
            drafter = self._drafter.inner if self._drafter else None
            if isinstance(drafter, DraftModelDrafter):
                frees.callback(drafter.draft.close)

    # --- vocabulary ----------------------------------------------------------------------------
    def _token_text(self, token_id: int) -> str:
        if token_id < 0:
            return ""
        return self.model.token_text(token_id)

    def has_single_token(self, text: str) -> bool:
        ids = self.tokenize(text, special=True)
        return len(ids) == 1 and self._token_text(ids[0]) == text

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Tokenize without adding BOS: the prompt builder decides about BOS exactly once."""
        # errors="replace": a lone surrogate (undecodable bytes smuggled in through surrogateescape,
        # or a "\udcff" escape in JSON input) cannot be encoded; it becomes U+FFFD instead of a crash.
        return self.model.tokenize(text.encode("utf-8", errors="replace"), add_bos=False, special=special)

    def max_token_bytes(self) -> int:
        """The most bytes of text any one token stands for (computed once, on first use).

        `min_tokens` divides by it to bound a text's token count from below without tokenizing.
        """
        if self._max_token_bytes is None:
            # Control tokens count with their text (special=True): where a template's marker meets
            # message text, one such token may cover a few bytes of the message too.
            # At least 4: even an <unk> token stands for one whole character (up to 4 bytes).
            longest, size = 4, 256
            buffer = ctypes.create_string_buffer(size)
            for token_id in range(llama_cpp.llama_vocab_n_tokens(self._vocab)):
                n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buffer, size, 0, True)
                longest = max(longest, abs(n))  # negative: the piece needs -n bytes
            self._max_token_bytes = longest
        return self._max_token_bytes

    def min_tokens(self, text: str) -> int | None:
        """A certain lower bound on the tokens `text` needs anywhere in a prompt, or None if unknown.

        Only for SPM and BPE vocabularies, whose tokens' pieces concatenate back to the text: the
        text's bytes are then covered by tokens of at most `max_token_bytes` each. Whitespace is not
        counted, so the bound also holds when a template trims or collapses it. (Other vocabularies
        normalize text or map a run of unknown characters to a single token.)
        """
        if llama_cpp.llama_vocab_type(self._vocab) not in (
            llama_cpp.LLAMA_VOCAB_TYPE_SPM,
            llama_cpp.LLAMA_VOCAB_TYPE_BPE,
        ):
            return None
        solid = len("".join(text.split()).encode("utf-8", errors="replace"))
        return -(-solid // self.max_token_bytes())

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for; control tokens give b"" so they are never shown."""
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self.model.piece(token_id, special=False)
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        text = b"".join(self.token_bytes(token) for token in tokens)
        # SentencePiece vocabularies write a word's leading space into its piece; after BOS, the
        # text's first word has none (as llama.cpp's own detokenizer trims it).
        if tokens and tokens[0] == self.bos_id and text.startswith(b" "):
            text = text[1:]
        return text.decode("utf-8", errors="replace")

    def prompt_tokens(self, pieces: Sequence[PromptPiece]) -> list[int]:
        """Token ids for a rendered prompt's pieces, by the rules in llmchat.engine.prompt_pieces."""
        return tokens_for_pieces(self if self.media is None else self.media.tokenizer(self), pieces)

    def is_control(self, token_id: int) -> bool:
        """A markup token (<|im_end|>, <end_of_turn>): control or user-defined special."""
        return bool(llama_cpp.llama_vocab_get_attr(self._vocab, token_id) & _CONTROL_ATTRS)

    def is_end_of_generation(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token_id))

    # --- generation ----------------------------------------------------------------------------
    def cached_prefix(self, prompt: Sequence[int]) -> int:
        """How many leading prompt tokens `generate` will not evaluate again: the cached prefix, less
        the last token (replayed for its logits), and on a recurrent model only up to the nearest
        checkpoint where the prompt leaves the cache (LoadedModel.reusable)."""
        return self.model.reusable(prompt)

    def shift_out_dropped(self, prompt: Sequence[int]) -> int:
        """Reuse the cache after the conversation's oldest exchanges were trimmed (a context shift).

        The cache then holds [kept prefix][dropped exchanges][rest] while the new prompt is
        [kept prefix][rest][new turn]. Prefix matching alone would re-prefill all of [rest]: seconds
        on a CPU, on exactly the turn where the user already waits longest. Instead the dropped
        span is removed from the KV cache and [rest] moved back by its length; llama.cpp re-rotates
        the keys for their new positions. Like llama.cpp's own context shift this is a close
        approximation, not bit-identical to a fresh prefill (the kept tokens' keys and values were
        computed when the dropped text was still in view). Returns the tokens moved (0: nothing done).
        """
        model = self.model
        cached, wanted = model.tokens, list(prompt)
        start = common_prefix(cached, wanted)
        probe = wanted[start : start + 16]
        if len(probe) < 16 or start >= len(cached):
            return 0
        for found in range(start + 1, len(cached) - len(probe) + 1):
            if cached[found] == probe[0] and cached[found : found + len(probe)] == probe:
                break
        else:
            return 0
        moved = common_prefix(cached[found:], wanted[start:])
        memory = llama_cpp.llama_get_memory(model.ctx)
        if moved < 32 or not llama_cpp.llama_memory_can_shift(memory):
            return 0  # too little to gain, or a cache (recurrent, some hybrids) that cannot shift
        if not llama_cpp.llama_memory_seq_rm(memory, 0, start, found):
            return 0
        llama_cpp.llama_memory_seq_add(memory, 0, found, -1, start - found)
        llama_cpp.llama_memory_seq_rm(memory, 0, start + moved, -1)  # what followed is stale
        model.tokens[start:] = cached[found : found + moved]
        model.logits_fresh = False  # the logits belong to the old sequence
        return moved

    # --- the sequence's state, for the KV cache on disk (llmchat.engine.kv_store) ----------------
    def evaluated_tokens(self) -> list[int]:
        """The token ids whose keys and values the KV cache holds now, in order."""
        return list(self.model.tokens)

    def sequence_state(self) -> bytearray:
        """llama.cpp's serialized state of sequence 0 (its KV cells), for `evaluated_tokens()`.

        Sequence-level (`llama_state_seq_*`), not the whole context: no logits or RNG, and a restore
        can be cut back to any prefix of it. llama.cpp writes it straight into the one buffer
        returned: the state is in memory once (about 4 GiB for an 8B model at 32K tokens), not
        once in a ctypes buffer and again in the bytes made from it."""
        ctx = self.model.ctx
        memory = llama_cpp.llama_get_memory(ctx)
        # Cells past the sequence (a rejected draft) are stale; drop them so they are not saved.
        llama_cpp.llama_memory_seq_rm(memory, 0, self.model.position(len(self.model.tokens)), -1)
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        state = bytearray(size)
        view = (ctypes.c_uint8 * size).from_buffer(state)
        written = llama_cpp.llama_state_seq_get_data(ctx, view, size, 0)
        del view  # its hold on the buffer, so that the unwritten end can go
        del state[written:]
        return state

    def restore_sequence(self, tokens: Sequence[int], state: bytearray, keep: int) -> int | None:
        """Load a `sequence_state()` saved for `tokens`, keep its first `keep` tokens or fewer (not
        past media this engine was not given), and return how many it keeps.

        None (and an empty cache) when llama.cpp refuses the data: another model, KV type or
        attention layout. The next `generate` evaluates at least the last prompt token, which
        brings fresh logits (the restored state has none)."""
        model = self.model
        ctx = model.ctx
        memory = llama_cpp.llama_get_memory(ctx)
        model.clear()
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if not llama_cpp.llama_state_seq_set_data(ctx, buffer, len(state), 0):
            llama_cpp.llama_memory_seq_rm(memory, 0, 0, -1)
            return None
        return model.take_restored([int(token) for token in tokens], keep)

    def generate(self, request: GenerateRequest, *, feeds_steering: bool = False) -> "Generation":
        """Stream the reply to `request` (token ids: the local engine renders no template).
        `feeds_steering`: give the reply text to the thinking budget here (nobody reads the events)."""
        return Generation(self, request, feeds_steering=feeds_steering)


class Generation:
    """An iterator of TokenEvents; `outcome` is complete once iteration ends (or is abandoned)."""

    def __init__(self, engine: Engine, request: GenerateRequest, *, feeds_steering: bool = False):
        self.engine = engine
        self.request = request
        self.prompt = list(prompt_ids(request.prompt))
        self.state = SequenceState(engine, request, engine.n_ctx, feeds_steering=feeds_steering)
        self.outcome = self.state.outcome
        self.seed = self.state.seed

    def __iter__(self) -> Iterator[TokenEvent]:
        engine, state, outcome = self.engine, self.state, self.outcome
        outcome.cached_tokens = engine.cached_prefix(self.prompt)
        outcome.media_tokens = count_media(self.prompt)
        if engine._drafter is not None:
            engine._drafter.start_reply(len(self.prompt), self.request.sampling.repeat_penalty)
        if not state.start(time.perf_counter()):
            return
        stream = self._stream(self.prompt, self.request.parting_points)
        try:
            yield from self._events(stream)
        except DecodeError as err:  # llama.cpp failed to evaluate or tokenize (LoadedModel)
            raise engine_failure(err) from err
        finally:
            drafter = engine._drafter
            if drafter is not None:
                outcome.draft_proposed, outcome.draft_accepted = drafter.acceptance(
                    list(self.prompt) + outcome.generated_ids
                )

    def _events(self, stream: Generator[int, Any, None]) -> Iterator[TokenEvent]:
        state, outcome = self.state, self.outcome
        try:
            while True:
                forced: Sequence[int] = ()
                for token in stream:
                    step = state.on_token(token, time.perf_counter())
                    if step.text:
                        yield TokenEvent(step.text, -1 if step.dropped else token)
                    if step.dropped:
                        forced = step.forced  # the end token is dropped: the forced ones take its place
                        break
                    if state.done:
                        break
                    # Asked after the caller has seen the token's text (it feeds the steering).
                    step = state.steer(time.perf_counter())
                    if step.forced:
                        if step.text:
                            yield TokenEvent(step.text, -1)
                        forced = step.forced
                        break
                else:
                    state.end_of_stream()
                if not forced or state.done:
                    break
                # Forced tokens (the end of a thinking block): the model continues from prompt +
                # reply so far + them. `LoadedModel.generate` keeps the matching KV prefix, so only the
                # last sampled token and the forced ones are evaluated.
                stream.close()
                stream = self._stream(self.prompt + outcome.generated_ids)
            tail = state.tail()
            if tail:
                yield TokenEvent(tail, -1)
        finally:
            stream.close()

    def _stream(self, tokens: list[int], parting: Sequence[int] = ()) -> Generator[int, Any, None]:
        """The model's decode loop over `tokens`, sampled through llmchat's own chain
        (engine.sampler's `sampler_chain`): the repeat penalty's window holds the prompt's last
        tokens too, as on llama-server, and a grammar gate when the request has one. Drafted
        positions are sampled through the same chain, so a drafted token is kept only when it
        equals the token the chain picked. `parting`: the request's (the prompt's stream only)."""
        from llmchat.engine.sampler import grammar_start, sampler_chain

        model = self.engine.model
        request = self.request
        # A restarted stream (forced tokens) may be past the end of thinking already.
        after = grammar_start(model, request.grammar_after, tokens[len(self.prompt) :])
        chain = sampler_chain(
            model.vocab,
            model.n_vocab,
            _PENALTY_LAST_N,
            request.sampling,
            self.seed,
            request.grammar,
            start_after=after,
            history=tokens,
            loop_exit=self.state.reply.loop_exit,
            feed_trigger=request.grammar_from_trigger,
        )
        stream = model.generate(tokens, chain, self.engine._drafter, parting)
        try:
            yield from stream
        finally:
            stream.close()
            llama_cpp.llama_sampler_free(chain)


def engine_failure(err: DecodeError) -> ModelError:
    """llama.cpp failing in the middle of a reply (a decode that returns an error), as the one line
    the user sees. Whoever reads the generation keeps the reply so far (llmchat.turn.stream)."""
    reason = " ".join(str(err).split()) or type(err).__name__
    return ModelError(
        f"llama.cpp failed mid-reply ({reason}); try again, with a smaller --ctx or --batch-size if it happens again"
    )


if TYPE_CHECKING:

    def _is_a_chat_engine(engine: Engine) -> ChatEngine:
        """Never called: mypy checks here that the local engine satisfies the engine protocol."""
        return engine
