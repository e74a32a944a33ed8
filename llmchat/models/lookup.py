"""Store names for `-m`: `ollama:NAME[:TAG]`, `hf:ORG/REPO[:QUANT|/FILE.gguf]`, `lmstudio:PUB/REPO[...]`,
and a bare name that only one file on the machine answers to.

Only local files are ever returned: `hf:` names what the HF cache already holds. Nothing here
downloads; a missing `hf:` model gets the `models pull` command to run in its error message.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from llmchat.errors import ModelError, UsageError
from llmchat.models import quant
from llmchat.models.candidates import Candidate
from llmchat.models.hf_cache import hf_repo_files
from llmchat.models.lmstudio_store import lmstudio_candidates
from llmchat.models.ollama_store import OLLAMA_DEFAULT_HOST, OLLAMA_DEFAULT_NAMESPACE, ollama_candidates, ollama_name
from llmchat.models.stores import all_candidates

if TYPE_CHECKING:
    from llmchat.config import Config

STORE_PREFIXES = ("ollama:", "hf:", "lmstudio:")
AMBIGUOUS_SHOWN = 8


def is_store_ref(requested: str) -> bool:
    return requested.startswith(STORE_PREFIXES)


def find_in_store(requested: str, config: Config | None = None) -> Candidate:
    """The file a store name means. ModelError when nothing matches (exit 3)."""
    prefix, _, rest = requested.partition(":")
    if not rest:
        raise UsageError(f"model name {requested!r} names no model after '{prefix}:'; e.g. {_EXAMPLES[prefix]}")
    if prefix == "ollama":
        return _ollama(rest)
    if prefix == "hf":
        return _hf(rest)
    return _lmstudio(rest)


_EXAMPLES = {
    "ollama": "ollama:qwen3:4b",
    "hf": "hf:Qwen/Qwen3-4B-GGUF:Q4_K_M",
    "lmstudio": "lmstudio:lmstudio-community/Qwen3-4B-GGUF",
}


def parse_ollama(rest: str) -> str:
    """`gemma3` -> `gemma3:latest`; `user/m:t`, `host/ns/m:t` as `ollama list` names them."""
    path, _, tag = rest.rpartition(":") if ":" in rest.rsplit("/", 1)[-1] else (rest, "", "latest")
    parts = path.split("/")
    if len(parts) == 1:
        host, namespace, model = OLLAMA_DEFAULT_HOST, OLLAMA_DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 2:
        host, namespace, model = OLLAMA_DEFAULT_HOST, parts[0], parts[1]
    else:
        host, namespace, model = parts[0], "/".join(parts[1:-1]), parts[-1]
    return ollama_name(host, namespace, model, tag or "latest")


def _ollama(rest: str) -> Candidate:
    wanted = parse_ollama(rest)
    found = [c for c in ollama_candidates() if c.ref.lower() == f"ollama:{wanted}".lower()]
    if not found:
        raise ModelError(f"no Ollama model {wanted!r} on this machine; `llmchat models list` shows what is there")
    candidate = found[0]
    if candidate.problem:
        raise ModelError(f"Ollama model {wanted!r}: {candidate.problem}; pull it again with ollama")
    # Ollama's own variants (a fused vision tower) pass the header checks but not llama.cpp's loader.
    from llmchat.gguf.machine import SystemMemory
    from llmchat.models.catalogue import entry_for

    problem = entry_for(candidate, memory=SystemMemory(None, None)).problem
    if problem is not None and problem.startswith("not loadable by llama.cpp"):
        raise ModelError(f"Ollama model {wanted!r} is {problem}")
    return candidate


def _split_repo(rest: str) -> tuple[str, str | None, str | None]:
    """`ORG/REPO[:QUANT]` or `ORG/REPO/FILE.gguf` -> (repo, quant, file)."""
    head, _, tag = rest.partition(":")
    parts = head.split("/")
    if len(parts) < 2 or not parts[0] or not parts[1]:
        raise UsageError(f"model name {rest!r} is not ORG/REPO[:QUANT] or ORG/REPO/FILE.gguf")
    repo = "/".join(parts[:2])
    file = "/".join(parts[2:]) or None
    return repo, (tag or None), file


def choose(repo: str, files: dict[str, Candidate], quant_tag: str | None, file: str | None, how: str) -> Candidate:
    """Pick among one repository's local files (`files`: path inside the repo -> candidate)."""
    names = list(files)
    chosen = quant.find_file(names, file) if file else quant.pick_file(names, quant_tag)
    if chosen is not None:
        return files[chosen]
    if file:
        what = f"file {file!r}"
    elif quant_tag:
        what = f"a {quant_tag} file"
    else:
        what = "a model file"
    have = ", ".join(quant.quant_choices(names)) or "no model file"
    raise ModelError(
        f"{how} has no {what} for {repo} on this machine (it has: {have})" + _pull_hint(how, repo, quant_tag, file)
    )


def _pull_hint(how: str, repo: str, quant_tag: str | None, file: str | None) -> str:
    if how != "the HF cache":
        return ""
    spec = f"hf:{repo}" + (f"/{file}" if file else f":{quant_tag}" if quant_tag else "")
    return f"; download it with: llmchat models pull {spec}"


def _hf(rest: str) -> Candidate:
    repo, quant_tag, file = _split_repo(rest)
    files = {c.extra["file"]: c for c in hf_repo_files(repo)}
    if not files:
        spec = f"hf:{rest}"
        raise ModelError(f"{repo} is not in the HF cache; download it with: llmchat models pull {spec}")
    return choose(repo, files, quant_tag, file, "the HF cache")


def _lmstudio(rest: str) -> Candidate:
    repo, quant_tag, file = _split_repo(rest)
    files = {c.extra["file"]: c for c in lmstudio_candidates() if c.extra.get("repo", "").lower() == repo.lower()}
    if not files:
        raise ModelError(f"no LM Studio model {repo!r} on this machine; `llmchat models list` shows what is there")
    return choose(repo, files, quant_tag, file, "LM Studio")


# ---------------------------------------------------------------------------------------------
# Bare names


def find_bare(name: str, config: Config | None = None) -> Candidate | None:
    """The one runnable-looking file every store agrees `name` means, or None; UsageError (exit 2)
    listing the candidates when several different files answer to it."""
    everything = [c for c in all_candidates(config) if c.problem is None]
    lower = name.lower()

    def answers(c: Candidate) -> bool:
        return lower in (n.lower() for n in c.names) or lower == c.ref.lower().partition(":")[2]

    matches = [c for c in everything if answers(c)]
    if not matches:
        matches = [c for c in everything if any(n.lower().startswith(lower) for n in c.names)]
    if not matches:
        return None
    distinct = list({os.path.realpath(c.path): c for c in matches}.values())
    if len(distinct) == 1:
        return distinct[0]
    # Several quantizations of one repository: pick as `-hf` would (Q4_K_M, then Q8_0).
    repos = {(c.source, c.extra.get("repo")) for c in distinct}
    if len(repos) == 1 and None not in {r for _, r in repos}:
        by_file = {c.path.name: c for c in distinct}
        chosen = quant.pick_file(list(by_file), None)
        if chosen is not None and any(t.lower() in chosen.lower() for t in quant.DEFAULT_TAGS):
            return by_file[chosen]
    shown = ", ".join(c.ref for c in distinct[:AMBIGUOUS_SHOWN])
    more = f" and {len(distinct) - AMBIGUOUS_SHOWN} more" if len(distinct) > AMBIGUOUS_SHOWN else ""
    raise UsageError(
        f"model name {name!r} matches {len(distinct)} models: {shown}{more}; pass one of these names to -m"
    )
