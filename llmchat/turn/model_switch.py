"""What a session holds for its model, and how `/model NAME` replaces it mid-conversation.

A model comes with its parts: the engine, the template resolved for it (from its GGUF metadata,
the config's template for it, or the built-in choice: llmchat.prompt.resolution), the facts the
template is rendered with, and its reasoning format with the control tokens that go with it.
`model_parts` builds them, at start-up and on a switch alike.

A switch (`ChatSession.switch_model`) loads the new model with a `ModelLoader` (made by
llmchat.startup.loading with the run's options), builds all of its parts, and only then swaps them in and
frees the old engine: a model that fails to load, or a part that fails for it (a tool grammar, a
schema its vocabulary cannot hold), closes the new engine and leaves the session as it was. The
conversation carries over as text: replies' sampled token ids belong to the old vocabulary and
are dropped, and the next prompt is rendered whole with the new template, so the KV prefix is
built anew (that turn's stats say so: `prefix`). The sampling goes on too, but a value that came
from the old model's `general.sampling.*` keys (or from ours) becomes the new model's
recommendation; what the user set stays (llmchat.engine.sampling.with_model_defaults).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from llmchat.prompt.resolution import resolve_template
from llmchat.reasoning.formats import detect_format
from llmchat.turn.plan import EngineVocabulary, model_facts, reasoning_tokens

if TYPE_CHECKING:
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.kv_store import KVStore
    from llmchat.prompt.model_facts import ModelFacts
    from llmchat.prompt.render import ResolvedTemplate
    from llmchat.reasoning.formats import ReasoningFormat
    from llmchat.tools.offer import ToolOffer
    from llmchat.turn.conversation import Conversation
    from llmchat.turn.structured import StructuredOutput

SWITCHED = "rebuilt after model switch"  # the `prefix` stat of the first turn on a new model


@dataclass
class SwitchedModel:
    """A model loaded for `/model NAME`, not yet in use: closed by whoever fails to use it."""

    engine: ChatEngine
    label: str  # the name the user gave it, or its file's stem
    config_template: str | None  # the config's template for this model (an alias's, or the global one)
    kv_store: KVStore | None = None  # the KV cache on disk, for this engine (asked for where the old one had one)
    notices: list[str] = field(default_factory=list)  # one line each: a base model, ...
    # Its `general.sampling.*` recommendation (llmchat.engine.sampling.model_defaults): it replaces the old
    # model's wherever the user set nothing (llmchat.engine.sampling.with_model_defaults).
    recommended_sampling: dict[str, Any] = field(default_factory=dict)


# Loads a local model by name, path or store name with the run's options; `disk_cache`: open the
# KV cache on disk for it. Raises LlmchatError (ModelError, UsageError) when it cannot.
ModelLoader = Callable[[str, bool], SwitchedModel]


@dataclass
class ModelParts:
    engine: ChatEngine
    template: ResolvedTemplate
    facts: ModelFacts
    reasoning_format: ReasoningFormat | None
    markup: dict[int, bytes]  # the reasoning markers that are control tokens (llmchat.turn.plan)
    close_ids: list[int]  # the ids the thinking budget forces in to close a thinking block


def model_parts(
    engine: ChatEngine,
    template_choice: str | None = None,
    config_template: str | None = None,
    server_template: ResolvedTemplate | None = None,
) -> ModelParts:
    """The template resolved for `engine`'s model (`server_template` stands in for it where the
    server renders its own) and what follows from it."""
    facts = model_facts(engine)
    template = resolve_template(facts, template_choice, config_template)
    fmt = detect_format(template.text, EngineVocabulary(engine))
    markup, close_ids = reasoning_tokens(engine, fmt)
    return ModelParts(engine, server_template or template, facts, fmt, markup, close_ids)


@dataclass
class _Host:
    """The new model as a tool offer is built for it (llmchat.tools.offer.ToolHost)."""

    engine: ChatEngine
    template: ResolvedTemplate
    structured: StructuredOutput | None
    facts: ModelFacts


def check_for(parts: ModelParts, structured: StructuredOutput | None, tools: ToolOffer | None) -> ToolOffer | None:
    """What the session holds its replies to, checked against the new model: the schema's grammar
    (UsageError where its vocabulary cannot take it), and the tools offered again in the new
    template's call format, with the same tools, choice and approvals. Returns the new offer."""
    if structured is not None:
        parts.engine.check_grammar(structured.grammar)
    if tools is None:
        return None
    from llmchat.tools.offer import make_offer

    choice = tools.choice.name if tools.choice.mode == "named" and tools.choice.name else tools.choice.mode
    offer = make_offer(
        _Host(parts.engine, parts.template, structured, parts.facts),
        list(tools.specs.values()),
        tools.io,
        tool_choice=choice,
        chain_limit=tools.chain_limit,
        approve_all=tools.policy.approve_all,
        interactive=tools.policy.interactive,
        source=tools.source,  # a server's changed tools are still followed
        lazy_share=tools.lazy_share,  # lazy again where they take too much of the new context
    )
    offer.policy = tools.policy  # the tools the person answered "always" for stay so
    offer.enabled = tools.enabled
    return offer


def as_text(conversation: Conversation) -> Conversation:
    """The conversation without its replies' sampled token ids, which only the old model's
    vocabulary spells: the new model tokenizes their text."""
    messages = [{key: value for key, value in m.items() if key != "token_ids"} for m in conversation.messages]
    return replace(conversation, messages=messages)
