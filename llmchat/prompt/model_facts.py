"""What choosing and rendering a chat template needs to know about a model: `ModelFacts`, built
from GGUF metadata and the vocabulary in one place, so `template show` and `chat` choose from the
same facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Container, Mapping, Sequence

from llmchat.prompt.builtins import marker_tokens


@dataclass(frozen=True)
class ModelFacts:
    """What template resolution needs to know about a model (from its GGUF metadata)."""

    architecture: str = ""
    name: str = ""
    basename: str = ""
    chat_template: str | None = None  # tokenizer.chat_template
    named_templates: Mapping[str, str] = field(default_factory=dict)  # tokenizer.chat_template.<name>
    bos_token: str = ""
    eos_token: str = ""
    tokens: frozenset[str] = frozenset()  # marker tokens present in the vocabulary
    # True when `tokens` was checked against the whole vocabulary for every built-in's markers
    # (facts_from_metadata does that): a built-in whose markers are missing is then ruled out.
    vocab_known: bool = False

    def has_token(self, text: str) -> bool:
        return text in self.tokens


def _token_at(token_texts: Sequence[str], index: Any) -> str:
    if isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(token_texts):
        return token_texts[index]
    return ""


def facts_from_metadata(
    meta: Mapping[str, Any],
    vocabulary: Container[str] | None = None,
    *,
    bos_token: str | None = None,
    eos_token: str | None = None,
) -> ModelFacts:
    """ModelFacts from GGUF scalar metadata and, when given, the vocabulary.

    The one builder for both callers: `template show` passes the GGUF's token list (BOS and EOS
    are then looked up by id); a loaded model passes a view that asks its tokenizer, with its own
    BOS and EOS text. So `template show` and `chat` choose a template from the same facts.
    """

    def text(key: str) -> str:
        value = meta.get(key)
        return value if isinstance(value, str) else ""

    prefix = "tokenizer.chat_template."
    named = {
        key[len(prefix) :]: value for key, value in meta.items() if key.startswith(prefix) and isinstance(value, str)
    }
    tokens: frozenset[str] = frozenset()
    if vocabulary is not None:
        lookup = set(vocabulary) if isinstance(vocabulary, Sequence) else vocabulary
        tokens = frozenset(marker for marker in marker_tokens() if marker in lookup)
        if isinstance(vocabulary, Sequence):
            bos_token = (
                _token_at(vocabulary, meta.get("tokenizer.ggml.bos_token_id")) if bos_token is None else bos_token
            )
            eos_token = (
                _token_at(vocabulary, meta.get("tokenizer.ggml.eos_token_id")) if eos_token is None else eos_token
            )
    return ModelFacts(
        architecture=text("general.architecture"),
        name=text("general.name"),
        basename=text("general.basename"),
        chat_template=text("tokenizer.chat_template") or None,
        named_templates=named,
        bos_token=bos_token or "",
        eos_token=eos_token or "",
        tokens=tokens,
        vocab_known=vocabulary is not None,
    )


def facts_from_gguf(path: str | Path) -> ModelFacts:
    """ModelFacts of a GGUF file, read with llmchat's fast header reader (no llama.cpp), from the
    header cache when the file is the one read before."""
    from llmchat.errors import ModelError
    from llmchat.gguf.header_cache import cached_for_file, read_metadata_cached

    meta = read_metadata_cached(Path(path))

    def from_vocabulary() -> dict[str, Any]:
        """What the facts take from the whole vocabulary: which marker tokens it holds, BOS, EOS."""
        try:
            token_texts: Sequence[str] | None = meta.token_texts()
        except ModelError:
            token_texts = None
        facts = facts_from_metadata(meta.scalars, token_texts)
        return {
            "markers": list(marker_tokens()),
            "tokens": sorted(facts.tokens),
            "known": facts.vocab_known,
            "bos": facts.bos_token,
            "eos": facts.eos_token,
        }

    found = cached_for_file(Path(path), "vocabulary-facts", from_vocabulary)
    if found.get("markers") != list(marker_tokens()):  # the built-ins changed since: look again
        found = from_vocabulary()
    vocabulary = frozenset(found["tokens"]) if found["known"] else None
    return facts_from_metadata(meta.scalars, vocabulary, bos_token=found["bos"], eos_token=found["eos"])
