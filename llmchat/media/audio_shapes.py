"""Why libmtmd would end the process on an audio projector of the whisper family, read from its header.

Ultravox, Voxtral, Qwen2-Audio (`qwen2a`), GLM-A, MERaLiON and Music Flamingo share one encoder
graph (tools/mtmd/models/whisper-enc.cpp, llama-cpp-python 0.3.36). libmtmd cuts audio into whole
30 s chunks of 3,000 mel frames (mtmd-audio.cpp); the encoder's two convolutions (the second of
stride 2) make 1,500 positions of them, which take that many rows of position embeddings; the
pooled types halve them (an average pool), the stacked types group `stack_factor` of them into
one. Several mismatches there are GGML_ASSERTs, which abort, not errors: position embeddings of
fewer rows, a bias on the key projection, a missing layer norm or query/value bias, and an output
count other than the one `clip_n_output_tokens` computes for the chunk ("Invalid number of output
tokens": a stacked projector whose 1,500 positions do not divide by its stack factor the way that
count assumes makes one token more). Each is computed here the way clip.cpp computes it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmchat.gguf.metadata import GGUFMetadata

WHISPER_TYPES = frozenset("ultravox voxtral qwen2a glma meralion musicflamingo".split())
STACKED = frozenset("ultravox voxtral meralion glma".split())  # a stack factor is required (clip.cpp)
POOLED = frozenset("qwen2a voxtral musicflamingo".split())  # clip_model::audio_has_avgpool
FRAMES = 3000  # mel frames in a 30 s chunk (16 kHz, hop 160)
MAX_MEL_BINS = 256


def _shape(meta: GGUFMetadata, name: str) -> tuple[int, ...] | None:
    return next((tensor.shape for tensor in meta.tensors if tensor.name == name), None)


def audio_problem(meta: GGUFMetadata, kind: str) -> str | None:
    """What in this projector libmtmd would abort on (its shapes are ggml's: the fastest axis first), or None."""
    if kind not in WHISPER_TYPES:
        return None
    n_embd = meta.get("clip.audio.embedding_length")
    n_mel = meta.get("clip.audio.num_mel_bins")
    if not isinstance(n_mel, int) or not 0 < n_mel <= MAX_MEL_BINS:
        return f"clip.audio.num_mel_bins must be 1 to {MAX_MEL_BINS}"
    conv1, conv2 = _shape(meta, "a.conv1d.1.weight"), _shape(meta, "a.conv1d.2.weight")
    if conv1 is None or conv2 is None or len(conv1) != 3 or len(conv2) != 3:
        return "the encoder's convolutions (a.conv1d.1.weight, a.conv1d.2.weight) are missing"
    if conv1[1:] != (n_mel, n_embd) or conv2[1:] != (n_embd, n_embd):
        return "the encoder's convolutions do not match its mel bins and width"
    # ggml_conv_1d_ph: padding of half the kernel; the first of stride 1, the second of stride 2.
    first = FRAMES + 2 * (conv1[0] // 2) - (conv1[0] - 1)
    positions = (first + 2 * (conv2[0] // 2) - (conv2[0] - 1) - 1) // 2 + 1
    n_pos = FRAMES // 2
    if positions != n_pos:
        return f"its convolutions make {positions} positions of a 30 s chunk, where the encoder takes {n_pos}"
    table = _shape(meta, "a.position_embd.weight")
    if table is None or len(table) != 2 or table[0] != n_embd or table[1] < n_pos:
        rows = table[1] if table is not None and len(table) == 2 else 0
        return f"its position embeddings have {rows} rows of width {n_embd}, where a 30 s chunk takes {n_pos}"
    needed = [
        f"a.blk.0.{name}" for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn_q.bias", "attn_v.bias")
    ]
    missing = [name for name in needed if _shape(meta, name) is None]
    if missing:
        return f"its first encoder layer lacks {missing[0]}"
    if _shape(meta, "a.blk.0.attn_k.bias") is not None:
        return "its key projection has a bias, which the whisper encoder has not"
    stack = meta.get("clip.audio.projector.stack_factor")
    if kind in STACKED and (not isinstance(stack, int) or stack <= 0):
        return "it lacks clip.audio.projector.stack_factor"
    if kind == "glma":
        return None  # its count has a formula of its own (a merge factor and begin/end embeddings)
    made = n_pos // 2 if kind in POOLED else n_pos
    expected = FRAMES
    if kind in STACKED and isinstance(stack, int) and stack > 1:
        made = -(-made // stack)  # build_stack pads the last group
        expected = -(-expected // stack)
    expected //= 2
    if kind in POOLED:
        expected //= 2
    if made != expected:
        return f"libmtmd expects {expected} tokens of each 30 s chunk, but its layers make {made}"
    return None
