"""The list of every GGUF the stores hold: what each is, whether llama.cpp can load it, whether it fits.

Each file's header is read once with `llmchat.gguf.reader` (headers only, never weights) and the
summary is cached in `<cache folder>/models-catalogue.json`, keyed by the file's real path, size
and mtime, so a second `models list` reads no header at all. Measured on this machine
(2 shared cores): SmolLM2's header takes 35 ms and Gemma 3's 110 ms (a 262k-token vocabulary to
walk); from the cache the whole list costs only the folder walks.

"Fits" reuses `info`'s memory estimate (`llmchat.gguf.model_report.estimate_context`) at the context
`ask`/`chat` would use by default: the trained context, at most 8192 (`llmchat.defaults`), or the config's `ctx`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat import paths
from llmchat.defaults import DEFAULT_MAX_CTX
from llmchat.errors import ModelError
from llmchat.models.candidates import Candidate
from llmchat.models.kind import ModelKind, TemplateFeatures, classify, template_features
from llmchat.models.stores import all_candidates
from llmchat.private_files import ensure_private_dir

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.gguf.machine import SystemMemory
    from llmchat.gguf.metadata import GGUFMetadata

CACHE_VERSION = 1
CACHE_FILE_NAME = "models-catalogue.json"
VISION_TENSOR_PREFIXES = ("v.", "mm.", "vision_", "vision.")


@dataclass(frozen=True)
class Summary:
    """What the header says, independent of which store the file is in (this is what is cached)."""

    architecture: str | None
    name: str | None
    size_label: str | None
    parameter_count: int | None
    quantization: str | None
    trained_context: int | None
    has_template: bool
    thinking_template: bool
    tools_template: bool
    finetune: Any
    basename: Any
    tags: Any
    n_ctx: int  # the context the memory estimate below is for
    total_bytes: int | None  # weights + KV cache + compute at n_ctx (first split part's weights only)
    problem: str | None  # why llama.cpp cannot load it; None when it can

    def to_cache(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Entry:
    candidate: Candidate
    summary: Summary
    file_size: int  # all split parts together
    kind: ModelKind
    fits: str  # "VRAM" | "RAM" | "no" | "?"
    media: dict[str, Any] | None = None  # its projector: {projector, vision, audio} (media_of)

    @property
    def runnable(self) -> bool:
        return self.summary.problem is None and self.candidate.problem is None

    @property
    def problem(self) -> str | None:
        return self.candidate.problem or self.summary.problem

    @property
    def shown_name(self) -> str:
        """The name `models list` shows, which -m and the chat's /model take: a file in llmchat's
        or the user's folders by its bare name, one in another tool's store by its store name."""
        if self.candidate.source in ("llmchat", "model_dirs", "llama.cpp"):
            return self.candidate.names[0]
        return self.candidate.ref

    def to_json(self) -> dict[str, Any]:
        s = self.summary
        return {
            "ref": self.candidate.ref,
            "source": self.candidate.source,
            "path": str(self.candidate.path),
            "real_path": os.path.realpath(self.candidate.path),
            "parts": len(self.candidate.parts) + 1,
            "runnable": self.runnable,
            "problem": self.problem,
            "name": s.name,
            "architecture": s.architecture,
            "size_label": s.size_label,
            "parameter_count": s.parameter_count,
            "quantization": s.quantization,
            "file_size_bytes": self.file_size,
            "trained_context": s.trained_context,
            "has_chat_template": s.has_template,
            **self.kind.to_json(),
            "reasoning": self.kind.kind == "reasoning",
            "n_ctx": s.n_ctx,
            "total_bytes": s.total_bytes,
            "fits": self.fits,
            "media": self.media,
        }


def default_ctx(trained: int | None, config: Config | None) -> int:
    configured = getattr(config, "ctx", None)
    return configured or min(trained or DEFAULT_MAX_CTX, DEFAULT_MAX_CTX)


def summarize(meta: GGUFMetadata, n_ctx: int | None, config: Config | None = None) -> Summary:
    """A header's summary; `problem` says why llama.cpp would refuse it (checked like `info` does)."""
    from llmchat.gguf.footprint import attention_layout
    from llmchat.gguf.loadable import check_loadable
    from llmchat.gguf.model_report import estimate_context, parameter_count, quantization

    problem = None
    try:
        check_loadable(meta)
    except ModelError as err:
        problem = _short(str(err), meta.path)
    if problem is None:
        problem = _private_variant(meta)
    arch = meta.architecture
    trained = meta.arch_get("context_length")
    trained = trained if isinstance(trained, int) and not isinstance(trained, bool) and trained > 0 else None
    ctx = n_ctx or default_ctx(trained, config)
    total = None
    if problem is None:
        from llmchat.gguf.machine import SystemMemory

        estimate = estimate_context(meta, attention_layout(meta), ctx, SystemMemory(None, None))
        total = estimate.total_bytes
    features = template_features(meta.get("tokenizer.chat_template"))
    return Summary(
        architecture=arch,
        name=_text(meta.get("general.name")),
        size_label=_text(meta.get("general.size_label")),
        parameter_count=parameter_count(meta) if meta.tensors else None,
        quantization=quantization(meta)[0] if meta.tensors else None,
        trained_context=trained,
        has_template=features.has_template,
        thinking_template=features.thinking,
        tools_template=features.tools,
        finetune=_jsonable(meta.get("general.finetune")),
        basename=_jsonable(meta.get("general.basename")),
        tags=_jsonable(meta.get("general.tags")),
        n_ctx=ctx,
        total_bytes=total,
        problem=problem,
    )


def _private_variant(meta: GGUFMetadata) -> str | None:
    """Ollama's own variants that llama.cpp refuses although the architecture is known: a vision
    tower fused into the text model's file (gemma3, llama4 vision; ggml-org/llama.cpp#12367)."""
    if meta.architecture == "clip":
        return None
    vision = [t.name for t in meta.tensors if t.name.startswith(VISION_TENSOR_PREFIXES)]
    if vision:
        return (
            f"not loadable by llama.cpp: the file has a vision tower fused in ({len(vision)} tensors such as "
            f"{vision[0]}), Ollama's own format; get a plain GGUF of this model"
        )
    return None


def _short(message: str, path: Path) -> str:
    """The reader's one-line error without the long path at its start (the list shows the path)."""
    text = message.replace(str(path), "the file").strip()
    if "llama.cpp does not know" in text:
        text = "not loadable by llama.cpp: " + text
    return text


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, list):
        return [v for v in value if isinstance(v, (str, int, float, bool))]
    return None


def _unreadable(message: str, path: Path, n_ctx: int) -> Summary:
    return Summary(
        None, None, None, None, None, None, False, False, False, None, None, None, n_ctx, None, _short(message, path)
    )


# ---------------------------------------------------------------------------------------------
# The cache


class SummaryCache:
    """Summaries by real path, valid while the file's size and mtime are unchanged."""

    def __init__(self, path: Path | None = None):
        self.path = path or paths.cache_dir() / CACHE_FILE_NAME
        self.entries: dict[str, dict[str, Any]] = {}
        self.dirty = False
        data = None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            pass  # no cache yet, or a damaged one: it is rebuilt
        if isinstance(data, dict) and data.get("version") == CACHE_VERSION and isinstance(data.get("entries"), dict):
            self.entries = data["entries"]

    def get(self, real: str, stamp: list[int], n_ctx: int | None) -> Summary | None:
        hit = self.entries.get(real)
        if not isinstance(hit, dict) or hit.get("stamp") != stamp:
            return None
        try:
            summary = Summary(**hit["summary"])
        except (TypeError, KeyError):
            return None
        if n_ctx is not None and summary.n_ctx != n_ctx and summary.problem is None:
            return None
        return summary

    def put(self, real: str, stamp: list[int], summary: Summary) -> None:
        self.entries[real] = {"stamp": stamp, "summary": summary.to_cache()}
        self.dirty = True

    def save(self, keep: set[str]) -> None:
        """Write the cache whole (temp file + rename), dropping files no store holds any more."""
        stale = set(self.entries) - keep
        if not self.dirty and not stale:
            return
        for real in stale:
            del self.entries[real]
        try:
            ensure_private_dir(self.path.parent)  # llmchat's cache folder: 0700 like the others
            temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            temp.write_text(json.dumps({"version": CACHE_VERSION, "entries": self.entries}), encoding="utf-8")
            os.replace(temp, self.path)
        except OSError:
            pass  # a read-only cache folder only costs speed next time


# ---------------------------------------------------------------------------------------------
# The list


def _stamp(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def summary_for(path: Path, cache: SummaryCache, config: Config | None, n_ctx: int | None = None) -> Summary:
    from llmchat.gguf.reader import read_metadata

    real = os.path.realpath(path)
    stamp = _stamp(path)
    fallback_ctx = n_ctx or default_ctx(None, config)
    if stamp is None:
        return _unreadable(f"cannot read {path}", path, fallback_ctx)
    want_ctx = n_ctx or getattr(config, "ctx", None)
    cached = cache.get(real, stamp, want_ctx)
    if cached is not None:
        return cached
    try:
        summary = summarize(read_metadata(path), want_ctx, config)
    except ModelError as err:
        summary = _unreadable(str(err), path, fallback_ctx)
    cache.put(real, stamp, summary)
    return summary


def fits_verdict(total: int | None, memory: SystemMemory) -> str:
    if total is None:
        return "?"
    if memory.vram_free_bytes is not None and total <= memory.vram_free_bytes:
        return "VRAM"
    if memory.ram_available_bytes is None:
        return "?"
    return "RAM" if total <= memory.ram_available_bytes else "no"


def _parts_size(candidate: Candidate) -> tuple[int, int]:
    """(size of the first file, size of the other split parts)."""
    first = _stamp(candidate.path)
    rest = sum((_stamp(p) or [0])[0] for p in candidate.parts)
    return (first[0] if first else 0), rest


def make_entry(candidate: Candidate, summary: Summary, memory: SystemMemory) -> Entry:
    first, rest = _parts_size(candidate)
    total = summary.total_bytes + rest if summary.total_bytes is not None else None
    kind = classify(
        finetune=summary.finetune,
        name=summary.name,
        basename=summary.basename,
        tags=summary.tags,
        other_names=[candidate.path.name, *candidate.names],
        features=TemplateFeatures(summary.has_template, summary.thinking_template, summary.tools_template),
    )
    media = media_of(candidate.path) if summary.problem is None and candidate.problem is None else None
    return Entry(candidate, summary, first + rest, kind, fits_verdict(total, memory), media)


def media_of(path: Path) -> dict[str, Any] | None:
    """The projector the model would use (llmchat.media.projector: beside it, or kept by its store),
    and whether it sees and hears; None without one. Headers are read only where a file is found."""
    from llmchat.models.projectors import store_projectors

    if not any(path.parent.glob("mmproj*.gguf")) and not store_projectors(path):
        return None
    from llmchat.errors import LlmchatError
    from llmchat.gguf.header_cache import read_metadata_cached
    from llmchat.media.projector import find_projector

    try:
        found = find_projector(None, path, read_metadata_cached(path))
    except LlmchatError:
        return None
    return None if found is None else {"projector": str(found.path), "vision": found.vision, "audio": found.audio}


def catalogue(config: Config | None = None, memory: SystemMemory | None = None) -> list[Entry]:
    """Every candidate of every store, with its summary (cached), kind and fits verdict."""
    from llmchat.gguf.machine import system_memory

    memory = system_memory() if memory is None else memory
    cache = SummaryCache()
    entries: list[Entry] = []
    keep: set[str] = set()
    for candidate in all_candidates(config):
        if candidate.problem is not None:
            summary = _unreadable(candidate.problem, candidate.path, default_ctx(None, config))
        else:
            summary = summary_for(candidate.path, cache, config)
            keep.add(os.path.realpath(candidate.path))
        entries.append(make_entry(candidate, summary, memory))
    cache.save(keep)
    return entries


def entry_for(candidate: Candidate, config: Config | None = None, memory: SystemMemory | None = None) -> Entry:
    """One candidate's entry (for `models show` and `models rm`), through the same cache."""
    from llmchat.gguf.machine import system_memory

    memory = system_memory() if memory is None else memory
    cache = SummaryCache()
    summary = (
        _unreadable(candidate.problem, candidate.path, default_ctx(None, config))
        if candidate.problem
        else summary_for(candidate.path, cache, config)
    )
    if cache.dirty:
        cache.save(set(cache.entries))
    return make_entry(candidate, summary, memory)
