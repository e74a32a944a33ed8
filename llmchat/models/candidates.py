"""What a model store yields, and the file rules every store shares.

A Candidate is a file some store holds, before its header is read (llmchat.models.catalogue
reads it). Which .gguf is a model (not a projector, an imatrix or a later split part), a split
model's other parts, the bare name a file answers to, a walk of a folder that cannot loop, and
the short `PREFIX:REPO:QUANT` reference are the same for every store; the stores themselves live
one to a module (llmchat.models.stores lists them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from llmchat.models.quant import SPLIT_RE, pick_file

WALK_MAX_DEPTH = 4  # model folders are shallow; a deep tree is someone's home folder
NOT_MODEL_WORDS = ("mmproj", "imatrix")


def is_folder(path: Path) -> bool:
    """is_dir that says no, rather than raising, for a folder this user may not enter (another
    user's store, e.g. /usr/share/ollama)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def children(folder: Path, *, dirs: bool) -> list[Path]:
    """Sorted sub-folders (or files) of `folder`; none where it cannot be read."""
    try:
        return sorted(p for p in folder.iterdir() if (is_folder(p) if dirs else p.is_file()))
    except OSError:
        return []


@dataclass(frozen=True)
class Candidate:
    """A file some store holds, before its header is read."""

    path: Path  # the file to load: the first part of a split model; for HF a snapshot symlink
    source: str  # one of llmchat.models.stores.SOURCES
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


def model_stem(name: str) -> str:
    """The bare name a model file answers to: without `.gguf`, and a split model's by its first part's stem."""
    stem = SPLIT_RE.sub(".gguf", name)
    return stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem


def walk_gguf(root: Path, max_depth: int = WALK_MAX_DEPTH) -> Iterator[Path]:
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
