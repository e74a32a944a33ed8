"""Deleting a model file, for `models rm`: only from llmchat's models folder or the HF cache.

The HF cache keeps the bytes once in `blobs/<etag>` and points at them from every snapshot that
holds the file, so removing one file means: its snapshot links (in every snapshot), then the blob
once nothing points at it any more, then the repository folder when it holds no file at all.
Ollama's and LM Studio's stores are never written (the caller refuses before coming here).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmchat.models.candidates import Candidate


def remove_plain(candidate: Candidate) -> int:
    """A file (and its split parts) in llmchat's models folder. Returns the bytes freed."""
    freed = 0
    for path in (candidate.path, *candidate.parts):
        if path.exists():
            freed += path.stat().st_size
            path.unlink()
    return freed


def remove_from_hf_cache(candidate: Candidate) -> int:
    """One file (and its split parts) of a repository in the HF cache. Returns the bytes freed."""
    repo_folder = _repo_folder(candidate.path)
    freed = 0
    for pointer in (candidate.path, *candidate.parts):
        freed += _remove_pointer(repo_folder, pointer)
    blobs = repo_folder / "blobs"
    if not blobs.is_dir() or not any(p.is_file() for p in blobs.iterdir()):
        shutil.rmtree(repo_folder, ignore_errors=True)  # nothing left: refs and empty snapshots go too
    return freed


def _repo_folder(pointer: Path) -> Path:
    """`<cache>/models--ORG--NAME/snapshots/<commit>/.../file.gguf` -> `<cache>/models--ORG--NAME`."""
    for parent in pointer.parents:
        if parent.name == "snapshots":
            return parent.parent
    raise ValueError(f"{pointer} is not inside an HF cache snapshot")


def _remove_pointer(repo_folder: Path, pointer: Path) -> int:
    blob = Path(os.path.realpath(pointer))
    inside = blob.parent == repo_folder / "blobs"
    size = blob.stat().st_size if blob.exists() else 0
    relative = _relative_in_snapshot(pointer)
    # The same file name in other snapshots points at the same blob (or is a copy where symlinks failed).
    for snapshot in (repo_folder / "snapshots").glob("*"):
        link = snapshot / relative
        if link.is_symlink() or link.is_file():
            if link.is_symlink() and os.path.realpath(link) != str(blob):
                continue  # another version of the file: keep it
            link.unlink()
            _prune_empty(link.parent, snapshot.parent)
    if not inside:
        return size  # a copy in the snapshot (where symlinks fail): deleted above
    if blob.exists() and not _still_linked(repo_folder, blob):
        blob.unlink()
        return size
    return 0


def _relative_in_snapshot(pointer: Path) -> Path:
    parts = pointer.parts
    i = parts.index("snapshots")
    return Path(*parts[i + 2 :])


def _still_linked(repo_folder: Path, blob: Path) -> bool:
    for root, _dirs, files in os.walk(repo_folder / "snapshots"):
        for name in files:
            if os.path.realpath(Path(root) / name) == str(blob):
                return True
    return False


def _prune_empty(folder: Path, stop: Path) -> None:
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
