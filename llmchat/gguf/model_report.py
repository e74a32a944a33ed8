"""What `llmchat info` reports about a GGUF model: what it is (architecture, size, quantization,
template) and what it costs at a few context lengths against this machine's memory.

The memory math is llmchat.gguf.footprint's; the machine's memory comes from llmchat.gguf.machine.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from llmchat.gguf.footprint import (
    AttentionLayout,
    attention_layout,
    compute_buffer_bytes,
    kv_bytes_per_token,
    kv_cache_bytes,
    metadata_int,
    vocab_size,
)
from llmchat.gguf.machine import SystemMemory, system_memory
from llmchat.gguf.metadata import GGUFMetadata, ggml_type_name

CONTEXT_POINTS = (4096, 8192, 32768, 131072)
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")

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


def parameter_count(meta: GGUFMetadata) -> int:
    return sum(t.n_elements for t in meta.tensors)


def quantization(meta: GGUFMetadata) -> tuple[str, str]:
    """(name, where it came from): general.file_type, else the type holding most weight bytes."""
    file_type = metadata_int(meta.get("general.file_type"))
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
    trained = metadata_int(meta.arch_get("context_length"))
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
    trained = metadata_int(meta.arch_get("context_length"))
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
        embedding_length=metadata_int(meta.arch_get("embedding_length")),
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
