"""What a GGUF model is and what it costs to run: KV-cache math and a memory estimate.

Pure functions over `GGUFMetadata` (plus one probe of the machine's memory, `system_memory`).
Every figure follows what llama.cpp (as vendored by llama-cpp-python 0.3.36) actually allocates,
checked against its own log lines on both test models:

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

import os
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from llmchat.gguf_file import GGML_TYPES, MAX_LAYERS, GGMLType, GGUFMetadata, ggml_type_name

CONTEXT_POINTS = (4096, 8192, 32768, 131072)
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
DEFAULT_UBATCH = 512  # llama-cpp-python's n_batch and n_ubatch defaults
KV_CELL_PADDING = 256  # llama_context pads n_ctx, and the iSWA cache pads the SWA size, to 256
NVIDIA_SMI_TIMEOUT_S = 3.0

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

# llama.h `enum llama_ftype` (general.file_type), llama-cpp-python 0.3.36.
LLAMA_FTYPE_NAMES: dict[int, str] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    4: "Q4_1_SOME_F16",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    33: "Q4_0_4_4",
    34: "Q4_0_4_8",
    35: "Q4_0_8_8",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}
LLAMA_FTYPE_GUESSED = 1024

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"
TEMPLATE_FROM_FILE = f"GGUF {CHAT_TEMPLATE_KEY}"
TEMPLATE_BUILT_IN = "none in the file: a built-in template is chosen by llmchat template show"


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
    n_layers = _int(meta.arch_get("block_count")) or 0
    heads = _per_layer(meta, "attention.head_count", n_layers, default=0)
    heads = heads or []
    # llama.cpp: head_count_kv defaults to head_count (plain MHA)
    kv_heads = _per_layer(meta, "attention.head_count_kv", n_layers, default=None) or heads
    key_length, value_length = _head_dims(meta, heads)
    key_length_swa = _int(meta.arch_get("attention.key_length_swa")) or key_length
    value_length_swa = _int(meta.arch_get("attention.value_length_swa")) or value_length
    window = _int(meta.arch_get("attention.sliding_window")) or 0
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


def _int(value: Any) -> int | None:
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
        values = [_int(v) or 0 for v in value[:n_layers]]
        return values + [values[-1] if values else 0] * (n_layers - len(values))
    scalar = _int(value)
    if scalar is None:
        return None if default is None else [default] * n_layers
    return [scalar] * n_layers


def _head_dims(meta: GGUFMetadata, heads: list[int]) -> tuple[int, int]:
    """key_length/value_length, else llama.cpp's fallback n_embd / n_head."""
    n_head = max(heads, default=0)
    embedding = _int(meta.arch_get("embedding_length")) or 0
    fallback = embedding // n_head if n_head else 0
    key_length = _int(meta.arch_get("attention.key_length")) or fallback
    value_length = _int(meta.arch_get("attention.value_length")) or fallback
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
    period = _int(pattern)
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
# Compute buffer and weights


def vocab_size(meta: GGUFMetadata) -> int:
    tokens = meta.arrays.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return tokens.count
    small = meta.get("tokenizer.ggml.tokens")
    if isinstance(small, list):
        return len(small)
    return _int(meta.arch_get("vocab_size")) or 0


def compute_buffer_bytes(
    meta: GGUFMetadata, layout: AttentionLayout, n_ctx: int, n_ubatch: int = DEFAULT_UBATCH, *, flash_attn: bool = True
) -> int:
    """llama.cpp's compute buffer (see the module docstring)."""
    ubatch = min(n_ubatch, n_ctx)
    n_vocab = vocab_size(meta)
    n_embd = _int(meta.arch_get("embedding_length")) or 0
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
        return max((_int(v) or 0 for v in value), default=0)
    return _int(value) or 0


def parameter_count(meta: GGUFMetadata) -> int:
    return sum(t.n_elements for t in meta.tensors)


def quantization(meta: GGUFMetadata) -> tuple[str, str]:
    """(name, where it came from): general.file_type, else the type holding most weight bytes."""
    file_type = _int(meta.get("general.file_type"))
    if file_type is not None and file_type != LLAMA_FTYPE_GUESSED:
        name = LLAMA_FTYPE_NAMES.get(file_type)
        if name:
            return name, "general.file_type"
    common = _most_common_weight_type(meta)
    if common is not None:
        return common, "most common tensor type"
    return "unknown", "none"


def _most_common_weight_type(meta: GGUFMetadata) -> str | None:
    """1-D tensors (norms, biases) stay F32 in every quantization, so only 2-D+ tensors count."""
    weight_bytes: Counter[int] = Counter()
    for tensor in meta.tensors:
        if len(tensor.shape) >= 2:
            weight_bytes[tensor.ggml_type] += tensor.nbytes
    if not weight_bytes:
        return None
    return ggml_type_name(weight_bytes.most_common(1)[0][0])


def chat_template_source(meta: GGUFMetadata) -> str:
    template = meta.get(CHAT_TEMPLATE_KEY)
    return TEMPLATE_FROM_FILE if isinstance(template, str) and template.strip() else TEMPLATE_BUILT_IN


# ---------------------------------------------------------------------------------------------
# The machine


@dataclass(frozen=True)
class GpuMemory:
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class SystemMemory:
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    gpus: tuple[GpuMemory, ...] = ()

    @property
    def vram_free_bytes(self) -> int | None:
        """The most free memory on any one GPU (llmchat runs a model on one device)."""
        return max((gpu.free_bytes for gpu in self.gpus), default=None)


def system_memory() -> SystemMemory:
    total, available = _ram_from_proc() or _ram_from_sysconf()
    return SystemMemory(ram_total_bytes=total, ram_available_bytes=available, gpus=tuple(_nvidia_gpus()))


def _ram_from_proc() -> tuple[int, int] | None:
    try:
        with open("/proc/meminfo", encoding="ascii", errors="replace") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return _kib(fields["MemTotal"]), _kib(fields["MemAvailable"])
    except (OSError, KeyError, ValueError):
        return None


def _kib(text: str) -> int:
    return int(text.strip().split()[0]) * 1024


def _ram_from_sysconf() -> tuple[int | None, int | None]:
    """Fallback without /proc (macOS, BSD): total pages; free pages where the OS reports them."""
    try:
        page = os.sysconf("SC_PAGE_SIZE")
        total = os.sysconf("SC_PHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        return None, None
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * page
    except (ValueError, OSError, AttributeError):
        available = None
    return total, available


def _nvidia_gpus() -> list[GpuMemory]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        result = subprocess.run(
            [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if result.returncode != 0:
        return []
    return [gpu for line in result.stdout.splitlines() if (gpu := _parse_gpu_line(line)) is not None]


def _parse_gpu_line(line: str) -> GpuMemory | None:
    parts = [p.strip() for p in line.rsplit(",", 2)]
    if len(parts) != 3:
        return None
    try:
        mib = 1024 * 1024
        return GpuMemory(name=parts[0], total_bytes=int(float(parts[1]) * mib), free_bytes=int(float(parts[2]) * mib))
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------------
# The report


@dataclass(frozen=True)
class ContextEstimate:
    n_ctx: int
    beyond_trained: bool
    kv_bytes: int  # full-size cache, f16 (llama.cpp's default)
    kv_bytes_swa: int  # with swa_full=False; equals kv_bytes for models without SWA layers
    compute_bytes: int
    total_bytes: int  # weights + kv_bytes + compute_bytes
    total_bytes_swa: int
    fits_ram: bool | None  # None when available RAM is unknown
    fits_vram: bool | None  # None without a GPU


def context_points(trained_context: int | None) -> list[int]:
    points = set(CONTEXT_POINTS)
    if trained_context and trained_context > 0:
        points.add(trained_context)
    return sorted(points)


def estimate_context(meta: GGUFMetadata, layout: AttentionLayout, n_ctx: int, memory: SystemMemory) -> ContextEstimate:
    weights = meta.tensor_data_bytes
    kv_full = kv_cache_bytes(layout, n_ctx, swa_full=True)
    kv_swa = kv_cache_bytes(layout, n_ctx, swa_full=False)
    compute = compute_buffer_bytes(meta, layout, n_ctx)
    total = weights + kv_full + compute
    trained = _int(meta.arch_get("context_length"))
    return ContextEstimate(
        n_ctx=n_ctx,
        beyond_trained=trained is not None and trained > 0 and n_ctx > trained,
        kv_bytes=kv_full,
        kv_bytes_swa=kv_swa,
        compute_bytes=compute,
        total_bytes=total,
        total_bytes_swa=weights + kv_swa + compute,
        fits_ram=None if memory.ram_available_bytes is None else total <= memory.ram_available_bytes,
        fits_vram=None if memory.vram_free_bytes is None else total <= memory.vram_free_bytes,
    )


@dataclass
class ModelReport:
    path: str
    file_size_bytes: int
    gguf_version: int
    architecture: str | None
    name: str | None
    size_label: str | None
    parameter_count: int
    quantization: str
    quantization_source: str
    trained_context: int | None
    layers: int
    embedding_length: int | None
    heads: int
    kv_heads: int
    heads_per_layer: list[int] | None  # only when it varies by layer
    kv_heads_per_layer: list[int] | None
    head_dim_k: int
    head_dim_v: int
    attention: str
    sliding_window: int | None
    sliding_window_layers: int
    sliding_window_layout: str
    vocab_size: int
    tensor_count: int
    weights_bytes: int
    has_chat_template: bool
    chat_template_source: str
    kv_bytes_per_token: dict[str, int]
    contexts: list[ContextEstimate]
    memory: SystemMemory
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k not in ("contexts", "memory", "notes")}
        data["contexts"] = [dict(c.__dict__) for c in self.contexts]
        data["memory"] = {
            "ram_total_bytes": self.memory.ram_total_bytes,
            "ram_available_bytes": self.memory.ram_available_bytes,
            "gpus": [dict(g.__dict__) for g in self.memory.gpus],
        }
        data["notes"] = list(self.notes)
        return data


def model_report(meta: GGUFMetadata, memory: SystemMemory | None = None) -> ModelReport:
    memory = system_memory() if memory is None else memory
    layout = attention_layout(meta)
    trained = _int(meta.arch_get("context_length"))
    quant_name, quant_source = quantization(meta)
    template_source = chat_template_source(meta)
    return ModelReport(
        path=str(meta.path),
        file_size_bytes=meta.file_size,
        gguf_version=meta.version,
        architecture=meta.architecture,
        name=_str(meta.get("general.name")),
        size_label=_str(meta.get("general.size_label")),
        parameter_count=parameter_count(meta),
        quantization=quant_name,
        quantization_source=quant_source,
        trained_context=trained,
        layers=layout.n_layers,
        embedding_length=_int(meta.arch_get("embedding_length")),
        heads=max(layout.heads, default=0),
        kv_heads=max(layout.kv_heads, default=0),
        heads_per_layer=list(layout.heads) if len(set(layout.heads)) > 1 else None,
        kv_heads_per_layer=list(layout.kv_heads) if len(set(layout.kv_heads)) > 1 else None,
        head_dim_k=layout.key_length,
        head_dim_v=layout.value_length,
        attention=layout.kind,
        sliding_window=layout.sliding_window or None,
        sliding_window_layers=layout.n_swa_layers,
        sliding_window_layout=layout.swa_layout_source,
        vocab_size=vocab_size(meta),
        tensor_count=len(meta.tensors),
        weights_bytes=meta.tensor_data_bytes,
        has_chat_template=template_source == TEMPLATE_FROM_FILE,
        chat_template_source=template_source,
        kv_bytes_per_token={t: kv_bytes_per_token(layout, t) for t in KV_CACHE_TYPES},
        contexts=[estimate_context(meta, layout, n, memory) for n in context_points(trained)],
        memory=memory,
        notes=_notes(meta, layout),
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _notes(meta: GGUFMetadata, layout: AttentionLayout) -> list[str]:
    notes = [
        "kv_bytes_per_token = sum over layers of kv_heads x (key_length + value_length) x bytes per element "
        "(f16 2, q8_0 34/32, q4_0 18/32); the cache holds pad(n_ctx, 256) tokens.",
        "total = weights (tensor bytes) + KV cache (f16, full size) + compute buffer; "
        "compute = max(4 x n_ubatch(512) x (n_vocab + 2 x n_embd), n_ubatch x (2 x n_ctx x masks + 48 x n_embd)) "
        "+ 4 x n_vocab, with flash attention (llmchat's default; --no-flash-attn needs more at long contexts).",
    ]
    if layout.sliding_window:
        notes.append(
            f"{layout.n_swa_layers} of {layout.n_layers} layers use a {layout.sliding_window}-token sliding window "
            f"({layout.swa_layout_source}). kv_bytes is llama.cpp's default full-size cache (swa_full=true); "
            f"kv_bytes_swa is the iSWA cache with swa_full=false, where those layers hold only "
            f"pad(min(n_ctx, window + n_ubatch), 256) tokens (window + 512 of batch padding)."
        )
    if meta.arch_get("attention.kv_lora_rank") is not None:
        notes.append(
            "this model uses multi-head latent attention (MLA): llama.cpp caches a compressed latent, "
            "so the KV figures here are an upper bound."
        )
    if any(kv == 0 for kv in layout.kv_heads):
        notes.append(
            "layers without attention (recurrent/SSM) hold no KV cache; their fixed-size state is not counted."
        )
    notes.append(
        "fits_ram compares total with MemAvailable; fits_vram with the free memory of the emptiest GPU "
        "(only meaningful with a GPU build of llama-cpp-python)."
    )
    return notes
