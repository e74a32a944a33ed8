"""The engine surface the rest of llmchat relies on, written down once.

Two kinds of engine stand behind it: `Engine` (llama.cpp in this process, llmchat.engine.core) and
the remote engines (llmchat.engine.remote: a llama.cpp server, or any OpenAI-compatible server).
`ChatSession` (llmchat.session), the chat UI and batch speak only to this surface, so a turn runs
the same road whichever engine answers it. Nothing here imports llama_cpp or httpx: both engines
are checked against these protocols by mypy without loading either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

    from llmchat.engine.reply import GenerationOutcome, Steering
    from llmchat.sampling import SamplingParams


class TokenLike(Protocol):
    """One piece of a streamed reply: `text` to show now (may be empty), and its token id (-1: unknown)."""

    @property
    def text(self) -> str: ...
    @property
    def token_id(self) -> int: ...


class GenerationLike(Protocol):
    """What `generate` returns: iterate it for the reply; `outcome` is complete once iteration ends."""

    @property
    def outcome(self) -> GenerationOutcome: ...
    @property
    def seed(self) -> int: ...
    def __iter__(self) -> Iterator[TokenLike]: ...


class SettingsLike(Protocol):
    """The engine settings the session and batch read."""

    @property
    def kv_shift(self) -> bool: ...
    @property
    def batch_size(self) -> int: ...


class ChatEngine(Protocol):
    """A loaded model that can tokenize a rendered prompt and stream a reply to it.

    Grammars (`generate(grammar=...)`, structured output) are local only: the session asks for them
    only from an engine whose `takes_grammar` is true."""

    # Read-only here (properties), so each engine may keep them as plain attributes of its own types.
    @property
    def n_ctx(self) -> int: ...  # the context window of one sequence (for a server: one slot's)
    @property
    def metadata(self) -> Mapping[str, str]: ...  # GGUF metadata as far as known (template resolution)
    @property
    def bos_text(self) -> str: ...
    @property
    def eos_text(self) -> str: ...
    @property
    def model_path(self) -> Path | str: ...  # what the history records as the model's location
    @property
    def notices(self) -> list[str]: ...  # lines for --verbose
    @property
    def settings(self) -> SettingsLike: ...

    def has_single_token(self, text: str) -> bool: ...
    def tokenize(self, text: str, *, special: bool) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    # pieces: (text, trusted) or (text, trusted, reply_ids): see Engine.prompt_tokens
    def prompt_tokens(
        self, pieces: Sequence[tuple[str, bool] | tuple[str, bool, Sequence[int] | None]]
    ) -> list[int]: ...
    def min_tokens(self, text: str) -> int | None: ...
    def cached_prefix(self, prompt: Sequence[int]) -> int: ...
    def shift_out_dropped(self, prompt: Sequence[int]) -> int: ...
    def generate(
        self,
        prompt: Sequence[int],
        sampling: SamplingParams,
        *,
        max_tokens: int | None,
        stop_strings: Sequence[str] = (),
        steering: Steering | None = None,
        markup: Mapping[int, bytes] | None = None,
    ) -> GenerationLike: ...
    def close(self) -> None: ...


if TYPE_CHECKING:
    from llmchat.engine.core import Engine
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine

    def _every_engine_is_a_chat_engine(
        local: Engine, server: LlamaServerEngine, compatible: OpenAICompatEngine
    ) -> list[ChatEngine]:
        """Never called: mypy checks here that each engine satisfies the protocol."""
        return [local, server, compatible]
