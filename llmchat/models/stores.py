"""Where GGUF files already sit on this machine: one function per store, each yielding candidates.

Stores, all read-only here (nothing is created, moved or deleted by listing):
- llmchat's own models folder, and the folders the config names in `model_dirs`;
- the Hugging Face hub cache (`models--ORG--NAME/{blobs,snapshots,refs}`), which llama.cpp's
  `-hf`, `Llama.from_pretrained` and `huggingface-cli` fill; llama.cpp's old flat cache too;
- LM Studio (`~/.lmstudio/models/PUBLISHER/REPO/*.gguf`, exactly two levels deep);
- Ollama, read through its manifests: the layer of type `application/vnd.ollama.image.model` is a
  plain GGUF blob. Cloud entries (a `remote_host` in the config blob, no weights) and safetensors
  entries (no model layer) are skipped.

Only file names and small JSON manifests are read here; GGUF headers are read by the catalogue.
Split models are listed by their first part (llama.cpp loads the rest from it); `mmproj` and
`imatrix` files are not models and are skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from llmchat import paths
from llmchat.models.quant import SPLIT_RE, pick_file, quant_from_name

if TYPE_CHECKING:
    from llmchat.config import Config

SOURCES = ("llmchat", "model_dirs", "hf", "llama.cpp", "lmstudio", "ollama")
# Which tool owns the files of each source: `models rm` deletes only the first three.
OWNERS = {
    "llmchat": "llmchat",
    "hf": "the Hugging Face cache",
    "llama.cpp": "llama.cpp's cache",
    "model_dirs": "you (a folder named in the config's model_dirs)",
    "lmstudio": "LM Studio",
    "ollama": "Ollama",
}

OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_DEFAULT_HOST = "registry.ollama.ai"
OLLAMA_DEFAULT_NAMESPACE = "library"
MANIFEST_MAX_BYTES = 1 << 20  # a manifest is a few hundred bytes; anything huge is not one
WALK_MAX_DEPTH = 4  # model folders are shallow; a deep tree is someone's home folder

NOT_MODEL_WORDS = ("mmproj", "imatrix")


def _is_dir(path: Path) -> bool:
    """is_dir that says no, rather than raising, for a folder this user may not enter (another
    user's store, e.g. /usr/share/ollama)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _children(folder: Path, *, dirs: bool) -> list[Path]:
    """Sorted sub-folders (or files) of `folder`; none where it cannot be read."""
    try:
        return sorted(p for p in folder.iterdir() if (_is_dir(p) if dirs else p.is_file()))
    except OSError:
        return []


@dataclass(frozen=True)
class Candidate:
    """A file some store holds, before its header is read."""

    path: Path  # the file to load: the first part of a split model; for HF a snapshot symlink
    source: str  # one of SOURCES
    ref: str  # what `-m` takes to mean exactly this file
    names: tuple[str, ...]  # the bare names it answers to (matched case-insensitively)
    parts: tuple[Path, ...] = ()  # the other parts of a split model
    problem: str | None = None  # known not runnable before reading it (e.g. its blob is missing)
    quant_hint: str | None = None  # the quantization the file name gives (Q4_K_M), for `hf:REPO:QUANT`
    extra: dict[str, str] = field(default_factory=dict)  # per-store facts: repo, tag, store root


def is_model_file_name(name: str) -> bool:
    """A .gguf that is a model's (first) file: not a projector, not an imatrix, not a later split part."""
    lower = name.lower()
    if not lower.endswith(".gguf") or any(word in lower for word in NOT_MODEL_WORDS):
        return False
    split = SPLIT_RE.search(name)
    return split is None or int(split.group(1)) == 1


def split_parts(first: Path) -> tuple[Path, ...]:
    """The other parts of a split model, named like llama.cpp's gguf-split writes them."""
    split = SPLIT_RE.search(first.name)
    if split is None:
        return ()
    count = int(split.group(2))
    stem = first.name[: split.start()]
    return tuple(first.with_name(f"{stem}-{i:05d}-of-{count:05d}.gguf") for i in range(2, count + 1))


def _stem(name: str) -> str:
    stem = SPLIT_RE.sub(".gguf", name)
    return stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem


# ---------------------------------------------------------------------------------------------
# Plain folders: llmchat's models folder and the config's model_dirs


def _walk_gguf(root: Path, max_depth: int = WALK_MAX_DEPTH) -> Iterator[Path]:
    """Model files under `root`, sorted, without following symlinked folders (no loops)."""
    root_depth = len(root.parts)
    for folder, dirs, files in os.walk(root, onerror=lambda err: None):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if len(here.parts) - root_depth < max_depth else []
        for name in sorted(files):
            if is_model_file_name(name):
                candidate = here / name
                if candidate.is_file():
                    yield candidate


def _folder_candidates(root: Path, source: str) -> Iterator[Candidate]:
    for path in _walk_gguf(root):
        stem = _stem(path.name)
        relative = path.relative_to(root)
        names = (stem, str(relative.with_suffix(""))) if len(relative.parts) > 1 else (stem,)
        yield Candidate(
            path=path,
            source=source,
            ref=str(path),
            names=names,
            parts=split_parts(path),
            quant_hint=quant_from_name(path.name),
            extra={"root": str(root)},
        )


def llmchat_candidates() -> Iterator[Candidate]:
    folder = paths.models_dir()
    if _is_dir(folder):
        yield from _folder_candidates(folder, "llmchat")


def model_dirs_candidates(config: Config | None) -> Iterator[Candidate]:
    for entry in getattr(config, "model_dirs", None) or ():
        folder = Path(entry).expanduser()
        if _is_dir(folder):
            yield from _folder_candidates(folder, "model_dirs")


# ---------------------------------------------------------------------------------------------
# The Hugging Face hub cache


def hf_cache_dirs() -> list[Path]:
    """Every HF-style cache folder that exists, in llama.cpp's order of precedence (common/hf-cache.cpp):
    LLAMA_CACHE > HF_HUB_CACHE > HUGGINGFACE_HUB_CACHE > HF_HOME/hub > XDG_CACHE_HOME/huggingface/hub
    > ~/.cache/huggingface/hub. All are listed, not only the first: tools disagree on the order."""
    env = os.environ
    found: list[Path] = []
    options = [
        env.get("LLAMA_CACHE"),
        env.get("HF_HUB_CACHE"),
        env.get("HUGGINGFACE_HUB_CACHE"),
        str(Path(env["HF_HOME"]) / "hub") if env.get("HF_HOME") else None,
        str(Path(env["XDG_CACHE_HOME"]) / "huggingface" / "hub") if env.get("XDG_CACHE_HOME") else None,
        str(Path.home() / ".cache" / "huggingface" / "hub"),
    ]
    seen: set[str] = set()
    for option in options:
        if not option:
            continue
        folder = Path(option).expanduser()
        key = os.path.realpath(folder)
        if key not in seen and _is_dir(folder):
            seen.add(key)
            found.append(folder)
    return found


def hf_download_dir() -> Path:
    """Where `models pull` writes: the folder huggingface_hub itself would use (HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub), so llama.cpp and others see the file too."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def hf_repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def _hf_repo_id(folder_name: str) -> str | None:
    if not folder_name.startswith("models--"):
        return None
    owner, sep, name = folder_name[len("models--") :].partition("--")
    return f"{owner}/{name}" if sep and owner and name else None


def _hf_snapshots(repo_folder: Path) -> list[Path]:
    """Snapshots, the one `refs/main` points at first: its files win when two commits hold the same name."""
    snapshots = repo_folder / "snapshots"
    if not _is_dir(snapshots):
        return []
    main = None
    try:
        main = (repo_folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pass
    folders = sorted(_children(snapshots, dirs=True), key=lambda p: (p.name != main, p.name))
    return folders


def short_refs(prefix: str, repo: str, files: list[Candidate], key: str) -> list[Candidate]:
    """`hf:ORG/REPO:Q4_K_M` instead of the full file name, wherever that name picks this very file
    (the way `-m` will pick it); the full `hf:ORG/REPO/FILE.gguf` stays valid too."""
    names = [c.extra[key] for c in files]
    shortened: list[Candidate] = []
    for c in files:
        quant = c.quant_hint
        if quant and pick_file(names, quant) == c.extra[key]:
            c = replace(c, ref=f"{prefix}:{repo}:{quant}", names=(*c.names, c.ref.partition(":")[2]))
        shortened.append(c)
    return shortened


def _hf_repo_candidates(cache: Path, repo_folder: Path, repo: str) -> Iterator[Candidate]:
    yield from short_refs("hf", repo, list(_hf_repo_files(cache, repo_folder, repo)), "file")


def _hf_repo_files(cache: Path, repo_folder: Path, repo: str) -> Iterator[Candidate]:
    seen_blobs: set[str] = set()
    seen_names: set[str] = set()
    for snapshot in _hf_snapshots(repo_folder):
        for path in _walk_gguf(snapshot):
            relative = path.relative_to(snapshot).as_posix()
            blob = os.path.realpath(path)
            if blob in seen_blobs or relative in seen_names:
                continue  # the same file in an older snapshot
            seen_blobs.add(blob)
            seen_names.add(relative)
            name = repo.split("/", 1)[1]
            yield Candidate(
                path=path,
                source="hf",
                ref=f"hf:{repo}/{relative}",
                names=(repo, name, _stem(path.name)),
                parts=split_parts(path),
                quant_hint=quant_from_name(path.name),
                extra={"repo": repo, "file": relative, "root": str(cache), "snapshot": snapshot.name},
            )


def hf_candidates() -> Iterator[Candidate]:
    for cache in hf_cache_dirs():
        try:
            entries = sorted(cache.iterdir())
        except OSError:
            continue
        for entry in entries:
            repo = _hf_repo_id(entry.name)
            if repo is not None and _is_dir(entry):
                yield from _hf_repo_candidates(cache, entry, repo)
            elif entry.is_file() and is_model_file_name(entry.name):
                # llama.cpp's cache before it moved to the HF layout (PR #20775): flat files.
                yield Candidate(
                    path=entry,
                    source="llama.cpp",
                    ref=str(entry),
                    names=(_stem(entry.name),),
                    parts=split_parts(entry),
                    quant_hint=quant_from_name(entry.name),
                    extra={"root": str(cache)},
                )


def hf_repo_files(repo: str) -> list[Candidate]:
    """The cached model files of one repo, across every cache folder."""
    found: list[Candidate] = []
    for cache in hf_cache_dirs():
        folder = hf_repo_folder(cache, repo)
        if _is_dir(folder):
            found.extend(_hf_repo_candidates(cache, folder, repo))
    return found


# ---------------------------------------------------------------------------------------------
# LM Studio


def lmstudio_dirs() -> list[Path]:
    home = Path.home()
    options = [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]
    # A moved models folder is recorded in LM Studio's settings (key name from third-party code).
    try:
        settings = json.loads((home / ".lmstudio" / "settings.json").read_text(encoding="utf-8"))
        moved = settings.get("downloadsFolder") if isinstance(settings, dict) else None
        if isinstance(moved, str) and moved:
            options.insert(0, Path(moved).expanduser())
    except (OSError, ValueError):
        pass
    found: list[Path] = []
    seen: set[str] = set()
    for folder in options:
        key = os.path.realpath(folder)
        if key not in seen and _is_dir(folder):
            seen.add(key)
            found.append(folder)
    return found


def lmstudio_candidates() -> Iterator[Candidate]:
    by_repo: dict[str, list[Candidate]] = {}
    for candidate in _lmstudio_files():
        by_repo.setdefault(candidate.extra["repo"], []).append(candidate)
    for repo, files in by_repo.items():
        yield from short_refs("lmstudio", repo, files, "file")


def _lmstudio_files() -> Iterator[Candidate]:
    for root in lmstudio_dirs():
        # PUBLISHER/REPO/file.gguf: LM Studio ignores files at any other depth.
        for path in _walk_gguf(root, max_depth=2):
            relative = path.relative_to(root)
            if len(relative.parts) != 3:
                continue
            publisher, repo, file_name = relative.parts
            yield Candidate(
                path=path,
                source="lmstudio",
                ref=f"lmstudio:{publisher}/{repo}/{file_name}",
                names=(f"{publisher}/{repo}", repo, _stem(file_name)),
                parts=split_parts(path),
                quant_hint=quant_from_name(file_name),
                extra={"repo": f"{publisher}/{repo}", "file": file_name, "root": str(root)},
            )


# ---------------------------------------------------------------------------------------------
# Ollama


def ollama_dirs() -> list[Path]:
    options = []
    if os.environ.get("OLLAMA_MODELS"):
        options.append(Path(os.environ["OLLAMA_MODELS"]).expanduser())
    options += [Path.home() / ".ollama" / "models", Path("/usr/share/ollama/.ollama/models")]
    found: list[Path] = []
    seen: set[str] = set()
    for folder in options:
        key = os.path.realpath(folder)
        if key not in seen and _is_dir(folder / "manifests"):
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
        for host_dir in _children(manifests, dirs=True):
            for ns_dir in _children(host_dir, dirs=True):
                for model_dir in _children(ns_dir, dirs=True):
                    for tag_file in _children(model_dir, dirs=False):
                        entry = _ollama_entry(root, tag_file, host_dir.name, ns_dir.name, model_dir.name, tag_file.name)
                        if entry is not None:
                            yield entry


# ---------------------------------------------------------------------------------------------
# All of them


def all_candidates(config: Config | None = None, sources: tuple[str, ...] = SOURCES) -> list[Candidate]:
    """Every store's candidates, in SOURCES order; a file reached twice by the same store once."""
    producers = {
        "llmchat": llmchat_candidates,
        "model_dirs": lambda: model_dirs_candidates(config),
        "hf": hf_candidates,
        "lmstudio": lmstudio_candidates,
        "ollama": ollama_candidates,
    }
    found: list[Candidate] = []
    seen: set[tuple[str, str]] = set()
    for source, produce in producers.items():
        if source not in sources and not (source == "hf" and "llama.cpp" in sources):
            continue
        for candidate in produce():
            if candidate.source not in sources:
                continue
            key = (candidate.source, os.path.realpath(candidate.path))
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    return found
