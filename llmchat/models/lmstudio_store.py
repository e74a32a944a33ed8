"""LM Studio as a model store: its models folders (the default ones and a moved one its settings
name), each holding `PUBLISHER/REPO/*.gguf`, exactly two levels deep. Read-only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

from llmchat.models.candidates import Candidate, is_folder, model_stem, short_refs, split_parts, walk_gguf
from llmchat.models.quant import quant_from_name


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
        if key not in seen and is_folder(folder):
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
        for path in walk_gguf(root, max_depth=2):
            relative = path.relative_to(root)
            if len(relative.parts) != 3:
                continue
            publisher, repo, file_name = relative.parts
            yield Candidate(
                path=path,
                source="lmstudio",
                ref=f"lmstudio:{publisher}/{repo}/{file_name}",
                names=(f"{publisher}/{repo}", repo, model_stem(file_name)),
                parts=split_parts(path),
                quant_hint=quant_from_name(file_name),
                extra={"repo": f"{publisher}/{repo}", "file": file_name, "root": str(root)},
            )
