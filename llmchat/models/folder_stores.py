"""The plain-folder stores: llmchat's own models folder and the folders the config names in
`model_dirs`. Every model file under them (a shallow walk) is a candidate, named by its stem and,
below the top, by its path relative to the folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from llmchat import paths
from llmchat.models.candidates import Candidate, is_folder, model_stem, split_parts, walk_gguf
from llmchat.models.quant import quant_from_name

if TYPE_CHECKING:
    from llmchat.config import Config


def _folder_candidates(root: Path, source: str) -> Iterator[Candidate]:
    for path in walk_gguf(root):
        stem = model_stem(path.name)
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
    if is_folder(folder):
        yield from _folder_candidates(folder, "llmchat")


def model_dirs_candidates(config: Config | None) -> Iterator[Candidate]:
    for entry in getattr(config, "model_dirs", None) or ():
        folder = Path(entry).expanduser()
        if is_folder(folder):
            yield from _folder_candidates(folder, "model_dirs")
