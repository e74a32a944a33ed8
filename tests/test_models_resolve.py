"""`-m` with store names: `ollama:NAME[:TAG]`, `hf:ORG/REPO[:QUANT|/FILE]`, `lmstudio:PUB/REPO`, bare names.

The stores are the real layouts of test_models_layout.py. Resolution reads names and manifests
only; one test runs `ask` on the Ollama blob of the Gemma 3 test model (the acceptance check).
"""

from __future__ import annotations

import os

import pytest
from test_models_layout import model_hashes, stores  # noqa: F401  (fixtures)

from llmchat.config import load_config
from llmchat.errors import ModelError, UsageError
from llmchat.models.resolve import resolve_model


def test_store_names_resolve_to_the_stores_files(stores, smollm2_path, gemma_path):  # noqa: F811
    config = load_config()
    gemma_blob = stores.ollama / "blobs" / f"sha256-{_blob_hex(stores, 'gemma3')}"
    cases = {
        "ollama:gemma3:270m": gemma_blob,
        "ollama:registry.ollama.ai/library/gemma3:270m": gemma_blob,
        "hf:unsloth/gemma-3-270m-GGUF": None,  # Q4_K_M by default, as llama.cpp's -hf
        "hf:unsloth/gemma-3-270m-GGUF:Q4_K_M": None,
        "hf:unsloth/gemma-3-270m-GGUF:q4_k_m": None,
        "hf:unsloth/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf": None,
        "lmstudio:lmstudio-community/SmolLM2-135M-Instruct-GGUF": None,
    }
    for name, expected in cases.items():
        resolved = resolve_model(name, config)
        assert resolved.how == "store", name
        if expected is not None:
            assert resolved.path == expected
    hf_gemma = resolve_model("hf:unsloth/gemma-3-270m-GGUF", config).path
    assert "snapshots" in hf_gemma.parts and hf_gemma.name == "gemma-3-270m-Q4_K_M.gguf"
    assert os.path.samefile(hf_gemma, gemma_path)
    assert os.path.samefile(
        resolve_model("lmstudio:lmstudio-community/SmolLM2-135M-Instruct-GGUF", config).path, smollm2_path
    )


def _blob_hex(built, model: str) -> str:
    import json

    manifest = built.ollama / "manifests" / "registry.ollama.ai" / "library" / model
    tag = next(manifest.iterdir())
    layers = json.loads(tag.read_text())["layers"]
    return layers[0]["digest"].split(":")[1]


def test_a_unique_bare_name_finds_the_one_file(stores, smollm2_path, gemma_path):  # noqa: F811
    config = load_config()
    assert os.path.samefile(resolve_model("gemma3", config).path, gemma_path)  # only Ollama calls it that
    assert os.path.samefile(resolve_model("tiny-split", config).path, smollm2_path)  # a model_dirs file by its stem
    assert resolve_model("tiny-split", config).path.name == "tiny-split-00001-of-00002.gguf"


def test_an_ambiguous_name_lists_the_candidates(stores):  # noqa: F811
    with pytest.raises(UsageError) as caught:
        resolve_model("smol", load_config())  # a prefix of four different files' names
    message = str(caught.value)
    assert "ollama:smollm2:135m" in message and "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1" in message
    assert "\n" not in message


def test_the_cli_exits_2_on_an_ambiguous_name_and_3_on_a_missing_one(stores, cli):  # noqa: F811
    ambiguous = cli("info", "-m", "smol")
    assert ambiguous.returncode == 2
    assert (
        ambiguous.stderr.startswith("llmchat: error: model name 'smol' matches") and ambiguous.stderr.count("\n") == 1
    )
    missing = cli("info", "-m", "ollama:qwen3:4b")
    assert missing.returncode == 3
    assert "no Ollama model 'qwen3:4b'" in missing.stderr
    not_cached = cli("info", "-m", "hf:Qwen/Qwen3-4B-GGUF:Q4_K_M")
    assert not_cached.returncode == 3
    assert "llmchat models pull hf:Qwen/Qwen3-4B-GGUF:Q4_K_M" in not_cached.stderr


def test_a_missing_quantization_lists_what_the_cache_has(stores):  # noqa: F811
    with pytest.raises(ModelError) as caught:
        resolve_model("hf:unsloth/gemma-3-270m-GGUF:Q8_0", load_config())
    assert "it has: Q4_K_M" in str(caught.value)
    assert "models pull hf:unsloth/gemma-3-270m-GGUF:Q8_0" in str(caught.value)


def test_cloud_and_safetensors_entries_are_not_models(stores):  # noqa: F811
    for name in ("ollama:gpt-oss:120b-cloud", "ollama:qwen3-st"):
        with pytest.raises(ModelError):
            resolve_model(name, load_config())


def test_ask_runs_the_gemma_blob_from_ollamas_store(stores, cli):  # noqa: F811
    result = cli("ask", "-m", "ollama:gemma3:270m", "--max-tokens", "8", "--seed", "1", "--no-history", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    # A base model: one warning on stderr that it continues text rather than answering.
    assert result.stderr.count("base model") == 1
