"""Where GGUF files already sit on this machine: the stores, and every candidate they hold.

Stores, all read-only here (nothing is created, moved or deleted by listing):
- llmchat's own models folder, and the folders the config names in `model_dirs`;
- the Hugging Face hub cache (`models--ORG--NAME/{blobs,snapshots,refs}`), which llama.cpp's
  `-hf`, `Llama.from_pretrained` and `huggingface-cli` fill; llama.cpp's old flat cache too;
- LM Studio (`~/.lmstudio/models/PUBLISHER/REPO/*.gguf`, exactly two levels deep);
- Ollama, read through its manifests: the layer of type `application/vnd.ollama.image.model` is a
  plain GGUF blob. Cloud entries (a `remote_host` in the config blob, no weights) and safetensors
  entries (no model layer) are skipped.

Only file names and small JSON manifests are read here; GGUF headers are read by the catalogue.
Each store has its module (llmchat.models.folder_stores, hf_cache, lmstudio_store, ollama_store);
what they yield and the file rules they share are llmchat.models.candidates. This module names
the stores (SOURCES), who owns each one's files (OWNERS), and gathers them (all_candidates).
Split models are listed by their first part (llama.cpp loads the rest from it); `mmproj` and
`imatrix` files are not models and are skipped.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from llmchat.models.candidates import Candidate
from llmchat.models.folder_stores import llmchat_candidates, model_dirs_candidates
from llmchat.models.hf_cache import hf_candidates
from llmchat.models.lmstudio_store import lmstudio_candidates
from llmchat.models.ollama_store import ollama_candidates

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
