"""Whether a well-formed GGUF file is a model llama.cpp can load and chat with.

The reader (llmchat.gguf.reader) only says the file is sound; this says what it is: an adapter,
a projector, an encoder, an architecture llama.cpp does not know, or a file missing the keys every
architecture needs. Each is a one-line `ModelError` before llama.cpp, which would abort or fail
with less to go on, sees the file.
"""

from __future__ import annotations

import os

from llmchat.errors import ModelError
from llmchat.gguf.metadata import GGUFMetadata
from llmchat.gguf.reader import ADVICE_RECONVERT, shown_name

__all__ = ["KNOWN_ARCHITECTURES", "NON_CHAT_ARCHITECTURES", "check_loadable"]

# Architecture names llama.cpp knows (src/llama-arch.cpp LLM_ARCH_NAMES, llama-cpp-python 0.3.36).
KNOWN_ARCHITECTURES: frozenset[str] = frozenset(
    """
    llama llama4 deci falcon grok gpt2 gptj gptneox mpt baichuan starcoder refact bert modern-bert
    nomic-bert nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert bloom stablelm qwen qwen2
    qwen2moe qwen2vl qwen3 qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe qwen4exp phi2 phi3
    phimoe plamo plamo2 plamo3 codeshell orion internlm2 minicpm minicpm3 gemma gemma2 gemma3 gemma3n
    gemma4 gemma4-assistant gemma-embedding starcoder2 mamba mamba2 maple jamba falcon-h1 xverse
    command-r cohere2 cohere2moe dbrx olmo olmo2 olmoe muse-glimmer openelm arctic deepseek deepseek2
    deepseek2-ocr deepseek32 deepseek4 chatglm glm4 glm4moe glm-dsa bitnet t5 t5encoder jais jais2
    nemotron nemotron_h nemotron_h_moe exaone exaone4 exaone-moe rwkv6 rwkv6qwen2 rwkv7 arwkv7 granite
    granitemoe granitehybrid graniteswitch granite_swa chameleon wavtokenizer-dec plm bailingmoe
    bailingmoe2 bailingmoe3 dots1 dots3note arcee afmoe laguna ernie4_5 ernie4_5-moe hunyuan-moe
    hunyuan-dense hunyuan_vl hy_v3 hy_v4 smollm3 gpt-oss lfm2 lfm2moe dream smallthinker llada
    llada-moe seed_oss grovemoe apertus minimax-01 hrm_text minimax-m2 minimax-m3 cogvlm rnd1
    pangu-embedded mistral3 eagle3 dflash mistral4 paddleocr mimo2 step35 spark2_5 llama-embed
    maincoder kimi-linear kimi-k3 glm5-next talkie mellum nanbeige qwen3tts pockettts
    """.split()
)

# Architectures llama.cpp loads that cannot generate chat replies: encoders, embedding models,
# audio decoders. "clip" is the multimodal projector (mmproj) format, which llama.cpp refuses as a
# main model.
NON_CHAT_ARCHITECTURES: frozenset[str] = frozenset(
    """
    clip bert modern-bert nomic-bert nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert
    gemma-embedding llama-embed t5encoder wavtokenizer-dec
    """.split()
)


def check_loadable(meta: GGUFMetadata, path: str | os.PathLike[str] | None = None, *, for_chat: bool = True) -> None:
    """Reject files llama.cpp would refuse (or that cannot chat) with a clear ModelError.

    Deliberately permissive beyond the essentials: a known architecture plus the hyperparameters
    every architecture needs. Per-architecture details are left to llama.cpp. `path` only changes
    how the file is named in messages (default: the path it was read from).
    """
    path = meta.path if path is None else path
    kind = meta.get("general.type")
    if kind == "adapter":
        raise ModelError(f"{path} is a LoRA adapter, not a model; pass the base model's .gguf file")
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelError(
            f"{path} does not say which architecture it is (general.architecture is missing); "
            "use a model file converted by llama.cpp's tools"
        )
    if arch not in KNOWN_ARCHITECTURES and arch != "clip":
        raise ModelError(
            f"{path} has architecture {shown_name(arch)}, which llama.cpp does not know; "
            "use a supported model or a newer llama-cpp-python"
        )
    if for_chat and arch in NON_CHAT_ARCHITECTURES:
        what = "a multimodal projector (mmproj)" if arch == "clip" else f"an '{arch}' encoder/embedding model"
        raise ModelError(f"{path} is {what}, not a chat model; pass a text-generation model")
    missing = [
        f"{arch}.{k}" for k in ("block_count", "context_length", "embedding_length") if f"{arch}.{k}" not in meta
    ]
    if missing:
        raise ModelError(f"{path} lacks required metadata ({', '.join(missing)}); {ADVICE_RECONVERT}")
    if not meta.tensors:
        raise ModelError(f"{path} contains no weights (a vocabulary-only file?); pass a complete model file")
