"""Which file of a repository `hf:ORG/REPO[:QUANT]` means, picked the way llama.cpp's `-hf` picks it.

From llama.cpp common/download.cpp (`find_best_model`): with a tag, the first model file whose path
matches `TAG[.-]` (case-insensitive); without one, Q4_K_M, then Q8_0, then the first model file.
Model files are .gguf files that are not mmproj/imatrix/draft sidecars; of a split model only the
first part counts. An explicit file name is matched case-insensitively.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
QUANT_RE = re.compile(
    r"(?:^|[-._])((?:IQ|Q|TQ)\d+(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?=[-.]|$)", re.IGNORECASE
)


def quant_from_name(name: str) -> str | None:
    """`Qwen3-4B-Q4_K_M.gguf` -> "Q4_K_M" (the last quantization-looking word of the name)."""
    stem = SPLIT_RE.sub(".gguf", name)
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    found = QUANT_RE.findall(stem)
    return found[-1].upper() if found else None


DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
SIDECAR_WORDS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")


def is_model_path(path: str) -> bool:
    if not path.lower().endswith(".gguf"):
        return False
    base = path.rsplit("/", 1)[-1].lower()
    if any(word in base for word in SIDECAR_WORDS):
        return False
    split = SPLIT_RE.search(path)
    return split is None or int(split.group(1)) == 1


def pick_file(files: Iterable[str], tag: str | None) -> str | None:
    """The file llama.cpp's `-hf REPO[:TAG]` would download, or None."""
    models = [f for f in files if is_model_path(f)]
    for wanted in [tag] if tag else list(DEFAULT_TAGS):
        pattern = re.compile(re.escape(wanted) + r"[.-]", re.IGNORECASE)
        for path in models:
            if pattern.search(path):
                return path
    if not tag and models:
        return models[0]
    return None


def find_file(files: Iterable[str], wanted: str) -> str | None:
    lower = wanted.lower()
    return next((f for f in files if f.lower() == lower), None)


def quant_choices(files: Iterable[str]) -> list[str]:
    """The quantizations a repository offers (from file names), for "choose one of" messages."""
    found = [quant_from_name(f.rsplit("/", 1)[-1]) or f for f in files if is_model_path(f)]
    return list(dict.fromkeys(found))


def split_all_parts(files: Iterable[str], first: str) -> list[str]:
    """`first` and, for a split model, its other parts in order (all must be downloaded)."""
    split = SPLIT_RE.search(first)
    if split is None:
        return [first]
    prefix, count = first[: split.start()], int(split.group(2))
    wanted = {f"{prefix}-{i:05d}-of-{count:05d}.gguf".lower(): i for i in range(1, count + 1)}
    found = sorted((f for f in files if f.lower() in wanted), key=lambda f: wanted[f.lower()])
    return found or [first]


def pick_projector(files: Iterable[str], model: str) -> str | None:
    """The repository's multimodal projector for `model`, as llama.cpp's `-hf` picks it
    (common/download.cpp `find_best_sibling`): an `mmproj` .gguf in the model's folder or one above
    it, the deepest, then the one whose bits are nearest the model's (F16 for a Q4 model, of F16
    and F32); None when there is none."""
    model_dir = model.rsplit("/", 1)[0] + "/" if "/" in model else ""

    def bits(path: str) -> int:
        found = re.search(r"(?:IQ|Q|TQ|BF|F)(\d+)", quant_from_name(path.rsplit("/", 1)[-1]) or "", re.IGNORECASE)
        return int(found.group(1)) if found else 0

    best: tuple[int, int] | None = None
    chosen = None
    for path in files:
        folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
        if not path.lower().endswith(".gguf") or "mmproj" not in path.rsplit("/", 1)[-1].lower():
            continue
        if not model_dir.startswith(folder):
            continue
        rank = (-folder.count("/"), abs(bits(path) - bits(model)))
        if best is None or rank < best:
            best, chosen = rank, path
    return chosen
