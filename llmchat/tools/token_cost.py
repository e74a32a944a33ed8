"""What each tool costs in prompt tokens, as the model's own template renders it.

A tool's cost is the tokens it adds to the prompt: the template renders a small reference
conversation with a fixed probe tool, then with the probe and the tool, and the model's tokenizer
counts both (the difference is the tool's cost). The probe is there so that every tool is measured
inside a tool block that already exists: the block's fixed wrapper (a header, the instructions,
the <tools></tools> markup) is counted once, apart, as `wrapper`. So the prompt with all tools
minus the prompt without tools is `total + wrapper`, up to a token merged across two tools' joins.

`llmchat tools list` counts with a vocabulary-only load of the model (no weights, no context:
VocabTokenizer); the chat's /tools counts with the session's own engine and template.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmchat.tools.families import Family
from llmchat.tools.spec import EMPTY_OBJECT_SCHEMA, ToolSpec

if TYPE_CHECKING:
    from llmchat.engine.native import LoadedModel
    from llmchat.engine.prompt_pieces import PromptPiece
    from llmchat.prompt.model_facts import ModelFacts
    from llmchat.prompt.render import ResolvedTemplate
    from llmchat.tools.prompt import Capabilities

# The conversation every count renders: the tools' cost does not depend on what is said.
REFERENCE_CONVERSATION: tuple[dict[str, str], ...] = ({"role": "user", "content": "Hello"},)

# A fixed, small tool every measured tool joins, so that the tool block's wrapper is already there.
PROBE = ToolSpec("probe", "Probe.", EMPTY_OBJECT_SCHEMA, "llmchat", lambda arguments, timeout_s: "")

PromptCounter = Callable[[Sequence[ToolSpec]], int]  # the reference prompt's tokens with these tools


@dataclass(frozen=True)
class ToolCosts:
    """Each tool's tokens by name, the tool block's fixed wrapper, and what counted them."""

    tokens: dict[str, int]
    wrapper: int
    n_ctx: int
    counted_by: str  # "SmolLM2-135M-Instruct Q4_1's template (GGUF tokenizer.chat_template)"
    sources: dict[str, str] = field(default_factory=dict)  # tool name -> its source

    @property
    def total(self) -> int:
        return sum(self.tokens.values())

    def by_source(self) -> dict[str, int]:
        """The tokens of each source's tools (a server, a functions file, a config tool), in order."""
        totals: dict[str, int] = {}
        for name, tokens in self.tokens.items():
            source = self.sources.get(name, "")
            totals[source] = totals.get(source, 0) + tokens
        return totals

    def share(self, tokens: int) -> str:
        """`tokens` as a share of the context window: "2.4%"."""
        return f"{100 * tokens / self.n_ctx:.1f}%" if self.n_ctx > 0 else "?"


def measure(specs: Sequence[ToolSpec], count: PromptCounter, n_ctx: int, counted_by: str) -> ToolCosts:
    """Each tool's cost: the reference prompt with the probe and that tool, minus with the probe
    alone. The wrapper: what the first tool adds beyond its own cost (the probe's, measured as
    a second probe adds it)."""
    without = count([])
    with_probe = count([PROBE])
    probe_cost = count([PROBE, PROBE]) - with_probe
    tokens = {spec.name: count([PROBE, spec]) - with_probe for spec in specs}
    return ToolCosts(
        tokens, with_probe - without - probe_cost, n_ctx, counted_by, {spec.name: spec.source for spec in specs}
    )


def prompt_counter(
    prompt_tokens: Callable[[list[PromptPiece]], Any],
    template: ResolvedTemplate,
    facts: ModelFacts,
    family: Family,
    caps: Capabilities,
    variables: dict[str, Any] | None = None,
) -> PromptCounter:
    """The counter for this template and tokenizer: the tools shaped as a turn shapes them
    (llmchat.tools.prompt, as ToolOffer.shape does), rendered by render_prompt with its trusted
    and untrusted pieces, tokenized as the engine tokenizes a prompt. `prompt_tokens` returning no
    list (a server that takes messages): ValueError."""
    from llmchat.prompt.render import render_prompt
    from llmchat.tools.prompt import messages_for_template, template_variables

    def count(specs: Sequence[ToolSpec]) -> int:
        messages = messages_for_template(list(REFERENCE_CONVERSATION), family, specs, caps)
        tool_variables = {**(variables or {}), **template_variables(family, specs)}
        rendered = render_prompt(template, messages, facts, variables=tool_variables)
        ids = prompt_tokens([(piece.text, piece.trusted) for piece in rendered.pieces])
        if not isinstance(ids, list):
            raise ValueError("this engine takes messages, not tokens: the server renders the template")
        return len(ids)

    return count


class VocabTokenizer:
    """A model's tokenizer alone: a vocabulary-only load (no weights, no context), enough to count
    a prompt's tokens the way the engine does (llmchat.engine.prompt_pieces)."""

    def __init__(self, path: Path):
        from llmchat.engine import logs, native

        logs.install(False)  # llama.cpp's load lines never reach the listing
        self._model: LoadedModel | None = native.LoadedModel(
            path, n_ctx=0, max_ctx=0, n_batch=0, threads=1, gpu_layers=0, mmap=True, mlock=False,
            flash_attn=False, vocab_only=True,
        )  # fmt: skip
        from llmchat.engine.bindings import llama_cpp

        vocab = self.model.vocab
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        self.bos_id = int(llama_cpp.llama_vocab_bos(vocab))
        # A vocabulary-only load reads no hyperparameters: the trained context is the header's.
        metadata = self.model.metadata()
        trained = metadata.get(f"{metadata.get('general.architecture', '')}.context_length", "0")
        self.n_ctx_train = int(trained) if trained.isdigit() else 0

    @property
    def model(self) -> LoadedModel:
        if self._model is None:
            raise ValueError("the vocabulary is closed")
        return self._model

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        return self.model.tokenize(text.encode("utf-8", errors="replace"), add_bos=False, special=special)

    def is_control(self, token_id: int) -> bool:
        from llmchat.engine.bindings import llama_cpp

        attrs = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED
        return bool(llama_cpp.llama_vocab_get_attr(self.model.vocab, token_id) & attrs)

    def has_single_token(self, text: str) -> bool:
        ids = self.tokenize(text, special=True)
        return len(ids) == 1 and self.model.token_text(ids[0]) == text

    def prompt_tokens(self, pieces: Sequence[PromptPiece]) -> list[int]:
        from llmchat.engine.prompt_pieces import tokens_for_pieces

        return tokens_for_pieces(self, pieces)

    def close(self) -> None:
        model, self._model = self._model, None
        if model is not None:
            model.close()
