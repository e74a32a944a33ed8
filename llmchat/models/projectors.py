"""The multimodal projector (mmproj) files a model store keeps with a model, by the model's path.

Read-only, and only names and small manifests (the projector's header is checked by
llmchat.media.projector):
- Ollama: the model's manifest (the one whose `application/vnd.ollama.image.model` layer is this
  blob) may have an `application/vnd.ollama.image.projector` layer, a GGUF projector blob;
- the Hugging Face cache: an `mmproj*.gguf` anywhere in the model's snapshot, where a repo keeps
  its quantisations in sub-folders and the projector at the top (one beside the model is found as
  for any folder).
"""

from __future__ import annotations

import json
from pathlib import Path

from llmchat.models.ollama_store import MANIFEST_MAX_BYTES, OLLAMA_MODEL_LAYER

OLLAMA_PROJECTOR_LAYER = "application/vnd.ollama.image.projector"
_MANIFEST_DEPTH = 4  # manifests/<host>/<namespace>/<model>/<tag>


def store_projectors(model_path: Path) -> list[Path]:
    """Projector files the model's store keeps with it, the likeliest first; none outside a store."""
    return _ollama_projectors(model_path) + _hf_projectors(model_path)


def _ollama_projectors(model_path: Path) -> list[Path]:
    if model_path.parent.name != "blobs" or not model_path.name.startswith("sha256-"):
        return []
    root = model_path.parent.parent
    digest = model_path.name.replace("-", ":", 1)
    manifests = root / "manifests"
    if not manifests.is_dir():
        return []
    found: list[Path] = []
    for manifest in sorted(manifests.glob("/".join(["*"] * _MANIFEST_DEPTH))):
        layers = _layers(manifest)
        if not any(layer.get("mediaType") == OLLAMA_MODEL_LAYER and layer.get("digest") == digest for layer in layers):
            continue
        for layer in layers:
            if layer.get("mediaType") == OLLAMA_PROJECTOR_LAYER and isinstance(layer.get("digest"), str):
                blob = root / "blobs" / layer["digest"].replace(":", "-")
                if blob.is_file() and blob not in found:
                    found.append(blob)
    return found


def _layers(manifest: Path) -> list[dict]:
    try:
        if not manifest.is_file() or manifest.stat().st_size > MANIFEST_MAX_BYTES:
            return []
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    layers = data.get("layers") if isinstance(data, dict) else None
    return [layer for layer in layers if isinstance(layer, dict)] if isinstance(layers, list) else []


def _hf_projectors(model_path: Path) -> list[Path]:
    parts = model_path.parts
    if "snapshots" not in parts:
        return []
    at = len(parts) - 1 - parts[::-1].index("snapshots")  # the last: .../models--ORG--NAME/snapshots/COMMIT/...
    if at + 2 >= len(parts) or not parts[at - 1].startswith("models--"):
        return []
    snapshot = Path(*parts[: at + 2])
    beside = model_path.parent
    return [p for p in sorted(snapshot.rglob("mmproj*.gguf")) if p.parent != beside]
