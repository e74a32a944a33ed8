"""`llmchat models list` over real store layouts built in a temp folder from the test models' bytes.

Each store is laid out as its tool writes it: an HF cache with blobs/, snapshots/ symlinks and
refs/main; an Ollama store with manifests and `sha256-<hex>` blobs (plus a cloud-only entry and a
safetensors entry); an LM Studio tree (PUBLISHER/REPO/file.gguf); a folder from `model_dirs` with a
split model, an mmproj file, a truncated file and a non-GGUF file. The model files are hard links
to the real GGUFs (copies where links fail). HOME and every store variable point into the temp
folder, so the developer's own stores are never read.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

OLLAMA_MODEL = "application/vnd.ollama.image.model"
OLLAMA_CONFIG = "application/vnd.docker.container.image.v1+json"
HF_COMMIT = "a" * 40
STORE_VARIABLES = (
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "LLAMA_CACHE",
    "XDG_CACHE_HOME",
    "OLLAMA_MODELS",
    "HF_ENDPOINT",
    "HF_TOKEN",
    "HF_HUB_OFFLINE",
)


def link_or_copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return target


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def add_hf_file(cache: Path, repo: str, file: str, source: Path, etag: str, commit: str = HF_COMMIT) -> Path:
    """A file as huggingface_hub stores it: the bytes in blobs/<etag>, a relative symlink in the snapshot."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    blob = (
        link_or_copy(source, folder / "blobs" / etag)
        if not (folder / "blobs" / etag).exists()
        else folder / "blobs" / etag
    )
    pointer = folder / "snapshots" / commit / file
    pointer.parent.mkdir(parents=True, exist_ok=True)
    pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return pointer


def add_ollama_model(root: Path, name: str, tag: str, layers: list[dict], config: dict | None = None) -> Path:
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    config_bytes = json.dumps(config or {"model_format": "gguf", "model_family": name}).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    (blobs / config_digest.replace(":", "-")).write_bytes(config_bytes)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"mediaType": OLLAMA_CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": layers,
    }
    path = root / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


def ollama_gguf_layer(root: Path, source: Path, digest_hex: str) -> dict:
    link_or_copy(source, root / "blobs" / f"sha256-{digest_hex}")
    return {"mediaType": OLLAMA_MODEL, "digest": f"sha256:{digest_hex}", "size": source.stat().st_size}


def write_tiny_gguf(
    path: Path, *, name: str, template: str | None, arch: str = "llama", extra_tensors: tuple[str, ...] = ()
) -> Path:
    """A small GGUF written with the `gguf` package that passes the header checks (not meant to chat)."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    writer.add_block_count(1)
    writer.add_context_length(4096)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c", "d"])
    if template is not None:
        writer.add_chat_template(template)
    for tensor in ("token_embd.weight", *extra_tensors):
        writer.add_tensor(tensor, np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@dataclass
class Stores:
    root: Path
    env: dict[str, str]
    hf_cache: Path
    ollama: Path
    lmstudio: Path
    model_dir: Path


def build_stores(root: Path, smollm2: Path, gemma: Path, smollm2_sha: str, gemma_sha: str) -> Stores:
    home = root / "home"
    hf_cache = root / "hf-home" / "hub"
    ollama = root / "ollama"
    lmstudio = home / ".lmstudio" / "models"
    model_dir = root / "my-models"

    # Hugging Face cache: two repos; the Gemma repo also holds an mmproj file (skipped).
    add_hf_file(
        hf_cache, "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF", "smollm2-135m-instruct-q4_1.gguf", smollm2, smollm2_sha
    )
    add_hf_file(hf_cache, "unsloth/gemma-3-270m-GGUF", "gemma-3-270m-Q4_K_M.gguf", gemma, gemma_sha)
    mmproj = root / "mmproj-bytes"
    mmproj.write_bytes(b"GGUF" + b"\0" * 64)
    add_hf_file(hf_cache, "unsloth/gemma-3-270m-GGUF", "mmproj-F16.gguf", mmproj, "b" * 64)

    # Ollama: two GGUF models, a cloud-only entry and a safetensors entry.
    add_ollama_model(ollama, "gemma3", "270m", [ollama_gguf_layer(ollama, gemma, gemma_sha)])
    add_ollama_model(ollama, "smollm2", "135m", [ollama_gguf_layer(ollama, smollm2, smollm2_sha)])
    add_ollama_model(
        ollama, "gpt-oss", "120b-cloud", [], config={"model_format": "gguf", "remote_host": "https://ollama.com:443"}
    )
    tensor = {"mediaType": "application/vnd.ollama.image.tensor", "digest": "sha256:" + "c" * 64, "size": 10}
    add_ollama_model(ollama, "qwen3-st", "latest", [tensor])

    # LM Studio: PUBLISHER/REPO/file.gguf; a file directly in models/ is ignored, as LM Studio does.
    link_or_copy(
        smollm2, lmstudio / "lmstudio-community" / "SmolLM2-135M-Instruct-GGUF" / "SmolLM2-135M-Instruct-Q4_1.gguf"
    )
    link_or_copy(gemma, lmstudio / "stray-gemma.gguf")

    # A folder of the user's own: a split model, an mmproj, a truncated file, a text file.
    link_or_copy(smollm2, model_dir / "tiny-split-00001-of-00002.gguf")
    link_or_copy(smollm2, model_dir / "tiny-split-00002-of-00002.gguf")
    link_or_copy(gemma, model_dir / "mmproj-gemma.gguf")
    (model_dir / "cut.gguf").write_bytes(smollm2.read_bytes()[: 1 << 20])
    (model_dir / "README.txt").write_text("not a model")

    config_home = root / "llmchat-home"
    config_home.mkdir(exist_ok=True)
    (config_home / "config.toml").write_text(f'model_dirs = ["{model_dir}"]\n')
    env = {
        "HOME": str(home),
        "HF_HOME": str(root / "hf-home"),
        "OLLAMA_MODELS": str(ollama),
        "LLMCHAT_HOME": str(config_home),
    }
    return Stores(root, env, hf_cache, ollama, lmstudio, model_dir)


@pytest.fixture(scope="session")
def model_hashes(smollm2_path, gemma_path) -> tuple[str, str]:
    return sha256_of(smollm2_path), sha256_of(gemma_path)


@pytest.fixture
def stores(tmp_path, monkeypatch, smollm2_path, gemma_path, model_hashes) -> Stores:
    """The layout, with this process's environment pointing at it (and nothing else)."""
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    built = build_stores(tmp_path / "stores", smollm2_path, gemma_path, *model_hashes)
    for name, value in built.env.items():
        monkeypatch.setenv(name, value)
    return built


def listed(cli) -> list[dict]:
    result = cli("models", "list", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_list_shows_exactly_the_runnable_files_of_every_store(stores, cli):
    entries = listed(cli)
    runnable = sorted((e["source"], e["ref"]) for e in entries if e["runnable"])
    assert runnable == sorted(
        [
            ("hf", "hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"),
            ("hf", "hf:unsloth/gemma-3-270m-GGUF:Q4_K_M"),
            ("ollama", "ollama:gemma3:270m"),
            ("ollama", "ollama:smollm2:135m"),
            ("lmstudio", "lmstudio:lmstudio-community/SmolLM2-135M-Instruct-GGUF:Q4_1"),
            ("model_dirs", str(stores.model_dir / "tiny-split-00001-of-00002.gguf")),
        ]
    )
    refs = " ".join(e["ref"] for e in entries)
    # Skipped: mmproj files, later split parts, cloud and safetensors entries, stray and non-GGUF files.
    for absent in ("mmproj", "00002-of-00002", "gpt-oss", "qwen3-st", "stray-gemma", "README"):
        assert absent not in refs
    # The truncated file is listed as not loadable, with the reason.
    broken = [e for e in entries if not e["runnable"]]
    assert [Path(e["path"]).name for e in broken] == ["cut.gguf"]
    assert "truncated" in broken[0]["problem"]


def test_list_says_what_each_model_is(stores, cli, smollm2_path, gemma_path):
    by_ref = {e["ref"]: e for e in listed(cli)}
    gemma = by_ref["ollama:gemma3:270m"]
    smol = by_ref["ollama:smollm2:135m"]
    assert (gemma["kind"], gemma["architecture"], gemma["quantization"]) == ("base", "gemma3", "Q4_K_M")
    assert (smol["kind"], smol["architecture"], smol["quantization"]) == ("instruct", "llama", "Q4_1")
    assert gemma["has_chat_template"] is False and smol["has_chat_template"] is True
    assert gemma["file_size_bytes"] == gemma_path.stat().st_size
    assert gemma["trained_context"] == 32768 and smol["trained_context"] == 8192
    assert gemma["size_label"] == "270M" and smol["size_label"] == "135M"
    assert smol["reasoning"] is False
    # Both are small: the estimate at the default context fits this machine's RAM.
    assert smol["fits"] in ("RAM", "VRAM") and smol["total_bytes"] > smol["file_size_bytes"] * 0.9
    # The same bytes under another store's name are the same kind.
    assert by_ref["hf:unsloth/gemma-3-270m-GGUF:Q4_K_M"]["kind"] == "base"
    assert by_ref["hf:HuggingFaceTB/SmolLM2-135M-Instruct-GGUF:Q4_1"]["kind"] == "instruct"


def test_the_split_model_counts_all_its_parts(stores, cli, smollm2_path):
    split = next(e for e in listed(cli) if e["source"] == "model_dirs" and e["runnable"])
    assert split["parts"] == 2
    assert split["file_size_bytes"] == 2 * smollm2_path.stat().st_size


def test_the_table_names_sources_and_kinds(stores, cli):
    result = cli("models", "list", env={"COLUMNS": "250"})
    assert result.returncode == 0, result.stderr
    assert "6 runnable models" in result.stdout
    for text in (
        "ollama:gemma3:270m",
        "lmstudio",
        "hf:unsloth/gemma-3-270m-GGUF",
        "base",
        "instruct",
        "Not loadable (1)",
    ):
        assert text in result.stdout


def test_headers_are_read_once_then_cached_by_path_size_and_mtime(stores, cli):
    from llmchat import paths

    first = {e["ref"]: e for e in listed(cli)}
    cache_file = paths.cache_dir() / "models-catalogue.json"
    data = json.loads(cache_file.read_text())
    assert set(data["entries"]) == {e["real_path"] for e in first.values()}
    # A second list takes the summary from the cache, not from the file: mark one cached entry.
    gemma_blob = first["ollama:gemma3:270m"]["real_path"]
    data["entries"][gemma_blob]["summary"]["name"] = "read from the cache"
    cache_file.write_text(json.dumps(data))
    assert {e["ref"]: e for e in listed(cli)}["ollama:gemma3:270m"]["name"] == "read from the cache"
    # A changed file (new size and mtime) is read again: the cache never hides a change.
    cut = stores.model_dir / "cut.gguf"
    cut.write_bytes(b"GGUF")
    second = {e["ref"]: e for e in listed(cli)}
    assert "truncated" in first[str(cut)]["problem"]
    assert second[str(cut)]["problem"] != first[str(cut)]["problem"]
    assert json.loads(cache_file.read_text())["entries"][os.path.realpath(cut)]["stamp"][0] == 4


def test_nothing_in_the_stores_is_written_by_listing(stores, cli):
    before = sorted((str(p), p.lstat().st_mtime_ns) for p in stores.root.rglob("*") if "llmchat-home" not in p.parts)
    listed(cli)
    after = sorted((str(p), p.lstat().st_mtime_ns) for p in stores.root.rglob("*") if "llmchat-home" not in p.parts)
    assert before == after


def test_an_empty_machine_lists_nothing_and_says_how_to_get_a_model(tmp_path, monkeypatch, cli):
    for name in STORE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    result = cli("models", "list")
    assert result.returncode == 0
    assert result.stdout == ""
    assert "llmchat models pull" in result.stderr


def test_ollamas_private_variants_are_listed_as_not_loadable_with_the_reason(stores, cli, tmp_path):
    renamed = write_tiny_gguf(tmp_path / "renamed.gguf", name="gpt-oss", template=None, arch="gptoss")
    fused = write_tiny_gguf(
        tmp_path / "fused.gguf",
        name="Gemma 3 4b",
        template="{{ messages }}",
        arch="gemma3",
        extra_tensors=("v.blk.0.attn_q.weight", "mm.input_projection.weight"),
    )
    add_ollama_model(stores.ollama, "gpt-oss", "20b", [ollama_gguf_layer(stores.ollama, renamed, "d" * 64)])
    add_ollama_model(stores.ollama, "gemma3", "4b", [ollama_gguf_layer(stores.ollama, fused, "e" * 64)])
    by_ref = {e["ref"]: e for e in listed(cli)}
    assert by_ref["ollama:gpt-oss:20b"]["runnable"] is False
    assert by_ref["ollama:gpt-oss:20b"]["problem"].startswith("not loadable by llama.cpp: ")
    assert "'gptoss'" in by_ref["ollama:gpt-oss:20b"]["problem"]
    assert by_ref["ollama:gemma3:4b"]["runnable"] is False
    assert "vision tower fused in (2 tensors such as v.blk.0.attn_q.weight)" in by_ref["ollama:gemma3:4b"]["problem"]
    # `-m` refuses them with the same reason (exit 3), before llama.cpp sees them.
    refused = cli("info", "-m", "ollama:gemma3:4b")
    assert refused.returncode == 3 and refused.stderr.count("\n") == 1
