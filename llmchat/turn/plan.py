"""What a prepared turn is: conversation and sampling in, a turn ready to decode out (the session's
`prepare` builds it), what one turn runs in when it is not the session's own (`TurnScope`), and
the model facts a plan is rendered with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmchat.engine.interface import GenerateRequest
from llmchat.errors import ContextOverflowError
from llmchat.prompt.model_facts import facts_from_metadata
from llmchat.turn.policy import reply_cap

if TYPE_CHECKING:
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.interface import ChatEngine, Prompt
    from llmchat.engine.kv_store import Restored
    from llmchat.engine.sampling import SamplingParams
    from llmchat.prompt.model_facts import ModelFacts
    from llmchat.reasoning.formats import ReasoningFormat
    from llmchat.reasoning.thinking import ThinkingTracker
    from llmchat.tools.offer import ToolOffer
    from llmchat.turn.conversation import Budget, Conversation, FitResult
    from llmchat.turn.structured import StructuredOutput


@dataclass(frozen=True)
class TurnScope:
    """What one turn runs in, where it is not the session's own: a batch item's conversation,
    sampling, overflow rule, schema and tools. Each None is the session's. The session itself is
    not changed by a scoped turn (a batch item is no part of its conversation)."""

    conversation: Conversation | None = None
    sampling: SamplingParams | None = None
    overflow: str | None = None
    structured: StructuredOutput | None = None
    tools: ToolOffer | None = None


@dataclass
class PreparedTurn:
    """A turn ready to decode: its prompt, fitted to the budget, and what ends its reply."""

    user: str
    conversation: Conversation
    sampling: SamplingParams
    budget: Budget
    fit: FitResult
    stop_strings: tuple[str, ...]  # the template's; the engine adds the sampling's own
    t_submit: float
    starts_thinking: bool = False  # the generation prompt leaves a thinking block open (<think>)
    structured: StructuredOutput | None = None  # what the reply is held to (--schema, a batch item's own)
    restored: Restored | None = None  # what the KV cache on disk gave this turn
    # A reasoning model's thinking as it streams, with its budget: the request's steering
    # (`request_of`), fed by whoever reads the reply's text.
    tracker: ThinkingTracker | None = None
    markup: dict[int, bytes] | None = None  # the format's control-token markers, shown as text
    # A tool round (llmchat.turn.tool_loop): the call grammar, and the trigger text that switches it
    # on (None: from the first answer token, a forced call).
    tool_grammar: Grammar | None = None
    tool_trigger: str | None = None
    # A tool round on a server that takes tools natively: its `tool_choice` (llmchat.tools.native).
    tool_choice: str | dict[str, Any] | None = None
    # The rendered prompt's text: a tool turn's later rounds keep the first round's tokens for it.
    rendered_text: str = ""
    # A tool round's reply stays as written, content markers and all: the tool loop's reader finds
    # the calls in it first (Kimi K3 writes them after its closing marker), then takes them off.
    keeps_markers: bool = False
    # Token counts of the prompt where the next prompts are expected to leave it (llmchat.turn.parting),
    # for an engine that keeps checkpoints of a recurrent state there.
    parting_points: tuple[int, ...] = ()

    @property
    def prompt(self) -> Prompt:
        return self.fit.prompt_tokens


class EngineVocabulary:
    """The loaded model's vocabulary, seen the way `facts_from_metadata` asks about it."""

    def __init__(self, engine: ChatEngine):
        self.engine = engine

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.engine.has_single_token(text)


def model_facts(engine: ChatEngine) -> ModelFacts:
    """What template resolution knows about a loaded model: the same builder `template show` uses
    on the GGUF file (`facts_from_metadata`), asked through the engine's tokenizer."""
    return facts_from_metadata(
        engine.metadata, EngineVocabulary(engine), bos_token=engine.bos_text, eos_token=engine.eos_text
    )


def reasoning_tokens(engine: ChatEngine, fmt: ReasoningFormat | None) -> tuple[dict[int, bytes], list[int]]:
    """The reasoning format's markers that are control tokens (shown as their text to the parser),
    and the token ids the thinking budget forces in to close a thinking block."""
    if fmt is None:
        return {}, []
    markup: dict[int, bytes] = {}
    for marker in fmt.markers:
        ids = engine.tokenize(marker, special=True)
        if len(ids) == 1:
            markup[ids[0]] = marker.encode("utf-8")
    return markup, engine.tokenize(fmt.forced_close, special=True)


def check_message_size(engine: ChatEngine, user_text: str, budget: Budget) -> None:
    """Refuse a message that certainly cannot fit, before rendering or tokenizing it.

    Pasting a 10 MB file would otherwise be rendered by the template (whose size limits would then
    blame the template) and tokenized several times (seconds each) only to fail. Only a certain
    bound is used (`min_tokens`); anything closer is left to the exact count in `fit_to_context`."""
    if len(user_text) <= budget.prompt_limit:
        return  # the bound cannot exceed the limit here (at most one token per 4 bytes)
    at_least = engine.min_tokens(user_text)
    if at_least is not None and at_least > budget.prompt_limit:
        raise ContextOverflowError(
            f"the message cannot fit: it is {len(user_text.encode('utf-8', errors='replace')):,} bytes, at least "
            f"{at_least:,} tokens, but the context of {budget.n_ctx:,} holds at most {budget.prompt_limit:,} with "
            f"{budget.reply_reserve:,} kept for the reply; raise --ctx or shorten the message",
            prompt_tokens=at_least,
            limit=budget.prompt_limit,
        )


def grammar_of(
    prepared: PreparedTurn, engine: ChatEngine, fmt: ReasoningFormat | None
) -> tuple[Grammar | None, str | None]:
    """The grammar a turn decodes under, and the text after which it applies: when the prompt
    leaves a thinking block open, the model thinks freely and is held to the grammar once it
    has closed the block (a grammar from the first token would make the close unreachable)."""
    if prepared.tool_grammar is not None:
        # A tool round (llmchat.turn.tool_loop): forced from the first answer token, or lazy,
        # from the family's trigger on (the request feeds the trigger through the grammar).
        if prepared.tool_trigger is not None:
            return prepared.tool_grammar, prepared.tool_trigger
        after = fmt.close_tag if fmt is not None and fmt.kind == "tags" and prepared.starts_thinking else None
        return prepared.tool_grammar, after
    if prepared.structured is None:
        return None, None
    if not engine.caps.grammar:
        engine.check_grammar(prepared.structured.grammar)  # says why, as a UsageError
    after = fmt.close_tag if fmt is not None and fmt.kind == "tags" and prepared.starts_thinking else None
    return prepared.structured.grammar, after


def request_of(prepared: PreparedTurn, engine: ChatEngine, fmt: ReasoningFormat | None) -> GenerateRequest:
    """What the engine decodes for a prepared turn (`fmt`: the model's reasoning format): the same
    request in every mode."""
    grammar, grammar_after = grammar_of(prepared, engine, fmt)
    return GenerateRequest(
        prepared.prompt,
        prepared.sampling,
        max_tokens=reply_cap(prepared.sampling),
        stop_strings=prepared.stop_strings,
        steering=prepared.tracker,
        markup=prepared.markup,
        grammar=grammar,
        grammar_after=grammar_after,
        grammar_from_trigger=prepared.tool_trigger is not None and prepared.tool_grammar is not None,
        tool_choice=prepared.tool_choice,
        parting_points=prepared.parting_points,
    )
