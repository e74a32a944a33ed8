"""Which multimodal projector (mmproj) goes with a model, and whether libmtmd may be handed it.

Found the way users keep it: `--mmproj FILE`, else an `mmproj*.gguf` beside the model (llama.cpp's
and LM Studio's layout), else the one its store keeps with it (llmchat.models.projectors: an Ollama
model's projector layer, a Hugging Face cache repo's mmproj file). Its header is read with llmchat's own GGUF reader (llmchat.gguf.reader,
which checks the file's structure) and checked here before libmtmd opens it: libmtmd ends the
process with GGML_ABORT on some malformed projectors, where a one-line error is owed. Checked: it
is a projector (architecture `clip`), of a type libmtmd knows, with a vision or audio encoder,
and its output as wide as the model's embeddings. A projector found beside the model that does
not fit it (a folder of several models) is passed over; one named with --mmproj is an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llmchat.errors import ModelError, UsageError

if TYPE_CHECKING:
    from llmchat.gguf.metadata import GGUFMetadata

# The projector types libmtmd knows (tools/mtmd/clip-impl.h PROJECTOR_TYPE_NAMES, llama-cpp-python 0.3.36).
KNOWN_TYPES: frozenset[str] = frozenset(
    """
    mlp ldp ldpv2 resampler adapter qwen2vl_merger qwen2.5vl_merger qwen3vl_merger ling3vl step3vl gemma3
    gemma3nv gemma3na gemma4v gemma4a gemma4uv gemma4ua phi4 idefics3 pixtral ultravox internvl llama4
    qwen2a qwen3a glma qwen2.5o voxtral meralion musicflamingo lfm2 kimivl paddleocr lightonocr cogvlm
    janus_pro dots_ocr dots3note_v dots3note_a deepseekocr deepseekocr2 deepseek4v lfm2a glm4v glm5v
    youtuvl yasa2 kimik25 nemotron_v2_vl exaone4_5 hunyuanvl minicpmv4_6 granite_speech mimovl minimax_m3
    granite4_vision mimo_audio parakeet muse-glimmer
    """.split()
)
# Where a type's output width is (clip.cpp clip_n_mmproj_embd): a tensor and its dimension (ggml order).
_WIDTH: dict[str, tuple[str, int]] = {
    **dict.fromkeys(
        "mlp phi4 pixtral lightonocr dots_ocr ultravox voxtral musicflamingo qwen3a glma lfm2 kimivl paddleocr "
        "kimik25 yasa2 deepseek4v".split(),
        ("mm.2.weight", 1),
    ),
    **dict.fromkeys("gemma3 gemma3nv".split(), ("mm.input_projection.weight", 0)),
    **dict.fromkeys("gemma4v gemma4uv gemma4a gemma4ua".split(), ("mm.input_projection.weight", 1)),
    # clip.cpp loads these mergers' second layer as `mm.2` into its mm_1 fields, and reads mm_1_b.
    **dict.fromkeys("qwen2vl_merger qwen2.5vl_merger".split(), ("mm.2.bias", 0)),
    **dict.fromkeys("internvl nemotron_v2_vl".split(), ("mm.3.weight", 1)),
    "idefics3": ("mm.model.fc.weight", 1),
}
_ADVICE = "pass the mmproj .gguf made for this model with --mmproj"


@dataclass(frozen=True)
class Projector:
    path: Path
    type: str
    vision: bool
    audio: bool


def find_projector(explicit: Path | None, model_path: Path, model: GGUFMetadata) -> Projector | None:
    """The projector for this model, checked; None when there is none. An explicit one that does
    not fit is an error (UsageError: no such file; ModelError: not a projector, or not this model's)."""
    if explicit is not None:
        path = explicit.expanduser()
        if not path.is_file():
            raise UsageError(f"--mmproj {explicit}: no such file; pass the projector's .gguf path")
        return check_projector(path, model)
    from llmchat.models.projectors import store_projectors

    # Beside the model, then where its store keeps one (an Ollama projector layer, a HF repo's mmproj).
    for candidate in [*sorted(model_path.parent.glob("mmproj*.gguf")), *store_projectors(model_path)]:
        if candidate.resolve() == model_path.resolve():
            continue
        try:
            return check_projector(candidate, model)
        except ModelError:
            continue  # another model's projector in a shared folder
    return None


def check_projector(path: Path, model: GGUFMetadata) -> Projector:
    """ModelError, in one line, unless libmtmd can open `path` as a projector for `model`."""
    from llmchat.gguf.header_cache import read_metadata_cached

    meta = read_metadata_cached(path)  # the file's structure: a ModelError naming what is wrong
    arch = meta.get("general.architecture")
    if arch != "clip":
        what = f"a model of architecture {arch}" if isinstance(arch, str) else "no projector"
        raise ModelError(f"{path} is {what}, not a multimodal projector; {_ADVICE}")
    vision = meta.get("clip.has_vision_encoder") is True
    audio = meta.get("clip.has_audio_encoder") is True
    if not (vision or audio):
        raise ModelError(f"{path} has neither a vision nor an audio encoder; {_ADVICE}")
    kinds = [
        meta.get(key) for key in ("clip.projector_type", "clip.vision.projector_type", "clip.audio.projector_type")
    ]
    named = [kind for kind in kinds if isinstance(kind, str)]
    if not named:
        raise ModelError(f"{path} does not say which projector type it is (clip.projector_type); {_ADVICE}")
    unknown = [kind for kind in named if kind not in KNOWN_TYPES]
    if unknown:
        raise ModelError(
            f"{path} is a projector of type {unknown[0][:40]!r}, which this llama.cpp does not know; "
            "use a newer llama-cpp-python or another projector"
        )
    # Sizes libmtmd divides by or loops over: a zero or a missing one would end the process.
    wanted = [("vision", "image_size"), ("vision", "patch_size")] if vision else []
    for encoder in ("vision", "audio") if vision and audio else ("vision",) if vision else ("audio",):
        wanted += [(encoder, "embedding_length"), (encoder, "attention.head_count")]
    for encoder, name in wanted:
        value = meta.get(f"clip.{encoder}.{name}")
        if not isinstance(value, int) or value <= 0:
            raise ModelError(f"{path} lacks a valid clip.{encoder}.{name}; {_ADVICE}")
    _check_shapes(path, meta, named[0])
    from llmchat.media.audio_shapes import audio_problem

    for kind in named:
        problem = audio_problem(meta, kind)
        if problem is not None:
            raise ModelError(
                f"{path} is a malformed audio projector ({problem}), on which libmtmd would stop the process; {_ADVICE}"
            )
    width = _width(meta, named)
    arch_of_model = model.architecture or ""
    wanted = model.get(f"{arch_of_model}.embedding_length")
    if width is not None and isinstance(wanted, int) and width != wanted:
        raise ModelError(
            f"{path} makes embeddings {width} wide, but {model.path.name} takes {wanted}: it is another "
            f"model's projector; {_ADVICE}"
        )
    return Projector(path, named[0], vision, audio)


def _tensor_shape(meta: GGUFMetadata, name: str) -> tuple[int, ...] | None:
    for tensor in meta.tensors:
        if tensor.name == name:
            return tensor.shape
    return None


def _width(meta: GGUFMetadata, types: list[str]) -> int | None:
    for kind in types:
        where = _WIDTH.get(kind)
        if kind == "mlp" and _tensor_shape(meta, "mm.3.bias") is not None:
            where = ("mm.3.bias", 0)  # Yi-style LLaVA: a normed MLP ends at mm.3
        shape = _tensor_shape(meta, where[0]) if where else None
        if where and shape is not None and len(shape) > where[1]:
            return shape[where[1]]
    return None


def _check_shapes(path: Path, meta: GGUFMetadata, kind: str) -> None:
    """For the LLaVA MLP projector, the shapes whose mismatch ggml asserts on (an abort) at load."""
    if kind != "mlp":
        return
    n_embd = meta.get("clip.vision.embedding_length")
    mm0, mm2 = _tensor_shape(meta, "mm.0.weight"), _tensor_shape(meta, "mm.2.weight")
    patch = _tensor_shape(meta, "v.patch_embd.weight")
    broken = (
        mm0 is None
        or mm2 is None
        or patch is None
        or len(mm0) < 2
        or len(mm2) < 2
        or mm0[0] != n_embd
        or mm2[0] != mm0[1]
        or len(patch) != 4
        or patch[3] != n_embd
    )
    if broken:
        raise ModelError(f"{path} is a malformed projector (its layers' shapes do not chain); {_ADVICE}")
