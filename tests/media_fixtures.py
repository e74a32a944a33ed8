"""Media the tests make at test time: tiny PNG images of pure colours, and a "puppet" projector.

No vision model installs from a package registry, so the tests write their own projector (mmproj)
with the `gguf` package, in well under a second. It is of type `mlp` (LLaVA-1.5's graph, which
needs no special tokens and so fits SmolLM2) and is built so that a patch of pure colour encodes
to exactly the token embedding of a word (tools/mtmd/models/llava.cpp):

- the vision width is 3 and `block_count` 1, so the graph runs no encoder layer: a patch's
  embedding is the patch convolution of its pixels plus a zero position embedding;
- the convolution picks the patch's top-left pixel, one channel each: with mean = std = 0.5 a pure
  channel is +1 and an empty one -1;
- `mm.0` is 16·I: ±16, and ggml-cpu's GELU gives exactly 16 and 0 there;
- column c of `mm.2` is the embedding row of word c divided by 16 (exact: a power of two).

So a red patch comes out as exactly the embedding of " red" (SmolLM2's `token_embd` dequantised),
and the logits after [text, image, text] equal those after the same text with the words in the
image's place. A 28×28 image with patch 14 has 4 patches: 4 image tokens, read row by row.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

IMAGE_SIZE = 28
PATCH = 14
WORDS = (" red", " green", " blue")  # the words of the three channels, in channel order
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}


def png_bytes(pixels: list[list[tuple[int, int, int]]]) -> bytes:
    """An 8-bit RGB PNG of `pixels` (rows of (r, g, b)), written with zlib and struct."""
    height, width = len(pixels), len(pixels[0])
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def quadrants(*names: str) -> bytes:
    """A 28×28 PNG whose four 14×14 patches (row by row) are the named pure colours."""
    assert len(names) == 4
    colours = [COLOURS[name] for name in names]
    rows = []
    for y in range(IMAGE_SIZE):
        rows.append([colours[(y // PATCH) * 2 + (x // PATCH)] for x in range(IMAGE_SIZE)])
    return png_bytes(rows)


def word_embeddings(model_path: Path, words: tuple[str, ...] = WORDS) -> np.ndarray:
    """The rows of the model's `token_embd` for single-token words, dequantised as llama.cpp does."""
    from gguf import GGMLQuantizationType, quants

    from llmchat.gguf.metadata import GGML_TYPES
    from llmchat.gguf.reader import read_metadata

    meta = read_metadata(model_path)
    texts = meta.token_texts()
    ids = [texts.index(word.replace(" ", "Ġ")) for word in words]
    info = next(t for t in meta.tensors if t.name == "token_embd.weight")
    width = info.shape[0]
    row_bytes = info.nbytes // info.shape[1]
    kind = GGMLQuantizationType(info.ggml_type)
    assert GGML_TYPES[info.ggml_type].name  # a type llmchat's reader knows
    rows = []
    with open(model_path, "rb") as f:
        for token in ids:
            f.seek(meta.data_offset + info.offset + token * row_bytes)
            raw = np.frombuffer(f.read(row_bytes), dtype=np.uint8).reshape(1, row_bytes)
            rows.append(quants.dequantize(raw, kind).reshape(width).astype(np.float32))
    return np.stack(rows)


def write_puppet_projector(path: Path, embeddings: np.ndarray, *, width: int | None = None, heads: int = 1) -> Path:
    """The puppet `mlp` projector: channel c of a patch becomes `embeddings[c]` (3 rows). `width`:
    another output width than the embeddings' (a projector made for another model); `heads` 0: a
    malformed one that libmtmd would divide by."""
    import gguf

    n_out = embeddings.shape[1] if width is None else width
    mm2 = np.zeros((n_out, 3), dtype=np.float32)  # numpy shape: (out, in)
    rows = min(n_out, embeddings.shape[1])
    mm2[:rows, :] = (embeddings[:, :rows] / 16.0).T
    n_embd, n_ff = 3, 8
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_string("general.name", "puppet")
    for key, value in (
        ("embedding_length", n_embd),
        ("attention.head_count", heads),
        ("feed_forward_length", n_ff),
        ("block_count", 1),
        ("projection_dim", n_out),
        ("image_size", IMAGE_SIZE),
        ("patch_size", PATCH),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    patch = np.zeros((n_embd, 3, PATCH, PATCH), dtype=np.float32)  # (out, in, kh, kw)
    for channel in range(3):
        patch[channel, channel, 0, 0] = 1.0
    n_pos = (IMAGE_SIZE // PATCH) ** 2
    tensors = {
        "v.patch_embd.weight": patch,
        "v.position_embd.weight": np.zeros((n_pos, n_embd), dtype=np.float32),
        "mm.0.weight": (16.0 * np.eye(3)).astype(np.float32),
        "mm.0.bias": np.zeros(3, dtype=np.float32),
        "mm.2.weight": mm2,
        "mm.2.bias": np.zeros(n_out, dtype=np.float32),
    }
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors[f"v.blk.0.{name}.weight"] = np.eye(n_embd, dtype=np.float32)
        tensors[f"v.blk.0.{name}.bias"] = np.zeros(n_embd, dtype=np.float32)
    for name in ("ln1", "ln2"):
        tensors[f"v.blk.0.{name}.weight"] = np.ones(n_embd, dtype=np.float32)
        tensors[f"v.blk.0.{name}.bias"] = np.zeros(n_embd, dtype=np.float32)
    tensors["v.blk.0.ffn_up.weight"] = np.zeros((n_ff, n_embd), dtype=np.float32)
    tensors["v.blk.0.ffn_up.bias"] = np.zeros(n_ff, dtype=np.float32)
    tensors["v.blk.0.ffn_down.weight"] = np.zeros((n_embd, n_ff), dtype=np.float32)
    tensors["v.blk.0.ffn_down.bias"] = np.zeros(n_embd, dtype=np.float32)
    _write_tensors(writer, tensors)
    return path


def write_gemma3_projector(path: Path, text_width: int) -> Path:
    """A small random projector of type `gemma3` (SigLIP with one layer, 2×2 average pooling):
    Gemma 3's own shape, with begin and end of image tokens around the image and non-causal
    attention over it. 56×56 images, patch 14: 4×4 patches pooled to 4 image tokens."""
    import gguf

    rng = np.random.default_rng(7)
    n_embd, n_ff, size, patch = 8, 16, 56, 14
    n_pos = (size // patch) ** 2

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "gemma3")
    for key, value in (
        ("embedding_length", n_embd),
        ("attention.head_count", 2),
        ("feed_forward_length", n_ff),
        ("block_count", 1),
        ("projection_dim", text_width),
        ("image_size", size),
        ("patch_size", patch),
        ("projector.scale_factor", 2),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    tensors = {
        "v.patch_embd.weight": weights(n_embd, 3, patch, patch),
        "v.patch_embd.bias": weights(n_embd),
        "v.position_embd.weight": weights(n_pos, n_embd),
        "v.post_ln.weight": np.ones(n_embd, dtype=np.float32),
        "v.post_ln.bias": np.zeros(n_embd, dtype=np.float32),
        "mm.soft_emb_norm.weight": np.ones(n_embd, dtype=np.float32),
        "mm.input_projection.weight": weights(n_embd, text_width),  # ggml: [text_width, n_embd]
    }
    tensors |= _encoder_layer("v.blk.0", n_embd, n_ff, weights)
    _write_tensors(writer, tensors)
    return path


QWEN2VL_PATCH = 14  # Qwen2-VL's patch; 2×2 patches merge into one image token of 28×28 pixels


def write_qwen2vl(target: Path, tokenizer_source: Path, *, seed: int = 0) -> Path:
    """A random-weight text model of architecture `qwen2vl` (Qwen2 with M-RoPE: each head's rotary
    dimensions split into temporal, height and width sections), with `tokenizer_source`'s tokenizer
    and the size of the hybrids in tests/hybrid_models.py (n_embd 64, 2 heads of 32)."""
    from tests.hybrid_models import N_EMBD, N_HEAD, N_LAYER, _write

    head_dim = N_EMBD // N_HEAD

    def layers(writer, weights) -> None:
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        # Sections of the head's rotary pairs (head_dim / 2): time, height, width, unused (Qwen2-VL's 16, 24, 24, 0 scaled).
        writer.add_rope_dimension_sections([head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16, 0])
        writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for layer in range(N_LAYER):
            blk = f"blk.{layer}"
            writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            for name in ("attn_q", "attn_k", "attn_v"):
                writer.add_tensor(f"{blk}.{name}.weight", weights(N_EMBD, N_EMBD))
                writer.add_tensor(f"{blk}.{name}.bias", weights(N_EMBD))
            writer.add_tensor(f"{blk}.attn_output.weight", weights(N_EMBD, N_EMBD))

    return _write(target, tokenizer_source, "qwen2vl", layers, seed)


def write_qwen2vl_projector(path: Path, text_width: int) -> Path:
    """A small random projector of type `qwen2vl_merger` (tools/mtmd/models/qwen2vl.cpp): two patch
    kernels (Qwen2-VL's 3D convolution split along time), one encoder layer with 2D M-RoPE, and the
    merger MLP (`mm.0`, GELU, `mm.2`) over each 2×2 group of patches. libmtmd resizes an image to
    whole 28×28 tokens, at least 8 of them: 56×112 gives 2×4 tokens, which advance the position by
    max(2, 4) = 4, not 8."""
    import gguf

    rng = np.random.default_rng(13)
    n_embd, n_ff, n_merged = 16, 32, 64  # vision width, its feed-forward, the merger's hidden width

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "qwen2vl_merger")
    for key, value in (
        ("embedding_length", n_embd),
        ("attention.head_count", 2),
        ("feed_forward_length", n_ff),
        ("block_count", 1),
        ("projection_dim", text_width),
        ("image_size", 560),
        ("patch_size", QWEN2VL_PATCH),
    ):
        writer.add_uint32(f"clip.vision.{key}", value)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    patch = (n_embd, 3, QWEN2VL_PATCH, QWEN2VL_PATCH)
    tensors = {
        "v.patch_embd.weight": weights(*patch) * 0.1,
        "v.patch_embd.weight.1": weights(*patch) * 0.1,
        "mm.0.weight": weights(n_merged, 4 * n_embd),  # ggml: [4 * n_embd, n_merged]
        "mm.0.bias": weights(n_merged),
        "mm.2.weight": weights(text_width, n_merged) * 10,
        "mm.2.bias": weights(text_width),
    }
    tensors |= _encoder_layer("v.blk.0", n_embd, n_ff, weights)
    _write_tensors(writer, tensors)
    return path


AUDIO_POSITIONS = 1500  # the whisper encoder's positions: a 30 s chunk's 3,000 mel frames, halved by the stride-2 conv


def write_qwen2a_projector(
    path: Path, text_width: int, *, positions: int = AUDIO_POSITIONS, key_bias: bool = False, stack: int = 0
) -> Path:
    """A small random audio projector of type `qwen2a` (Qwen2-Audio: a one-layer whisper encoder,
    2x average pooling, one linear layer): each whole 30 s chunk of audio becomes 750 tokens.
    `positions` under 1,500 or a `key_bias` make one libmtmd would abort on (a GGML_ASSERT).
    `stack`: an `ultravox` projector instead, stacking that many positions into one token (8 makes
    188 tokens of a chunk where libmtmd counts 187, and aborts)."""
    import gguf

    rng = np.random.default_rng(11)
    n_embd, n_ff, n_mel = 8, 16, 80

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "ultravox" if stack else "qwen2a")
    if stack:
        writer.add_uint32("clip.audio.projector.stack_factor", stack)
    for key, value in (
        ("embedding_length", n_embd),
        ("attention.head_count", 2),
        ("feed_forward_length", n_ff),
        ("block_count", 1),
        ("projection_dim", text_width),
        ("num_mel_bins", n_mel),
    ):
        writer.add_uint32(f"clip.audio.{key}", value)
    writer.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    tensors = {
        "a.conv1d.1.weight": weights(n_embd, n_mel, 3),  # ggml: [kernel, in, out]
        "a.conv1d.1.bias": weights(n_embd, 1),
        "a.conv1d.2.weight": weights(n_embd, n_embd, 3),
        "a.conv1d.2.bias": weights(n_embd, 1),
        "a.position_embd.weight": weights(positions, n_embd),
        "a.post_ln.weight": np.ones(n_embd, dtype=np.float32),
        "a.post_ln.bias": np.zeros(n_embd, dtype=np.float32),
    }
    if stack:  # UltravoxProjector: RMS norm, SwiGLU, RMS norm, out
        tensors["mm.a.norm_pre.weight"] = np.ones(n_embd * stack, dtype=np.float32)
        tensors["mm.a.mlp.1.weight"] = weights(2 * n_ff, n_embd * stack)
        tensors["mm.a.norm_mid.weight"] = np.ones(n_ff, dtype=np.float32)
        tensors["mm.a.mlp.2.weight"] = weights(text_width, n_ff)
    else:
        tensors["mm.a.fc.weight"] = weights(text_width, n_embd)
        tensors["mm.a.fc.bias"] = weights(text_width)
    tensors |= _encoder_layer("a.blk.0", n_embd, n_ff, weights, key_bias=key_bias)  # whisper's key: no bias
    _write_tensors(writer, tensors)
    return path


def _encoder_layer(prefix: str, n_embd: int, n_ff: int, weights, *, key_bias: bool = True) -> dict[str, np.ndarray]:
    """One random encoder layer's tensors (attention, its norms, the feed-forward), in the order
    the writers draw them from their generator."""
    tensors = {}
    for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
        tensors[f"{prefix}.{name}.weight"] = weights(n_embd, n_embd)
        if name != "attn_k" or key_bias:
            tensors[f"{prefix}.{name}.bias"] = weights(n_embd)
    for name in ("ln1", "ln2"):
        tensors[f"{prefix}.{name}.weight"] = np.ones(n_embd, dtype=np.float32)
        tensors[f"{prefix}.{name}.bias"] = np.zeros(n_embd, dtype=np.float32)
    tensors[f"{prefix}.ffn_up.weight"] = weights(n_ff, n_embd)
    tensors[f"{prefix}.ffn_up.bias"] = weights(n_ff)
    tensors[f"{prefix}.ffn_down.weight"] = weights(n_embd, n_ff)
    tensors[f"{prefix}.ffn_down.bias"] = weights(n_embd)
    return tensors


def _write_tensors(writer, tensors: dict[str, np.ndarray]) -> None:
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def wav_bytes(seconds: float = 1.0, rate: int = 16000, hertz: float = 440.0) -> bytes:
    """A mono 16-bit PCM WAV of a sine tone, written with struct."""
    n = int(seconds * rate)
    samples = (np.sin(2 * np.pi * hertz * np.arange(n) / rate) * 8000).astype("<i2").tobytes()
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + len(samples),
        b"WAVE",
        b"fmt ",
        16,
        1,
        1,
        rate,
        rate * 2,
        2,
        16,
        b"data",
        len(samples),
    )
    return header + samples
