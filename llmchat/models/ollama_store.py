"""Ollama as a model store, read through its manifests (`manifests/HOST/NAMESPACE/MODEL/TAG`): the
layer of type `application/vnd.ollama.image.model` is a plain GGUF blob. Cloud entries (a
`remote_host` in the config blob, no weights) and safetensors entries (no model layer) are
skipped. Only small JSON manifests are read, never written.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from llmchat.models.candidates import Candidate, children, is_folder

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_DEFAULT_HOST = "registry.ollama.ai"
OLLAMA_DEFAULT_NAMESPACE = "library"
MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes; anything huge is not one


def ollama_dirs() -> list[Path]:
    options = []
    if os.environ.get("OLLAMA_MODELS"):
        options.append(Path(os.environ["OLLAMA_MODELS"]).expanduser())
    options += [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    found: list[Path] = []
    seen: set[str] = set()
    for folder in options:
        key = os.path.realpath(folder)
        if key not in seen and is_folder(folder / "manifests"):
            seen.add(key)
            found.append(folder)
    return found


def ollama_name(host: str, namespace: str, model: str, tag: str) -> str:
    """The name `ollama list` shows: `gemma3:270m`, `user/model:tag`, `host/ns/model:tag`."""
    if host == OLLAMA_DEFAULT_HOST:
        return f"{model}:{tag}" if namespace == OLLAMA_DEFAULT_NAMESPACE else f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _blob_path(root: Path, digest: str) -> Path:
    return root / "blobs" / digest.replace(":", "-")  # `sha256:<hex>` is stored as `sha256-<hex>`


def _read_json(path: Path) -> object:
    try:
        if path.stat().st_size > MANIFEST_MAX_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _ollama_entry(root: Path, manifest: Path, host: str, namespace: str, model: str, tag: str) -> Candidate | None:
    data = _read_json(manifest)
    if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
        return None
    config = data.get("config")
    if isinstance(config, dict) and isinstance(config.get("digest"), str):
        settings = _read_json(_blob_path(root, config["digest"]))
        if isinstance(settings, dict) and settings.get("remote_host"):
            return None  # a cloud model: no weights on this machine
    layer = next(
        (
            item
            for item in data["layers"]
            if isinstance(item, dict)
            and item.get("mediaType") == OLLAMA_MODEL_LAYER
            and isinstance(item.get("digest"), str)
        ),
        None,
    )
    if layer is None:
        return None  # safetensors and other non-GGUF entries
    name = ollama_name(host, namespace, model, tag)
    blob = _blob_path(root, layer["digest"])
    return Candidate(
        path=blob,
        source="ollama",
        ref=f"ollama:{name}",
        names=tuple(dict.fromkeys([name, f"{model}:{tag}", model])),  # `-m gemma3` finds its only tag
        problem=None if blob.is_file() else f"its model blob {blob.name} is missing from Ollama's store",
        extra={"tag": tag, "model": model, "root": str(root), "manifest": str(manifest)},
    )


def ollama_candidates() -> Iterator[Candidate]:
    for root in ollama_dirs():
        manifests = root / "manifests"
        # manifests/<host>/<namespace>/<model>/<tag>
        for host_dir in children(manifests, dirs=True):
            for ns_dir in children(host_dir, dirs=True):
                for model_dir in children(ns_dir, dirs=True):
                    for tag_file in children(model_dir, dirs=False):
                        entry = _ollama_entry(root, tag_file, host_dir.name, ns_dir.name, model_dir.name, tag_file.name)
                        if entry is not None:
                            yield entry
