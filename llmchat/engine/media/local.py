"""Images and audio on the engine's own context, through libmtmd (llama-cpp-python's `mtmd_cpp`).

Not through llama-cpp-python's chat handlers, which clear the KV cache on every call and take no
audio: the media are evaluated on the context `LoadedModel` decodes with, at the positions where
the chat template put them, so the prefix matching of `LoadedModel.generate` reuses them like text.

- `MediaContext.add` decodes a file's bytes (stb_image for images, miniaudio for WAV/MP3/FLAC) and
  tokenizes its marker with libmtmd: the template's own tokens around the media, where the
  projector has them (Gemma 3's begin and end of image), and the media chunks. Each chunk's
  positions get their sentinel ids (llmchat.engine.media.marks), keyed by the bytes' SHA-256.
- `MediaTokenizer` is the engine's tokenizer for a rendered prompt: each marker of media it was
  given becomes those ids, the rest is tokenized as usual (llmchat.engine.prompt_pieces).
- What a MediaContext holds is bounded: a decoded image keeps its preprocessed pixels (megabytes
  each) until it is freed. Past `HELD_CONTEXTS` contexts' worth of media positions, the least
  recently used are freed, when media are added and after a prompt with media is evaluated, but
  never one the KV cache holds or the prompt being prepared uses (touched since the last
  evaluation): a later prompt that names one again gets it decoded again
  (llmchat.media.use.give_media), its ids the same, so the cache still matches them.
- `MediaContext.eval` is `LoadedModel.eval` for a prompt with media: text runs go through the
  usual path, each media chunk is encoded by the projector and its embeddings decoded with
  `mtmd_helper_eval_chunk_single` (non-causal attention where the projector asks for it). A chunk
  the cache holds already is never encoded again: it is part of the common prefix.
- On a model that places images by M-RoPE (Qwen2-VL to Qwen3.5) an image takes a KV cell per
  embedding but fewer positions (its larger side in tokens): `LoadedModel.eval_media` starts each
  chunk at the position the model says and keeps the gap libmtmd reports, so the text after it,
  and every later cut, lands where libmtmd's own whole-prompt evaluation puts it.
"""

from __future__ import annotations

import ctypes
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import llmchat.engine.logs as logs
from llmchat.engine.bindings import library_module, llama_cpp
from llmchat.engine.media.marks import MARKER, is_media, sentinels
from llmchat.engine.native import DecodeError, LoadedModel
from llmchat.errors import ModelError, UsageError

if TYPE_CHECKING:
    from llmchat.engine.model_load import EngineSettings
    from llmchat.engine.prompt_pieces import PieceTokenizer

KINDS = {1: "image", 2: "audio"}  # MTMD_INPUT_CHUNK_TYPE_IMAGE, _AUDIO
# Media positions a MediaContext holds, in contexts' worth: the live prompt's (at most one context)
# and as many again for the media of the message being added, /retry, /edit and /model.
HELD_CONTEXTS = 2
# What llmchat uses of the libmtmd bindings: one that an upgrade renamed or dropped is named in one
# line when the projector opens, not met as an AttributeError in the middle of a turn.
MTMD_NAMES = (
    "mtmd_helper_log_set", "mtmd_context_params_default", "mtmd_init_from_file", "mtmd_free",
    "mtmd_support_vision", "mtmd_support_audio", "mtmd_default_marker",
    "mtmd_helper_bitmap_init_from_buf", "mtmd_bitmap_free", "mtmd_input_chunks_init", "mtmd_input_chunks_free",
    "mtmd_input_chunks_size", "mtmd_input_chunks_get", "mtmd_input_text", "mtmd_bitmap_p_ctypes", "mtmd_tokenize",
    "mtmd_input_chunk_get_type", "mtmd_input_chunk_get_tokens_text", "mtmd_input_chunk_get_n_tokens",
    "mtmd_input_chunk_get_n_pos",
    "mtmd_helper_eval_chunk_single",
)  # fmt: skip


@dataclass
class MediaItem:
    """One image or audio clip as the prompt holds it."""

    sha256: str
    kind: str  # image | audio
    tokens: list[int]  # its ids in a prompt: the template's own tokens around it and the sentinels
    media_tokens: int  # the positions the projector's embeddings take
    chunks: Any = field(repr=False)  # mtmd_input_chunks, owned by the MediaContext
    used: int = 0  # the MediaContext's evaluation count when a prompt last used it


class MediaContext:
    """libmtmd's context for one projector beside one loaded model, and the media given to it.
    The engine owns it (llmchat.engine.core): it is freed before the model."""

    def __init__(self, model: LoadedModel, projector: Path, threads: int):
        self._mtmd = mtmd = library_module("mtmd_cpp")
        self._model = model
        self.items: OrderedDict[str, MediaItem] = OrderedDict()  # least recently used first
        self.held = 0  # media positions of the items
        self._evals = 0  # prompts evaluated: media used since the last belong to the prompt being prepared
        self._where: dict[int, tuple[Any, int, int]] = {}  # sentinel -> (chunk, offset in it, its length)
        self._positions: dict[int, int] = {}  # a chunk's first sentinel -> the positions it advances
        self.encoded = 0  # media chunks encoded so far (a turn that reuses the cache encodes none)
        missing = [name for name in MTMD_NAMES if not hasattr(mtmd, name)]
        if missing:
            raise ModelError(
                f"llama-cpp-python lacks {', '.join(missing)} (libmtmd), which llmchat uses for media; reinstall llama-cpp-python"
            )
        mtmd.mtmd_helper_log_set(logs._on_log, ctypes.c_void_p(0))  # llama.cpp's log goes through llmchat
        wanted = mtmd.mtmd_context_params_default()
        wanted.use_gpu = model.gpu_layers != 0
        wanted.n_threads = threads
        wanted.print_timings = False
        logs.recent_errors.clear()
        self.ctx = mtmd.mtmd_init_from_file(str(projector).encode("utf-8"), model.model, wanted)
        if not self.ctx:
            reason = logs.last_error() or "libmtmd refused it"
            raise ModelError(
                f"{projector}: the projector does not load ({' '.join(reason.split())}); pass the mmproj file made for this model"
            )
        self.vision = bool(mtmd.mtmd_support_vision(self.ctx))
        self.audio = bool(mtmd.mtmd_support_audio(self.ctx))

    def close(self) -> None:
        for item in self.items.values():
            self._mtmd.mtmd_input_chunks_free(item.chunks)
        self.items.clear()
        self.held = 0
        self._where.clear()
        self._positions.clear()
        ctx, self.ctx = self.ctx, None
        if ctx:
            self._mtmd.mtmd_free(ctx)

    # --- media in ------------------------------------------------------------------------------
    def add(self, data: bytes, name: str, kind: str) -> MediaItem:
        """The media of these bytes, decoded and tokenized once per content. UsageError, naming
        `name`, when the projector cannot take its kind or libmtmd cannot decode it."""
        sha = hashlib.sha256(data).hexdigest()
        found = self.use(sha)
        if found is not None:
            return found
        if kind == "audio" and not self.audio:
            raise UsageError(f"{name} is audio, but this model's projector takes images only; attach an image")
        if kind == "image" and not self.vision:
            raise UsageError(f"{name} is an image, but this model's projector takes audio only; attach audio")
        mtmd = self._mtmd
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        logs.recent_errors.clear()
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buffer, len(data), False)
        if not bitmap:
            raise UsageError(f"{name} cannot be decoded (corrupt or truncated?); attach a whole {kind} file")
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            # libmtmd splits the text at its own marker (`<__media__>`): the marker alone gives
            # the media's chunks and the template's tokens the projector wants around them.
            default = mtmd.mtmd_default_marker()
            text = mtmd.mtmd_input_text()
            text.text, text.text_len, text.add_special, text.parse_special = default, len(default), False, True
            bitmaps = (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap)
            code = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(text), bitmaps, 1)
        finally:
            mtmd.mtmd_bitmap_free(bitmap)
        if code != 0:
            mtmd.mtmd_input_chunks_free(chunks)
            raise UsageError(f"{name} cannot be prepared for the model (libmtmd said {code}); attach another file")
        item = self._index(sha, chunks)
        item.used = self._evals
        self.items[sha] = item
        self.held += item.media_tokens
        self._free_unused()
        return item

    def use(self, sha: str) -> MediaItem | None:
        """The media of this hash, marked as used by the prompt being prepared; None when not held."""
        item = self.items.get(sha)
        if item is not None:
            item.used = self._evals
            self.items.move_to_end(sha)
        return item

    def _free_unused(self) -> None:
        """Free the least recently used media while more than `HELD_CONTEXTS` contexts' worth is
        held, but none that the KV cache holds or that the prompt being prepared uses."""
        limit = HELD_CONTEXTS * self._model.n_ctx
        if self.held <= limit:
            return
        cached = set(self._model.tokens)
        for sha, item in list(self.items.items()):
            if self.held <= limit:
                break
            if item.used == self._evals or any(token in cached for token in item.tokens if is_media(token)):
                continue
            del self.items[sha]
            self.held -= item.media_tokens
            for token in item.tokens:
                if is_media(token):
                    self._where.pop(token, None)
                    self._positions.pop(token, None)
            self._mtmd.mtmd_input_chunks_free(item.chunks)

    def _index(self, sha: str, chunks: Any) -> MediaItem:
        mtmd = self._mtmd
        tokens: list[int] = []
        placed = 0
        kind = "image"
        for index in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, index)
            chunk_type = mtmd.mtmd_input_chunk_get_type(chunk)
            if chunk_type not in KINDS:
                count = ctypes.c_size_t(0)
                ids = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                tokens += [int(ids[i]) for i in range(count.value)]
                continue
            kind = KINDS[chunk_type]
            n = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            ids = sentinels(sha, n, placed)
            for offset, token in enumerate(ids):
                self._where[token] = (chunk, offset, n)
            self._positions[ids[0]] = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            tokens += ids
            placed += n
        return MediaItem(sha, kind, tokens, placed, chunks)

    def tokenizer(self, engine: PieceTokenizer) -> PieceTokenizer:
        """What the engine tokenizes a rendered prompt with: itself, or, once it holds media, a
        tokenizer that puts their tokens where their markers are."""
        return MediaTokenizer(engine, self) if self.items else engine

    def span(self, ids: Sequence[int]) -> tuple[int, int] | None:
        """(cells, positions) of the media chunk that `ids` start with, whole; None when they do not
        start one this context was given (a state restored from disk may hold others)."""
        chunk, offset, length = self._where.get(ids[0], (None, -1, 0)) if ids else (None, -1, 0)
        if (
            chunk is None
            or offset != 0
            or len(ids) < length
            or self._where.get(ids[length - 1], (None,))[0] is not chunk
        ):
            return None
        return length, self._positions[ids[0]]

    # --- evaluation ----------------------------------------------------------------------------
    def eval(self, model: LoadedModel, tokens: Sequence[int]) -> None:
        """Evaluate `tokens` (text ids and media sentinels) after the model's sequence so far."""
        self._evals += 1
        tokens = list(tokens)
        if tokens and is_media(tokens[0]):
            tokens = self._back_to_chunk_start(model, tokens)
        start = 0
        while start < len(tokens):
            if not is_media(tokens[start]):
                end = start
                while end < len(tokens) and not is_media(tokens[end]):
                    end += 1
                model.eval(tokens[start:end])
                start = end
                continue
            chunk, offset, length = self._where.get(tokens[start], (None, -1, 0))
            run = tokens[start : start + length]
            if chunk is None or offset != 0 or [self._where.get(t, (None,))[0] for t in run] != [chunk] * length:
                raise DecodeError("media in the prompt that this engine was not given, or cut apart")
            self._eval_chunk(model, chunk, run)
            start += length
        self._free_unused()  # what this prompt left out of the cache (trimmed) may go now

    def _back_to_chunk_start(self, model: LoadedModel, tokens: list[int]) -> list[int]:
        """A chunk whose first positions the cache kept (cut back in its middle) is evaluated
        whole: libmtmd encodes a chunk at once."""
        offset = self._where.get(tokens[0], (None, 0, 0))[1]
        if offset <= 0 or offset > len(model.tokens):
            return tokens
        start = len(model.tokens) - offset
        kept = model.tokens[start:]
        if model.keep(start):
            return kept + tokens
        everything = model.tokens + tokens
        model.clear()  # a cache that cannot drop a suffix (recurrent): start over
        return everything

    def _eval_chunk(self, model: LoadedModel, chunk: Any, ids: list[int]) -> None:
        def decode(n_past: int) -> int:
            new_past = llama_cpp.llama_pos(0)
            code = self._mtmd.mtmd_helper_eval_chunk_single(
                self.ctx, model.ctx, chunk, n_past, 0, model.n_batch, False, ctypes.byref(new_past)
            )
            if code != 0:
                raise DecodeError(f"libmtmd could not evaluate the media (code {code})")
            self.encoded += 1
            return int(new_past.value)

        model.eval_media(ids, decode)


class MediaHost(Protocol):
    """What of a local `Engine` (llmchat.engine.core) media need: its settings, its model, and the
    MediaContext it owns."""

    settings: EngineSettings
    model_path: Path
    model: LoadedModel
    media: MediaContext | None

    @property
    def threads(self) -> int: ...


def add_media(engine: MediaHost, data: bytes, name: str, kind: str) -> MediaItem:
    """Give a local `Engine` an image or audio clip, whose marker in a message then becomes its
    tokens; its MediaContext (`engine.media`, which the engine owns and frees) opens with the first."""
    projector = engine.settings.mmproj
    if projector is None:
        what = "an image" if kind == "image" else "audio"
        raise UsageError(
            f"{name} is {what}, but {engine.model_path.name} has no multimodal projector; "
            "pass --mmproj FILE, or keep its mmproj*.gguf beside the model"
        )
    if engine.settings.draft_model is not None:
        # The draft model is fed token ids, and an image's cells are no tokens: it would need the
        # projector's embeddings (llama-server's draft gets them, or zeros where its width differs:
        # common/speculative.cpp). Prompt lookup drafts from the ids alone and never proposes media
        # (engine.drafting).
        raise UsageError(f"{name}: images and audio do not combine with --draft-model; drop that flag")
    if engine.media is None:
        engine.media = engine.model.media = MediaContext(engine.model, projector, engine.threads)
    media: MediaContext = engine.media
    return media.add(data, name, kind)


def holds_media(engine: MediaHost, sha256: str) -> bool:
    """Whether a local `Engine` holds the media of this hash (no need to read it again); it is
    then kept for the prompt being prepared."""
    return engine.media is not None and engine.media.use(sha256) is not None


class MediaTokenizer:
    """An engine's tokenizer for rendered prompts in which markers of given media stand."""

    def __init__(self, engine: PieceTokenizer, media: MediaContext):
        self._engine = engine
        self._media = media
        self.add_bos: bool = engine.add_bos
        self.bos_id: int = engine.bos_id

    def is_control(self, token_id: int) -> bool:
        return bool(self._engine.is_control(token_id))

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return expand(text, self._media.use, lambda part: self._engine.tokenize(part, special=special))


def expand(text: str, media: Callable[[str], MediaItem | None], tokenize: Callable[[str], list[int]]) -> list[int]:
    """The ids of `text`, with each marker of a known media (`media(sha256)`) replaced by that
    media's ids; the text between markers is tokenized apart, as libmtmd's own tokenizer does."""
    tokens: list[int] = []
    at = 0
    for found in MARKER.finditer(text):
        item = media(found.group(1))
        if item is None:
            continue  # not media this engine was given: plain text
        if found.start() > at:
            tokens += tokenize(text[at : found.start()])
        tokens += item.tokens
        at = found.end()
    if at < len(text) or not tokens:
        tokens += tokenize(text[at:])
    return tokens
