"""The engine surface the rest of llmchat relies on, written down once.

Two kinds of engine stand behind it: `Engine` (llama.cpp in this process, llmchat.engine.core) and
the remote engines (llmchat.engine.remote: a llama.cpp server, or any OpenAI-compatible server).
The session, the chat UI and batch speak only to this surface, so a turn runs the same road
whichever engine answers it. What an engine can do is one typed value (`caps`), what `/show` and
`--verbose` say about it another (`info`): nobody asks an engine what it is, a field says it.

Nothing here imports llama_cpp, numpy or httpx, nor names an engine: each engine's own module
has mypy check it against `ChatEngine`, so this surface depends on none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Union

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence

    from llmchat.engine.grammar import Grammar
    from llmchat.engine.prompt_pieces import PromptPiece
    from llmchat.engine.reply import GenerationOutcome, ThinkingSteering
    from llmchat.engine.sampling import SamplingParams


@dataclass(frozen=True)
class EngineCaps:
    """What an engine can do. Every caller that once probed an engine reads one of these fields."""

    grammar: bool  # `GenerateRequest.grammar` holds the reply to it (--schema, --format, --grammar)
    kv_shift: bool  # `shift_out_dropped` moves the kept cache after a trim instead of prefilling it
    disk_cache: bool  # the KV cache can be saved to and restored from disk (llmchat.engine.kv_store)
    renders_template: bool  # the engine renders the chat template itself: prompts are `ChatMessages`
    # Replies come back as token ids, so the reply rules run on them (loop stop, thinking budget)
    # and an earlier reply goes back to the model as the ids it was sampled as.
    token_ids: bool
    remote: bool = False  # another process decodes: retries apply, and it owns its own settings
    media: bool = False  # it takes images or audio (`add_media`): a projector is there
    slots: int = 0  # server slots a batch may pin one worker each to (0: the server picks)
    # A recurrent or hybrid model whose state is checkpointed (engine.checkpoints): a request's
    # `parting_points` are worth finding, and it keeps checkpoints there.
    checkpoints: bool = False


@dataclass(frozen=True)
class EngineInfo:
    """What `/show` and `--verbose` say about an engine, and the stats' engine fields."""

    model_path: str  # what the history records as the model's location
    # (label, value, detail) rows for `/show`, in order.
    rows: tuple[tuple[str, str, str], ...] = ()
    flash_attn: bool | None = None  # None: the server decides
    flash_attn_why: str | None = None  # how `--flash-attn auto` decided; None when set by hand
    template_detail: str = ""  # who renders the chat template, where the engine does (caps.renders_template)
    threads: int | None = None  # llama.cpp's threads now; None: a remote engine (the server decides)
    threads_why: str | None = None  # why that many (engine.threads)


@dataclass(frozen=True)
class ChatMessages:
    """The prompt of an engine that renders its own template: the messages to send (with their
    `tool_calls` and `tool_call_id` where a tool turn has them), the tools it renders (OpenAI
    `tools` entries; None: no tools), and how many tokens they count (what budgets read, as `len`)."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool
    count: int
    tools: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return self.count


# A prompt is token ids, or messages for a server that renders its own template (caps.renders_template).
Prompt = Union[list[int], ChatMessages]


def prompt_ids(prompt: Prompt) -> list[int]:
    """The token ids of a prompt; a messages prompt has none to compare or cache."""
    return [] if isinstance(prompt, ChatMessages) else prompt


@dataclass
class GenerateRequest:
    """One sequence to decode: everything `generate` needs, as one value.

    `steering`: asked between tokens for tokens to force in (a thinking budget); `markup`: control
    tokens shown as their text (reasoning markers; see engine.reply); `grammar`: the reply is held
    to it, from the start or, with `grammar_after`, from the first token after that text (the end
    of a thinking block); `slot`: a server slot (None: the engine's pinned one; -1: any)."""

    prompt: Prompt
    sampling: SamplingParams
    max_tokens: int | None = None
    stop_strings: tuple[str, ...] = ()
    steering: ThinkingSteering | None = None
    markup: Mapping[int, bytes] | None = None
    grammar: Grammar | None = None
    grammar_after: str | None = None
    # A lazy grammar (a tool call with --tool-choice auto): `grammar_after` is the text that opens
    # what the grammar describes, so it is fed through the grammar when it appears.
    grammar_from_trigger: bool = False
    slot: int | None = None
    # A prompt that carries tools (ChatMessages.tools): the OpenAI `tool_choice` ("auto",
    # "required", "none", or {"type": "function", "function": {"name": ...}}); None: "auto".
    tool_choice: str | dict[str, Any] | None = None
    # Token counts of the prompt where later prompts are expected to leave it (llmchat.turn.parting):
    # an engine with `caps.checkpoints` keeps a checkpoint of its recurrent state at each.
    parting_points: tuple[int, ...] = ()

    @property
    def stops(self) -> tuple[str, ...]:
        """The template's stop strings and the sampling's own."""
        return tuple(self.stop_strings) + tuple(self.sampling.stop)


@dataclass
class QueuedRequest:
    """A request decoded alongside others; `key` is the caller's handle, returned untouched."""

    key: Any
    request: GenerateRequest


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


class ChatEngine(Protocol):
    """A loaded model that can tokenize a rendered prompt and stream a reply to it."""

    # Read-only here (properties), so each engine may keep them as plain attributes of its own types.
    @property
    def caps(self) -> EngineCaps: ...
    @property
    def info(self) -> EngineInfo: ...
    @property
    def n_ctx(self) -> int: ...  # the context window of one sequence (for a server: one slot's)
    @property
    def metadata(self) -> Mapping[str, str]: ...  # GGUF metadata as far as known (template resolution)
    @property
    def bos_text(self) -> str: ...
    @property
    def eos_text(self) -> str: ...
    @property
    def notices(self) -> list[str]: ...  # lines for --verbose
    @property
    def batch_size(self) -> int: ...  # tokens per decode step (batch --parallel)

    def has_single_token(self, text: str) -> bool: ...
    def tokenize(self, text: str, *, special: bool) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def is_control(self, token_id: int) -> bool: ...  # a markup token; False without a vocabulary
    def prompt_tokens(self, pieces: Sequence[PromptPiece]) -> Prompt: ...
    def min_tokens(self, text: str) -> int | None: ...
    def cached_prefix(self, prompt: Sequence[int]) -> int: ...
    def shift_out_dropped(self, prompt: Sequence[int]) -> int: ...
    def check_grammar(self, grammar: Grammar) -> None: ...
    # feeds_steering: the engine gives the reply text to `request.steering` itself (batch: nobody
    # reads the events); otherwise whoever reads the events feeds it.
    def generate(self, request: GenerateRequest, *, feeds_steering: bool = False) -> GenerationLike: ...
    def close(self) -> None: ...
