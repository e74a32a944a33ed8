"""Tiny random-weight hybrid models (LFM2: short convolutions beside attention; Qwen3.5: Gated
DeltaNet beside gated attention), written at test time with the `gguf` package, with a real
tokenizer and chat template. Each writes in well under a second.

The layouts follow llama.cpp's `tests/test-llama-archs.cpp` (attention on every other layer) and
`src/models/lfm2.cpp` / `qwen35.cpp` (the tensors). The tokenizer and chat template are SmolLM2's:
its `tokenizer.*` entries are copied byte for byte from the bundled GGUF, and `token_embd` is sized
to its vocabulary, so the ChatML template applies and a chat runs as it would on a real model.
llama.cpp reports both as hybrid (`llama_model_is_hybrid`), which is what the checkpoint tests
need; their replies are noise (but depend on the context: weights at 0.3 keep them from repeating).

The copied entries are spliced in right after the file header, padded to the file's alignment, so
the tensor data written by `GGUFWriter` moves by whole alignment units (as in gguf_copies.py).
"""

from __future__ import annotations

import struct
from pathlib import Path

N_EMBD, N_HEAD, N_FF, N_LAYER, L_CACHE = 64, 2, 128, 4, 3
STRING, ARRAY = 8, 9  # GGUF value types
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
KV_COUNT_AT = 16  # magic (4), version (4), tensor count (8), then the key-value count (8)


def _tokenizer_entries(source: Path) -> tuple[bytes, int, int]:
    """The raw bytes of `source`'s `tokenizer.*` key-value entries, their count, and the vocabulary
    size (the length of `tokenizer.ggml.tokens`)."""
    data = source.read_bytes()
    (count,) = struct.unpack_from("<Q", data, KV_COUNT_AT)
    at = KV_COUNT_AT + 8
    kept: list[bytes] = []
    n_vocab = 0

    def skip_value(kind: int, at: int) -> int:
        if kind == STRING:
            (length,) = struct.unpack_from("<Q", data, at)
            return at + 8 + length
        return at + FIXED_SIZES[kind]

    for _ in range(count):
        start = at
        (length,) = struct.unpack_from("<Q", data, at)
        key = data[at + 8 : at + 8 + length].decode()
        at += 8 + length
        (kind,) = struct.unpack_from("<I", data, at)
        at += 4
        if kind == ARRAY:
            element, n = struct.unpack_from("<IQ", data, at)
            at += 12
            if element == STRING:
                for _ in range(n):
                    at = skip_value(STRING, at)
            else:
                at += FIXED_SIZES[element] * n
            if key == "tokenizer.ggml.tokens":
                n_vocab = n
        else:
            at = skip_value(kind, at)
        if key.startswith("tokenizer."):
            kept.append(data[start:at])
    return b"".join(kept), len(kept), n_vocab


def _padding(length: int) -> bytes:
    name = b"test.padding"
    return struct.pack("<Q", len(name)) + name + struct.pack("<IQ", STRING, length) + b"x" * length


def write_lfm2(target: Path, tokenizer_source: Path, *, seed: int = 0) -> Path:
    """Write a random-weight LFM2 model (short convolutions and attention, alternating) with
    `tokenizer_source`'s tokenizer to `target`."""
    import numpy as np

    def layers(writer, weights) -> None:
        heads = [N_HEAD if layer % 2 == 0 else 0 for layer in range(N_LAYER)]  # 0: a convolution layer
        writer.add_head_count(heads)
        writer.add_head_count_kv(heads)
        writer.add_shortconv_l_cache(L_CACHE)
        writer.add_tensor("token_embd_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for layer in range(N_LAYER):
            blk = f"blk.{layer}"
            writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            if heads[layer]:
                head_dim = N_EMBD // N_HEAD
                writer.add_tensor(f"{blk}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
                writer.add_tensor(f"{blk}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
                for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                    writer.add_tensor(f"{blk}.{name}.weight", weights(N_EMBD, N_EMBD))
            else:
                writer.add_tensor(f"{blk}.shortconv.conv.weight", weights(N_EMBD, L_CACHE, scale=0.5))
                writer.add_tensor(f"{blk}.shortconv.in_proj.weight", weights(3 * N_EMBD, N_EMBD))
                writer.add_tensor(f"{blk}.shortconv.out_proj.weight", weights(N_EMBD, N_EMBD))

    return _write(target, tokenizer_source, "lfm2", layers, seed)


def write_qwen35(target: Path, tokenizer_source: Path, *, seed: int = 0) -> Path:
    """Write a random-weight Qwen3.5 model (Gated DeltaNet and gated attention, alternating; the
    layout of `src/models/qwen35.cpp`) with `tokenizer_source`'s tokenizer to `target`."""
    import numpy as np

    d_state, v_heads, k_heads, d_conv = 16, 2, 2, 4
    key_dim, value_dim = d_state * k_heads, d_state * v_heads
    head_dim = N_EMBD // N_HEAD

    def layers(writer, weights) -> None:
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        writer.add_rope_dimension_sections([head_dim // 4] * 4)
        writer.add_ssm_conv_kernel(d_conv)
        writer.add_ssm_inner_size(value_dim)
        writer.add_ssm_state_size(d_state)
        writer.add_ssm_time_step_rank(v_heads)
        writer.add_ssm_group_count(k_heads)
        writer.add_full_attention_interval(2)  # layers 1 and 3 attend; 0 and 2 are recurrent
        writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for layer in range(N_LAYER):
            blk = f"blk.{layer}"
            writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            writer.add_tensor(f"{blk}.post_attention_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            if (layer + 1) % 2 == 0:
                writer.add_tensor(f"{blk}.attn_q.weight", weights(2 * N_EMBD, N_EMBD))  # queries and their gate
                writer.add_tensor(f"{blk}.attn_k.weight", weights(N_EMBD, N_EMBD))
                writer.add_tensor(f"{blk}.attn_v.weight", weights(N_EMBD, N_EMBD))
                writer.add_tensor(f"{blk}.attn_output.weight", weights(N_EMBD, N_EMBD))
                writer.add_tensor(f"{blk}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
                writer.add_tensor(f"{blk}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
            else:
                writer.add_tensor(f"{blk}.attn_qkv.weight", weights(2 * key_dim + value_dim, N_EMBD))
                writer.add_tensor(f"{blk}.attn_gate.weight", weights(value_dim, N_EMBD))
                writer.add_tensor(f"{blk}.ssm_conv1d.weight", weights(2 * key_dim + value_dim, d_conv, scale=0.5))
                writer.add_tensor(f"{blk}.ssm_dt.bias", weights(v_heads))
                writer.add_tensor(f"{blk}.ssm_a", -np.ones(v_heads, dtype=np.float32))
                writer.add_tensor(f"{blk}.ssm_beta.weight", weights(v_heads, N_EMBD))
                writer.add_tensor(f"{blk}.ssm_alpha.weight", weights(v_heads, N_EMBD))
                writer.add_tensor(f"{blk}.ssm_norm.weight", np.ones(d_state, dtype=np.float32))
                writer.add_tensor(f"{blk}.ssm_out.weight", weights(N_EMBD, value_dim))

    return _write(target, tokenizer_source, "qwen35", layers, seed)


def write_llama(target: Path, tokenizer_source: Path, *, seed: int = 0) -> Path:
    """Write a random-weight transformer (`llama`: attention on every layer) of the same size as the
    hybrids here, to compare a hybrid's later turns with a plain KV cache's (bench/hybrid_turns.py)."""
    import numpy as np

    def layers(writer, weights) -> None:
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for layer in range(N_LAYER):
            blk = f"blk.{layer}"
            writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"{blk}.{name}.weight", weights(N_EMBD, N_EMBD))

    return _write(target, tokenizer_source, "llama", layers, seed)


def _write(target: Path, tokenizer_source: Path, arch: str, layers, seed: int) -> Path:
    """The keys and tensors every architecture here shares, `layers`' own, then the tokenizer."""
    import gguf
    import numpy as np

    entries, n_entries, n_vocab = _tokenizer_entries(tokenizer_source)
    rng = np.random.default_rng(seed)

    def weights(*shape: int, scale: float = 0.3) -> np.ndarray:
        # numpy's shape is the reverse of ggml's: rows last
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(target), arch)
    writer.add_context_length(4096)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tensor("token_embd.weight", weights(n_vocab, N_EMBD, scale=1.0).astype(np.float16))
    for layer in range(N_LAYER):
        writer.add_tensor(f"blk.{layer}.ffn_gate.weight", weights(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", weights(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{layer}.ffn_down.weight", weights(N_EMBD, N_FF))
    layers(writer, weights)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    data = target.read_bytes()
    alignment = 32  # GGUFWriter's default (general.alignment is not written)
    added = entries + _padding((-(len(entries) + len(_padding(0)))) % alignment)
    (count,) = struct.unpack_from("<Q", data, KV_COUNT_AT)
    start = KV_COUNT_AT + 8
    target.write_bytes(data[:KV_COUNT_AT] + struct.pack("<Q", count + n_entries + 1) + added + data[start:])
    return target
