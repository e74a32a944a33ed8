"""KV-cache math, memory estimate and `llmchat info` on the two real models and on synthetic metadata.

Expected figures for the real models were checked against llama.cpp's own log lines
(llama-cpp-python 0.3.36, CPU):
- SmolLM2 n_ctx 4096: "KV buffer size = 90.00 MiB", "output buffer size = 0.19 MiB",
  "compute buffer size = 98.25 MiB" with flash attention (the same up to 64k; 141.51 MiB at 128k,
  70.76 at 128k with n_ubatch 256), 99.38 MiB without (646.38 at 32k).
- Gemma 3 270M n_ctx 32768: non-SWA KV 96.00 MiB + SWA KV 480.00 MiB (swa_full, the default),
  or 96.00 + 15.00 MiB (1024 cells) with swa_full=False; compute 514.50 MiB; output 1.00 MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmchat.gguf.footprint import attention_layout, compute_buffer_bytes, kv_bytes_per_token, kv_cache_bytes
from llmchat.gguf.machine import GpuMemory, SystemMemory, _parse_gpu_line, system_memory
from llmchat.gguf.metadata import GGUFMetadata, TensorInfo
from llmchat.gguf.model_report import (
    TEMPLATE_BUILT_IN,
    TEMPLATE_FROM_FILE,
    chat_template_source,
    context_points,
    model_report,
    parameter_count,
    quantization,
)
from llmchat.gguf.reader import read_metadata

REPO_ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
PLENTY = SystemMemory(ram_total_bytes=64 << 30, ram_available_bytes=48 << 30)


@pytest.fixture(scope="session")
def smollm2(smollm2_path) -> GGUFMetadata:
    return read_metadata(smollm2_path)


@pytest.fixture(scope="session")
def gemma(gemma_path) -> GGUFMetadata:
    return read_metadata(gemma_path)


def synthetic(arch: str = "llama", tensors: list[TensorInfo] | None = None, **arch_keys: Any) -> GGUFMetadata:
    """Metadata without a file, for the pure functions: arch_keys are `<arch>.<key>` with dots as __."""
    scalars: dict[str, Any] = {"general.architecture": arch}
    for key, value in arch_keys.items():
        scalars[f"{arch}.{key.replace('__', '.')}"] = value
    return GGUFMetadata(
        path=Path("synthetic.gguf"),
        version=3,
        file_size=0,
        data_offset=0,
        alignment=32,
        scalars=scalars,
        tensors=tensors or [],
    )


# ---------------------------------------------------------------------------------------------
# SmolLM2-135M: llama, 30 layers, GQA 9/3, head dim 64


def test_smollm2_kv_bytes_per_token(smollm2: GGUFMetadata) -> None:
    layout = attention_layout(smollm2)
    assert kv_bytes_per_token(layout, "f16") == 30 * 3 * 64 * 2 * 2 == 23_040
    assert kv_bytes_per_token(layout, "q8_0") == 30 * 3 * 64 * 2 * 34 // 32 == 12_240
    assert kv_bytes_per_token(layout, "q4_0") == 30 * 3 * 64 * 2 * 18 // 32 == 6_480


def test_smollm2_layout(smollm2: GGUFMetadata) -> None:
    layout = attention_layout(smollm2)
    assert layout.n_layers == 30
    assert set(layout.heads) == {9} and set(layout.kv_heads) == {3}
    assert (layout.key_length, layout.value_length) == (64, 64)  # embedding 576 / 9 heads
    assert layout.kind == "GQA"
    assert layout.sliding_window == 0 and layout.n_swa_layers == 0


def test_smollm2_matches_llama_cpp_buffers(smollm2: GGUFMetadata) -> None:
    layout = attention_layout(smollm2)
    assert kv_cache_bytes(layout, 4096) == 90 * MiB
    assert kv_cache_bytes(layout, 4096, swa_full=False) == 90 * MiB  # no SWA layers: same
    out = 0.1875 * MiB
    for n_ctx, n_ubatch, measured in (
        (4096, 512, 98.2520),
        (65536, 512, 98.2520),
        (131072, 512, 141.51),
        (131072, 256, 70.76),
        (131072, 128, 35.38),
    ):
        expected = measured * MiB + out
        assert abs(compute_buffer_bytes(smollm2, layout, n_ctx, n_ubatch) - expected) / expected < 0.01, (
            n_ctx,
            n_ubatch,
        )
    measured = (99.3770 + 0.1875) * MiB
    assert abs(compute_buffer_bytes(smollm2, layout, 4096, flash_attn=False) - measured) / measured < 0.01
    measured_32k = (646.3848 + 0.1875) * MiB
    assert abs(compute_buffer_bytes(smollm2, layout, 32768, flash_attn=False) - measured_32k) / measured_32k < 0.01


def test_smollm2_report(smollm2: GGUFMetadata) -> None:
    report = model_report(smollm2, PLENTY)
    assert report.architecture == "llama"
    assert report.size_label == "135M"
    assert report.quantization == "Q4_1" and report.quantization_source == "general.file_type"
    assert report.parameter_count == parameter_count(smollm2) == 134_515_008
    assert report.trained_context == 8192
    assert report.chat_template_source == TEMPLATE_FROM_FILE and report.has_chat_template
    assert report.vocab_size == 49152
    assert [c.n_ctx for c in report.contexts] == [4096, 8192, 32768, 131072]
    by_ctx = {c.n_ctx: c for c in report.contexts}
    assert by_ctx[8192].kv_bytes == 8192 * 23_040
    assert not by_ctx[8192].beyond_trained and by_ctx[32768].beyond_trained
    for ctx in report.contexts:
        assert ctx.total_bytes == report.weights_bytes + ctx.kv_bytes + ctx.compute_bytes
        assert ctx.fits_ram is True and ctx.fits_vram is None


# ---------------------------------------------------------------------------------------------
# Gemma 3 270M: MQA, head dim 256, sliding window 512 on 5 of every 6 layers


def test_gemma_kv_bytes_per_token(gemma: GGUFMetadata) -> None:
    layout = attention_layout(gemma)
    assert kv_bytes_per_token(layout, "f16") == 18 * 1 * (256 + 256) * 2 == 18_432
    assert layout.kind == "MQA"


def test_gemma_sliding_window_layout(gemma: GGUFMetadata) -> None:
    layout = attention_layout(gemma)
    assert layout.sliding_window == 512
    global_layers = [i for i, swa in enumerate(layout.swa_layers) if not swa]
    assert global_layers == [5, 11, 17]  # llama.cpp: layer il slides when il % 6 < 5
    assert layout.n_swa_layers == 15
    assert "default for gemma3" in layout.swa_layout_source


def test_gemma_swa_aware_kv_cache(gemma: GGUFMetadata) -> None:
    layout = attention_layout(gemma)
    per_layer = 1 * (256 + 256) * 2
    # swa_full (llama.cpp's default): every layer holds the whole context.
    assert kv_cache_bytes(layout, 32768) == 18 * per_layer * 32768 == (96 + 480) * MiB
    # swa_full=False: local layers hold pad(512 window + 512 ubatch, 256) = 1024 cells.
    swa = 3 * per_layer * 32768 + 15 * per_layer * 1024
    assert kv_cache_bytes(layout, 32768, swa_full=False) == swa == (96 + 15) * MiB
    # Below window + ubatch, the local layers are capped by the context itself.
    assert kv_cache_bytes(layout, 512, swa_full=False) == 18 * per_layer * 512


def test_gemma_compute_buffer_matches_llama_cpp(gemma: GGUFMetadata) -> None:
    layout = attention_layout(gemma)
    measured = (514.5020 + 1.0) * MiB  # logits of 262144 tokens x 512 dominate at any context up to 32k
    for n_ctx in (4096, 32768):
        assert abs(compute_buffer_bytes(gemma, layout, n_ctx) - measured) / measured < 0.01
        assert abs(compute_buffer_bytes(gemma, layout, n_ctx, flash_attn=False) - measured) / measured < 0.01
    small_ubatch = (64.31 + 1.0) * MiB  # flash attention, n_ubatch 64, 32k
    assert abs(compute_buffer_bytes(gemma, layout, 32768, 64) - small_ubatch) / small_ubatch < 0.01


def test_gemma_report(gemma: GGUFMetadata) -> None:
    report = model_report(gemma, PLENTY)
    assert report.quantization == "Q4_K_M"
    assert report.size_label == "270M"
    assert report.chat_template_source == TEMPLATE_BUILT_IN and not report.has_chat_template
    assert (report.layers, report.heads, report.kv_heads) == (18, 4, 1)
    assert (report.head_dim_k, report.head_dim_v) == (256, 256)
    assert report.kv_bytes_per_token["f16"] == 18_432
    assert [c.n_ctx for c in report.contexts] == [4096, 8192, 32768, 131072]
    by_ctx = {c.n_ctx: c for c in report.contexts}
    assert by_ctx[32768].kv_bytes == 576 * MiB and by_ctx[32768].kv_bytes_swa == 111 * MiB
    assert by_ctx[32768].total_bytes_swa < by_ctx[32768].total_bytes
    assert any("sliding window" in note and "swa_full" in note for note in report.notes)


# ---------------------------------------------------------------------------------------------
# Synthetic metadata: the branches the two real models do not take


def test_mha_and_head_dim_fallback() -> None:
    meta = synthetic(block_count=4, embedding_length=512, attention__head_count=8)
    layout = attention_layout(meta)
    assert layout.kind == "MHA"  # no head_count_kv: llama.cpp defaults it to head_count
    assert (layout.key_length, layout.value_length) == (64, 64)
    assert kv_bytes_per_token(layout) == 4 * 8 * 128 * 2


def test_separate_key_and_value_lengths() -> None:
    meta = synthetic(
        block_count=2,
        embedding_length=1024,
        attention__head_count=8,
        attention__head_count_kv=2,
        attention__key_length=192,
        attention__value_length=128,
    )
    assert kv_bytes_per_token(attention_layout(meta)) == 2 * 2 * (192 + 128) * 2


def test_per_layer_kv_heads_with_recurrent_layers() -> None:
    """Hybrid models list head_count_kv per layer; 0 means no attention in that layer (no KV)."""
    meta = synthetic(
        "jamba",
        block_count=4,
        embedding_length=256,
        attention__head_count=[8, 8, 8, 8],
        attention__head_count_kv=[0, 2, 0, 2],
    )
    layout = attention_layout(meta)
    assert kv_bytes_per_token(layout) == 2 * 2 * (32 + 32) * 2
    assert layout.kind == "GQA"
    report = model_report(meta, PLENTY)
    assert report.kv_heads_per_layer == [0, 2, 0, 2]
    assert any("recurrent" in note for note in report.notes)


def test_long_per_layer_array_is_read_from_the_file(tmp_path: Path) -> None:
    """More layers than SMALL_ARRAY_MAX: head_count_kv is located at parse time and read on demand."""
    from gguf import GGUFWriter

    path = tmp_path / "deep.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_block_count(80)
    writer.add_embedding_length(1024)
    writer.add_head_count(16)
    writer.add_head_count_kv([8 if layer % 2 else 4 for layer in range(80)])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    meta = read_metadata(path)
    assert "llama.attention.head_count_kv" in meta.arrays
    layout = attention_layout(meta)
    assert kv_bytes_per_token(layout) == 40 * (4 + 8) * (64 + 64) * 2
    assert layout.kind == "GQA"


def test_swa_pattern_from_the_file() -> None:
    as_period = synthetic(
        "gemma3",
        block_count=8,
        embedding_length=256,
        attention__head_count=4,
        attention__sliding_window=128,
        attention__sliding_window_pattern=4,
    )
    assert attention_layout(as_period).swa_layers == (True, True, True, False) * 2
    as_flags = synthetic(
        "gemma3",
        block_count=3,
        embedding_length=256,
        attention__head_count=4,
        attention__sliding_window=128,
        attention__sliding_window_pattern=[True, False, True],
    )
    assert attention_layout(as_flags).swa_layers == (True, False, True)


def test_unknown_swa_layout_counts_as_full_attention() -> None:
    meta = synthetic(
        "qwen2", block_count=4, embedding_length=256, attention__head_count=4, attention__sliding_window=4096
    )
    layout = attention_layout(meta)
    assert layout.n_swa_layers == 0 and layout.sliding_window == 0
    assert kv_cache_bytes(layout, 8192, swa_full=False) == kv_cache_bytes(layout, 8192)


def test_kv_cells_are_padded_to_256() -> None:
    layout = attention_layout(synthetic(block_count=1, embedding_length=64, attention__head_count=1))
    assert kv_cache_bytes(layout, 1000) == kv_cache_bytes(layout, 1024)


def test_quantization_falls_back_to_the_most_common_weight_type() -> None:
    tensors = [
        TensorInfo("token_embd.weight", (64, 100), 8, 0, 6800),  # Q8_0
        TensorInfo("blk.0.attn_q.weight", (256, 256), 12, 6816, 36864),  # Q4_K
        TensorInfo("blk.0.attn_norm.weight", (256,), 0, 43680, 1024),  # F32, 1-D: ignored
    ]
    meta = synthetic(block_count=1, tensors=tensors)
    assert quantization(meta) == ("Q4_K", "most common tensor type")
    meta.scalars["general.file_type"] = 7
    assert quantization(meta) == ("Q8_0", "general.file_type")
    assert parameter_count(meta) == 64 * 100 + 256 * 256 + 256


def test_chat_template_source() -> None:
    meta = synthetic()
    assert chat_template_source(meta) == TEMPLATE_BUILT_IN
    meta.scalars["tokenizer.chat_template"] = "{{ messages }}"
    assert chat_template_source(meta) == TEMPLATE_FROM_FILE


def test_context_points_include_the_trained_context() -> None:
    assert context_points(2048) == [2048, 4096, 8192, 32768, 131072]
    assert context_points(8192) == [4096, 8192, 32768, 131072]
    assert context_points(None) == [4096, 8192, 32768, 131072]


def test_fits_against_ram_and_vram(smollm2: GGUFMetadata) -> None:
    small = SystemMemory(
        ram_total_bytes=1 << 30, ram_available_bytes=400 * MiB, gpus=(GpuMemory("Test GPU", 8 << 30, 2 << 30),)
    )
    by_ctx = {c.n_ctx: c for c in model_report(smollm2, small).contexts}
    assert by_ctx[4096].fits_ram is True and by_ctx[32768].fits_ram is False
    assert by_ctx[32768].fits_vram is True and by_ctx[131072].fits_vram is False
    unknown = SystemMemory(ram_total_bytes=None, ram_available_bytes=None)
    assert all(c.fits_ram is None for c in model_report(smollm2, unknown).contexts)


def test_system_memory_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("llmchat.gguf.machine.shutil.which", lambda name: None)  # no nvidia-smi
    memory = system_memory()
    assert memory.gpus == () and memory.vram_free_bytes is None
    if Path("/proc/meminfo").exists():
        assert memory.ram_total_bytes and memory.ram_available_bytes
        assert 0 < memory.ram_available_bytes <= memory.ram_total_bytes


def test_nvidia_smi_line_parsing() -> None:
    gpu = _parse_gpu_line("NVIDIA H200, 143771, 140000")
    assert gpu == GpuMemory("NVIDIA H200", 143771 * MiB, 140000 * MiB)
    assert _parse_gpu_line("garbage") is None
    assert _parse_gpu_line("name, [N/A], [N/A]") is None


# ---------------------------------------------------------------------------------------------
# The CLI


def run_info_json(model: Path, home: Path) -> dict[str, Any]:
    env = dict(os.environ, LLMCHAT_HOME=str(home))
    env.pop("LLMCHAT_MODEL", None)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-m", "llmchat", "info", "-m", str(model), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


STABLE_FIELDS = {
    "path",
    "media",
    "kind",
    "tools",
    "kind_evidence",
    "file_size_bytes",
    "gguf_version",
    "architecture",
    "name",
    "size_label",
    "parameter_count",
    "quantization",
    "quantization_source",
    "trained_context",
    "layers",
    "embedding_length",
    "heads",
    "kv_heads",
    "heads_per_layer",
    "kv_heads_per_layer",
    "head_dim_k",
    "head_dim_v",
    "attention",
    "sliding_window",
    "sliding_window_layers",
    "sliding_window_layout",
    "vocab_size",
    "tensor_count",
    "weights_bytes",
    "has_chat_template",
    "chat_template_source",
    "kv_bytes_per_token",
    "contexts",
    "memory",
    "notes",
    "runtime",
}
CONTEXT_FIELDS = {
    "n_ctx",
    "beyond_trained",
    "kv_bytes",
    "kv_bytes_swa",
    "compute_bytes",
    "total_bytes",
    "total_bytes_swa",
    "fits_ram",
    "fits_vram",
}


def test_info_json_smollm2(smollm2: GGUFMetadata, tmp_path: Path) -> None:
    data = run_info_json(smollm2.path, tmp_path)
    assert set(data) == STABLE_FIELDS
    assert data["architecture"] == "llama"
    assert data["quantization"] == "Q4_1"
    assert data["kv_bytes_per_token"] == {"f16": 23_040, "q8_0": 12_240, "q4_0": 6_480}
    assert (data["layers"], data["heads"], data["kv_heads"], data["attention"]) == (30, 9, 3, "GQA")
    assert data["trained_context"] == 8192
    assert data["chat_template_source"] == "GGUF tokenizer.chat_template"
    assert data["file_size_bytes"] == smollm2.file_size
    assert [c["n_ctx"] for c in data["contexts"]] == [4096, 8192, 32768, 131072]
    assert all(set(c) == CONTEXT_FIELDS for c in data["contexts"])
    assert set(data["memory"]) == {"ram_total_bytes", "ram_available_bytes", "gpus"}
    runtime = data["runtime"]
    import llama_cpp

    gpu_build = bool(llama_cpp.llama_supports_gpu_offload())
    assert runtime["gpu_offload"] == gpu_build
    assert any(d["kind"] == "CPU" for d in runtime["devices"])  # ggml always registers the CPU
    assert runtime["offload_layers"] == (31 if gpu_build else 0)  # 30 blocks + the output layer
    assert runtime["flash_attn"] is gpu_build  # auto: on with layers on a GPU, off on the CPU


def test_info_json_gemma(gemma: GGUFMetadata, tmp_path: Path) -> None:
    data = run_info_json(gemma.path, tmp_path)
    assert set(data) == STABLE_FIELDS
    assert data["architecture"] == "gemma3"
    assert data["quantization"] == "Q4_K_M"
    assert data["kv_bytes_per_token"]["f16"] == 18_432
    assert data["attention"] == "MQA"
    assert (data["sliding_window"], data["sliding_window_layers"]) == (512, 15)
    assert data["has_chat_template"] is False
    assert data["chat_template_source"].startswith("none in the file")
    ctx_32k = next(c for c in data["contexts"] if c["n_ctx"] == 32768)
    assert ctx_32k["kv_bytes"] == 576 * MiB and ctx_32k["kv_bytes_swa"] == 111 * MiB


def test_info_human_output(smollm2: GGUFMetadata, tmp_path: Path) -> None:
    env = dict(os.environ, LLMCHAT_HOME=str(tmp_path), COLUMNS="120")
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run(
        [sys.executable, "-m", "llmchat", "info", "-m", str(smollm2.path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for fragment in ("llama", "Q4_1", "GQA", "23,040 B", "8,192", "fits RAM", "runtime: "):
        assert fragment in result.stdout, fragment


GPU_RUNTIME = {
    "gpu_offload": True,
    "devices": [
        {
            "name": "CUDA0",
            "description": "NVIDIA H200",
            "kind": "GPU",
            "free_bytes": 140 * 2**30,
            "total_bytes": 143 * 2**30,
        },
        {"name": "CPU", "description": "AMD EPYC", "kind": "CPU", "free_bytes": 2**34, "total_bytes": 2**34},
    ],
    "cpu_features": ["AVX2", "AVX512", "FMA"],
    "offload_layers": 31,
    "flash_attn": True,
}


def test_runtime_line_names_the_gpu_and_the_layers_it_takes() -> None:
    # Only the wording is checked here: no GPU is lent to this project's CI.
    from llmchat.commands.info import _runtime_line

    line = _runtime_line(GPU_RUNTIME)
    assert "CUDA0 (NVIDIA H200)" in line and "all 31 layers" in line
    cpu_only = _runtime_line(GPU_RUNTIME | {"gpu_offload": False, "offload_layers": 0})
    assert "CPU (AVX2, AVX512)" in cpu_only and "no GPU backend" in cpu_only


def test_vram_comes_from_ggml_when_nvidia_smi_is_absent(monkeypatch) -> None:
    from llmchat.commands.info import _with_ggml_gpus

    monkeypatch.setattr("llmchat.gguf.machine.shutil.which", lambda name: None)  # no nvidia-smi
    memory = _with_ggml_gpus(GPU_RUNTIME)
    assert [(g.name, g.free_bytes) for g in memory.gpus] == [("NVIDIA H200", 140 * 2**30)]
    assert _with_ggml_gpus(GPU_RUNTIME | {"gpu_offload": False}).gpus == ()


def test_backend_notice_reports_the_offload_llama_cpp_logged(monkeypatch) -> None:
    from llmchat.engine import devices, logs, model_load

    gpu = devices.Device("CUDA0", "NVIDIA H200", "GPU", 1, 2)
    monkeypatch.setattr(devices, "devices", lambda: [gpu])
    monkeypatch.setattr(logs, "offloaded", {"layers": 31, "of": 31})
    assert (
        model_load.backend_notice(-1, 8)
        == "backend: CUDA0 (NVIDIA H200): 31/31 layers offloaded; the rest on CPU, 8 threads"
    )
    assert "not used" in model_load.backend_notice(0, 8)
    monkeypatch.setattr(devices, "devices", lambda: [])
    assert model_load.backend_notice(0, 2) == "backend: CPU, 2 threads (this llama-cpp-python build has no GPU backend)"


def test_the_log_callback_keeps_llama_cpps_offload_count(monkeypatch) -> None:
    from llmchat.engine import logs

    monkeypatch.setattr(logs, "offloaded", {})
    logs._on_log(2, b"load_tensors: offloaded 29/31 layers to GPU\n", None)
    assert logs.offloaded == {"layers": 29, "of": 31}
