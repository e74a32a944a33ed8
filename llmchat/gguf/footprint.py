"""What a GGUF model needs in memory to run: its attention layout, KV cache and compute buffer.

Pure functions over `GGUFMetadata`. Every figure follows what llama.cpp (as vendored by
llama-cpp-python 0.3.36) actually allocates, checked against its own log lines on both test models:

- KV cache, per layer and token: kv_heads × (key_length + value_length) elements of the cache
  type (f16: 2 bytes; q8_0: 34 bytes per 32; q4_0: 18 bytes per 32). The cache has
  `pad(n_ctx, 256)` cells.
- Sliding-window (SWA) layers: llama.cpp's iSWA cache gives them only
  `pad(min(n_ctx, window + n_ubatch), 256)` cells, but only when `swa_full` is false.
  llama.cpp's default (and so llama-cpp-python's, unless `swa_full=False` is passed) is a
  full-size SWA cache. Both figures are reported.
- Compute buffer, the larger of two phases because ggml's allocator reuses memory between them,
  plus an output buffer of 4 × n_vocab. With flash attention (llmchat's default):
  logits phase 4 × n_ubatch × (n_vocab + 2 × n_embd), attention phase
  n_ubatch × (2 × n_ctx × masks + 48 × n_embd) (the f16 attention mask, one per attention kind).
  Without it: logits phase 4 × n_ubatch × (n_vocab + 3 × n_embd), attention phase
  4 × n_ubatch × (n_ctx × (n_head + 1) + n_embd + 2 × n_ff) (scores per head plus the mask,
  one layer at a time). Within 1% of llama.cpp's reported compute buffer on SmolLM2-135M
  (4k-128k, n_ubatch 128-512) and Gemma 3 270M (4k-32k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmchat.gguf.metadata import GGML_TYPES, GGMLType, GGUFMetadata
from llmchat.gguf.reader import MAX_LAYERS

DEFAULT_UBATCH = 512  # llama-cpp-python's n_batch and n_ubatch defaults
KV_CELL_PADDING = 256  # llama_context pads n_ctx, and the iSWA cache pads the SWA size, to 256
# Layer layout of sliding-window models whose file does not say it (no
# `<arch>.attention.sliding_window_pattern`): the default period passed to load_swa_pattern in
# llama.cpp's src/models/<arch>.cpp, and whether the dense layer comes first in each period.
DEFAULT_SWA_PERIOD: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False),
    "gemma3": (6, False),
    "gemma3n": (5, False),
    "cohere2": (4, False),
    "exaone4": (4, False),
    "olmo2": (4, False),
    "gpt-oss": (2, False),
    "plamo3": (8, False),
    "smallthinker": (4, True),
}


# ---------------------------------------------------------------------------------------------
# Attention layout and KV cache


@dataclass(frozen=True)
class AttentionLayout:
    """Per-layer attention shape, as llama.cpp sizes the KV cache from it."""

    heads: tuple[int, ...]
    kv_heads: tuple[int, ...]  # 0 for layers without attention (recurrent layers of hybrids)
    key_length: int
    value_length: int
    key_length_swa: int
    value_length_swa: int
    sliding_window: int  # tokens; 0 when the model has no sliding-window layers
    swa_layers: tuple[bool, ...]
    swa_layout_source: str

    @property
    def n_layers(self) -> int:
        return len(self.kv_heads)

    @property
    def n_swa_layers(self) -> int:
        return sum(self.swa_layers)

    @property
    def kind(self) -> str:
        """MHA, GQA or MQA, judged on the layers that have attention."""
        pairs = {(h, kv) for h, kv in zip(self.heads, self.kv_heads) if kv > 0}
        if not pairs:
            return "none"
        kinds = {_attention_kind(h, kv) for h, kv in pairs}
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def layer_dims(self, layer: int) -> tuple[int, int]:
        if self.swa_layers[layer]:
            return self.key_length_swa, self.value_length_swa
        return self.key_length, self.value_length


def _attention_kind(heads: int, kv_heads: int) -> str:
    if kv_heads == heads:
        return "MHA"
    if kv_heads == 1:
        return "MQA"
    return "GQA"


def attention_layout(meta: GGUFMetadata) -> AttentionLayout:
    n_layers = metadata_int(meta.arch_get("block_count")) or 0
    heads = _per_layer(meta, "attention.head_count", n_layers, default=0)
    heads = heads or []
    # llama.cpp: head_count_kv defaults to head_count (plain MHA)
    kv_heads = _per_layer(meta, "attention.head_count_kv", n_layers, default=None) or heads
    key_length, value_length = _head_dims(meta, heads)
    key_length_swa = metadata_int(meta.arch_get("attention.key_length_swa")) or key_length
    value_length_swa = metadata_int(meta.arch_get("attention.value_length_swa")) or value_length
    window = metadata_int(meta.arch_get("attention.sliding_window")) or 0
    swa_layers, source = _swa_layers(meta, n_layers, window)
    return AttentionLayout(
        heads=tuple(heads),
        kv_heads=tuple(kv_heads),
        key_length=key_length,
        value_length=value_length,
        key_length_swa=key_length_swa,
        value_length_swa=value_length_swa,
        sliding_window=window if any(swa_layers) else 0,
        swa_layers=tuple(swa_layers),
        swa_layout_source=source,
    )


def metadata_int(value: Any) -> int | None:
    """A numeric metadata value as an int; None for a missing or non-numeric one (a bool is a flag,
    not a count)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value)


def _array_or_scalar(meta: GGUFMetadata, key: str) -> Any:
    """A key's value, reading a long array from the file if needed (per-layer arrays of deep models).
    Arrays longer than any real layer count are ignored rather than read into memory."""
    info = meta.arrays.get(key)
    if info is not None:
        return meta.read_array(key) if info.count <= MAX_LAYERS else None
    return meta.get(key)


def _per_layer(meta: GGUFMetadata, suffix: str, n_layers: int, default: int | None) -> list[int] | None:
    """`<arch>.<suffix>` as one value per layer; llama.cpp accepts a scalar or a per-layer array."""
    value = _array_or_scalar(meta, f"{meta.architecture}.{suffix}")
    if isinstance(value, list):
        values = [metadata_int(v) or 0 for v in value[:n_layers]]
        return values + [values[-1] if values else 0] * (n_layers - len(values))
    scalar = metadata_int(value)
    if scalar is None:
        return None if default is None else [default] * n_layers
    return [scalar] * n_layers


def _head_dims(meta: GGUFMetadata, heads: list[int]) -> tuple[int, int]:
    """key_length/value_length, else llama.cpp's fallback n_embd / n_head."""
    n_head = max(heads, default=0)
    embedding = metadata_int(meta.arch_get("embedding_length")) or 0
    fallback = embedding // n_head if n_head else 0
    key_length = metadata_int(meta.arch_get("attention.key_length")) or fallback
    value_length = metadata_int(meta.arch_get("attention.value_length")) or fallback
    return key_length, value_length


def _swa_layers(meta: GGUFMetadata, n_layers: int, window: int) -> tuple[list[bool], str]:
    """Which layers are sliding-window, following llama_hparams::set_swa_pattern."""
    if window <= 0:
        return [False] * n_layers, "no sliding window"
    key = f"{meta.architecture}.attention.sliding_window_pattern"
    pattern = _array_or_scalar(meta, key)
    if isinstance(pattern, list):
        flags = [bool(v) for v in pattern[:n_layers]]
        return flags + [False] * (n_layers - len(flags)), f"per-layer {key}"
    period = metadata_int(pattern)
    if period is not None:
        return _periodic_swa(n_layers, period, dense_first=False), f"{key} = {period}"
    default = DEFAULT_SWA_PERIOD.get(meta.architecture or "")
    if default is None:
        return [False] * n_layers, "layer layout unknown for this architecture: counted as full attention"
    period, dense_first = default
    first_or_last = "first" if dense_first else "last"
    return (
        _periodic_swa(n_layers, period, dense_first),
        f"llama.cpp's default for {meta.architecture}: 1 global layer ({first_or_last}) in every {period}",
    )


def _periodic_swa(n_layers: int, period: int, dense_first: bool) -> list[bool]:
    if period == 0:
        return [True] * n_layers
    if dense_first:
        return [layer % period != 0 for layer in range(n_layers)]
    return [layer % period < period - 1 for layer in range(n_layers)]


def _cache_row_bytes(elements: int, cache_type: str) -> int:
    """Bytes of one cache row of `elements` values (ggml_row_size)."""
    ggml_type = _cache_ggml_type(cache_type)
    return elements * ggml_type.type_size // ggml_type.block_size


def _cache_ggml_type(cache_type: str) -> GGMLType:
    wanted = cache_type.upper()
    for ggml_type in GGML_TYPES.values():
        if ggml_type.name == wanted:
            return ggml_type
    raise ValueError(f"unknown KV cache type {cache_type!r}")


def kv_bytes_per_token_by_layer(layout: AttentionLayout, cache_type: str = "f16") -> list[int]:
    per_layer = []
    for layer, kv_heads in enumerate(layout.kv_heads):
        key_length, value_length = layout.layer_dims(layer)
        per_layer.append(
            _cache_row_bytes(kv_heads * key_length, cache_type) + _cache_row_bytes(kv_heads * value_length, cache_type)
        )
    return per_layer


def kv_bytes_per_token(layout: AttentionLayout, cache_type: str = "f16") -> int:
    """K + V bytes one token takes across all layers, with every layer holding the full context."""
    return sum(kv_bytes_per_token_by_layer(layout, cache_type))


def kv_cache_cells(n_ctx: int) -> int:
    return _pad(max(n_ctx, 1), KV_CELL_PADDING)


def swa_cache_cells(layout: AttentionLayout, n_ctx: int, n_ubatch: int = DEFAULT_UBATCH) -> int:
    """Cells llama.cpp gives each sliding-window layer when swa_full is false (llama-kv-cache-iswa.cpp)."""
    cells = kv_cache_cells(n_ctx)
    return _pad(min(cells, layout.sliding_window + min(n_ubatch, n_ctx)), KV_CELL_PADDING)


def kv_cache_bytes(
    layout: AttentionLayout,
    n_ctx: int,
    cache_type: str = "f16",
    *,
    swa_full: bool = True,
    n_ubatch: int = DEFAULT_UBATCH,
) -> int:
    """The KV cache llama.cpp allocates for n_ctx. swa_full=True (llama.cpp's default) sizes
    sliding-window layers like the others; False gives the smaller iSWA cache."""
    cells = kv_cache_cells(n_ctx)
    swa_cells = cells if swa_full or not layout.sliding_window else swa_cache_cells(layout, n_ctx, n_ubatch)
    total = 0
    for layer, per_token in enumerate(kv_bytes_per_token_by_layer(layout, cache_type)):
        total += per_token * (swa_cells if layout.swa_layers[layer] else cells)
    return total


def _pad(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


# ---------------------------------------------------------------------------------------------
# Compute buffer


def vocab_size(meta: GGUFMetadata) -> int:
    tokens = meta.arrays.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return tokens.count
    small = meta.get("tokenizer.ggml.tokens")
    if isinstance(small, list):
        return len(small)
    return metadata_int(meta.arch_get("vocab_size")) or 0


def compute_buffer_bytes(
    meta: GGUFMetadata, layout: AttentionLayout, n_ctx: int, n_ubatch: int = DEFAULT_UBATCH, *, flash_attn: bool = True
) -> int:
    """llama.cpp's compute buffer (see the module docstring)."""
    ubatch = min(n_ubatch, n_ctx)
    n_vocab = vocab_size(meta)
    n_embd = metadata_int(meta.arch_get("embedding_length")) or 0
    cells = kv_cache_cells(n_ctx)
    output_buffer = 4 * n_vocab
    if flash_attn:
        masks = 2 if layout.sliding_window else 1
        logits_phase = 4 * ubatch * (n_vocab + 2 * n_embd)
        attention_phase = ubatch * (2 * cells * masks + 48 * n_embd)
    else:
        n_ff = _feed_forward_length(meta)
        n_head = max(layout.heads, default=0)
        logits_phase = 4 * ubatch * (n_vocab + 3 * n_embd)
        attention_phase = 4 * ubatch * (cells * (n_head + 1) + n_embd + 2 * n_ff)
    return max(logits_phase, attention_phase) + output_buffer


def _feed_forward_length(meta: GGUFMetadata) -> int:
    value = _array_or_scalar(meta, f"{meta.architecture}.feed_forward_length")
    if isinstance(value, list):
        return max((metadata_int(v) or 0 for v in value), default=0)
    return metadata_int(value) or 0
