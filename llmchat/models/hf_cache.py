"""The Hugging Face hub cache as a model store (`models--ORG--NAME/{blobs,snapshots,refs}`), which
llama.cpp's `-hf`, `Llama.from_pretrained` and `huggingface-cli` fill, and llama.cpp's old flat
cache in the same folders: where the cache folders are, where `models pull` writes, and each
cached repo's model files (the snapshot `refs/main` names first), read-only.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from llmchat.models.candidates import (
    Candidate,
    children,
    is_folder,
    is_model_file_name,
    model_stem,
    short_refs,
    split_parts,
    walk_gguf,
)
from llmchat.models.quant import quant_from_name


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
        if key not in seen and is_folder(folder):
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
    if not is_folder(snapshots):
        return []
    main = None
    try:
        main = (repo_folder / "refs" / "main").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        pass
    folders = sorted(children(snapshots, dirs=True), key=lambda p: (p.name != main, p.name))
    return folders


def _hf_repo_candidates(cache: Path, repo_folder: Path, repo: str) -> Iterator[Candidate]:
    yield from short_refs("hf", repo, list(_hf_repo_files(cache, repo_folder, repo)), "file")


def _hf_repo_files(cache: Path, repo_folder: Path, repo: str) -> Iterator[Candidate]:
    seen_blobs: set[str] = set()
    seen_names: set[str] = set()
    for snapshot in _hf_snapshots(repo_folder):
        for path in walk_gguf(snapshot):
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
                names=(repo, name, model_stem(path.name)),
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
            if repo is not None and is_folder(entry):
                yield from _hf_repo_candidates(cache, entry, repo)
            elif entry.is_file() and is_model_file_name(entry.name):
                # llama.cpp's cache before it moved to the HF layout (PR #20775): flat files.
                yield Candidate(
                    path=entry,
                    source="llama.cpp",
                    ref=str(entry),
                    names=(model_stem(entry.name),),
                    parts=split_parts(entry),
                    quant_hint=quant_from_name(entry.name),
                    extra={"root": str(cache)},
                )


def hf_repo_files(repo: str) -> list[Candidate]:
    """The cached model files of one repo, across every cache folder."""
    found: list[Candidate] = []
    for cache in hf_cache_dirs():
        folder = hf_repo_folder(cache, repo)
        if is_folder(folder):
            found.extend(_hf_repo_candidates(cache, folder, repo))
    return found
