"""The tools a session offers the model: the specs, the model's own call format (the family found
in its template, or the server's native `tools`), the choice per round, and who approves a call.

An offer is built once per session (or per distinct batch item offer) by `make_offer`, which builds
and checks every call grammar up front. A tool's schema keyword the grammar cannot hold is left to
validation, and a tool whose schema is not valid JSON Schema is left out, each with a notice
(llmchat.tools.schema_hold). The tool loop (llmchat.turn.tool_loop) runs the rounds with it, and
the prompt (llmchat.turn.tokens) is shaped by it.

An offer made with a `source` (the run's ToolSet) follows it: `refresh()`, called by the tool loop
before a turn's first round, lists again the tools of an MCP server that sent
notifications/tools/list_changed and offers the new list from that turn on, with one notice per
server ("MCP server X changed its tools: +a -b"). Not between the rounds of one turn: the tools
are rendered before the user's message, so a new list would change the prompt's prefix that the
later rounds keep in the KV cache.

Tools whose schemas would take more than `lazy_share` of the context are offered lazily
(llmchat.tools.lazy): one loader tool in their place, and each tool the model loads joins the offer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from llmchat.defaults import DEFAULT_CHAIN_LIMIT
from llmchat.errors import UsageError
from llmchat.tools import native
from llmchat.tools.approval import ApprovalPolicy
from llmchat.tools.choice import ChainGuard, ToolChoice, parse_tool_choice, plan_round
from llmchat.tools.families import GENERIC, detect_family
from llmchat.tools.prompt import Capabilities, capabilities, template_variables
from llmchat.tools.schema_hold import offered_tools

if TYPE_CHECKING:
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.interface import ChatEngine
    from llmchat.prompt.model_facts import ModelFacts
    from llmchat.prompt.render import ResolvedTemplate
    from llmchat.tools.approval import Answer
    from llmchat.tools.families import Family
    from llmchat.tools.registry import ToolChange
    from llmchat.tools.spec import CallRecord, ToolSpec


class ToolSource(Protocol):
    """Where an offer's tools come from (llmchat.tools.registry.ToolSet): a server's changed tools
    listed again, and every tool as it is now."""

    def refresh_changed(self) -> list[ToolChange]: ...

    def specs(self) -> list[ToolSpec]: ...


class ToolHost(Protocol):
    """What an offer is built for (a chat session): its engine, its template, and what every reply
    is already held to (a StructuredOutput or None: tools and a schema cannot be combined)."""

    @property
    def engine(self) -> ChatEngine: ...

    @property
    def template(self) -> ResolvedTemplate: ...

    @property
    def structured(self) -> object | None: ...

    @property
    def facts(self) -> ModelFacts: ...  # what the template renders with (counting the tools' tokens)


class ToolTaker(ToolHost, Protocol):
    """A session that takes an offer for its following turns."""

    def use_tools(self, offer: ToolOffer | None) -> None: ...


@dataclass
class ToolIO:
    """Where the loop talks to the person: a call before it runs, notices (stderr), the approval
    question (None: no terminal, nobody to ask) and a call's result once it ran (None: not shown)."""

    show_call: Callable[[str], None]
    notice: Callable[[str], None]
    ask: Callable[[str, Any], Answer] | None = None
    show_result: Callable[[CallRecord], None] | None = None


@dataclass
class ToolOffer:
    """The tools a session offers, in the model's own call format, and who approves their calls."""

    specs: dict[str, ToolSpec]
    family: Family
    caps: Capabilities
    choice: ToolChoice
    policy: ApprovalPolicy
    io: ToolIO
    chain_limit: int = DEFAULT_CHAIN_LIMIT
    enabled: bool = True  # /tool on|off
    # /tool off NAME: tools kept aside, out of the prompt, the grammar and the calls, until /tool on NAME.
    switched_off: dict[str, ToolSpec] = field(default_factory=dict)
    # The call format's markers that are control tokens in this vocabulary ([TOOL_CALLS],
    # <|python_tag|>): they print as nothing, so the reply shows them as their text for the parser.
    markup: dict[int, bytes] = field(default_factory=dict)
    said: set[str] = field(default_factory=set)  # notices given once per session
    source: ToolSource | None = None  # the tools followed when a server changes them (refresh)
    engine: ChatEngine | None = None  # checks the grammars of a refreshed list
    # Lazily offered tools (llmchat.tools.lazy): those not loaded yet, and the share of the context
    # past which the tools are offered so (None: never).
    catalog: dict[str, ToolSpec] = field(default_factory=dict)
    lazy_share: float | None = None
    lazily: bool = False  # offered lazily: the loader is among the specs
    _loaded_now: bool = False  # a tool was loaded since the tool loop last asked (take_loaded)
    _grammars: dict[tuple[tuple[str, ...], bool, bool], Grammar] = field(default_factory=dict, repr=False)

    @property
    def active(self) -> bool:
        return self.enabled and self.choice.mode != "none" and bool(self.specs)

    @property
    def native(self) -> bool:
        """The server takes the tools in its own `tools` parameter (llmchat.tools.native)."""
        return self.family is native.NATIVE

    def notice_once(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            self.io.notice(line)

    def refresh(self) -> None:
        """Offer the source's tools as they are now, when a server said they changed: the notices
        of what changed, and the grammars built again. A forced tool that is gone: the model chooses."""
        source = self.source
        changes = source.refresh_changed() if source is not None else []
        if source is None or not changes:
            return
        for change in changes:
            self.io.notice(change.notice())
        grammar = not self.native and self.choice.mode != "none"
        listed = {spec.name: spec for spec in offered_tools(source.specs(), self.notice_once, grammar=grammar)}
        # A tool switched off stays off under its new definition; one that is gone is forgotten.
        self.switched_off = {name: listed.pop(name) for name in self.switched_off if name in listed}
        self.specs = self._lazily(listed, list(self.specs)) if self.lazily else listed
        self._after_change("that tool is gone")

    def _lazily(self, listed: dict[str, ToolSpec], loaded: Sequence[str] = ()) -> dict[str, ToolSpec]:
        """The tools to render when `listed` is offered lazily: the loader, then the `loaded` ones
        (and a forced one) still listed; the rest go to the catalog."""
        from llmchat.tools.lazy import loader_name, loader_spec

        wanted = [name for name in loaded if name in listed]
        if self.choice.mode == "named" and self.choice.name in listed and self.choice.name not in wanted:
            wanted.append(self.choice.name)
        self.catalog = {name: spec for name, spec in listed.items() if name not in wanted}
        loader = loader_spec(loader_name(list(listed)), list(self.catalog.values()), self.load)
        return {loader.name: loader, **{name: listed[name] for name in wanted}}

    def load(self, name: str) -> str:
        """The loader's call: `name` joins the tools offered from the next round on."""
        if name in self.specs:
            return f"{name} is already loaded: call it with its parameters."
        spec = self.catalog.pop(name, None)
        if spec is None:
            return f"Error: no tool {name} to load"
        self.specs[name] = spec  # at the end of the tool block: what comes before it stays in the KV cache
        self._loaded_now = True
        self._grammars.clear()
        if self.engine is not None and not self.native:
            self._check_grammars(self.engine)
        return f"{name} is loaded: it is among your tools now, with its parameters; call it."

    def take_loaded(self) -> bool:
        """Whether a tool was loaded since the last time this was asked (the prompt's tools changed)."""
        loaded, self._loaded_now = self._loaded_now, False
        return loaded

    def switch(self, patterns: Sequence[str], on: bool) -> list[str]:
        """/tool on|off NAME: offer these tools (names or globs) from the next turn, or keep them
        aside. Returns the names switched; a pattern that matches no tool is a UsageError listing
        them. A tool switched back on goes to the end of the list (the prompt changes either way)."""
        from fnmatch import fnmatchcase

        every = [*self.specs, *self.catalog, *self.switched_off]
        for pattern in patterns:
            if not any(fnmatchcase(name, pattern) for name in every):
                raise UsageError(f"{pattern}: no tool of that name (tools: {', '.join(every)})")
        # A lazily offered tool not loaded yet (the catalog): on loads it, off keeps it aside.
        sources, target = (
            ((self.switched_off, self.catalog), self.specs) if on else ((self.specs, self.catalog), self.switched_off)
        )
        names = []
        for source in sources:
            picked = [name for name in source if any(fnmatchcase(name, pattern) for pattern in patterns)]
            for name in picked:
                target[name] = source.pop(name)
            names += picked
        self._after_change("that tool is switched off")
        return names

    def _after_change(self, why: str) -> None:
        """The tool list changed: a forced tool no longer in it leaves the choice to the model, and
        the grammars are built again for the new list."""
        if self.choice.mode == "named" and self.choice.name not in self.specs:
            from llmchat.tools.choice import ToolChoice

            self.notice_once(f"--tool-choice {self.choice.name}: {why}; the model chooses (auto)")
            self.choice = ToolChoice("auto")
        self._grammars.clear()
        if self.engine is not None and self.active and not self.native:
            self._check_grammars(self.engine)

    def _check_grammars(self, engine: ChatEngine) -> None:
        """Build every grammar the rounds use and check it against the engine's vocabulary."""
        names = list(self.specs)
        engine.check_grammar(self.grammar(names, False, lazy=self.family is not GENERIC))
        if self.choice.mode in ("required", "named"):
            forced = plan_round(self.choice, 0, names).grammar_tools
            engine.check_grammar(self.grammar(forced, True))
        self.markup = control_markers(engine, [g.text for g in self._grammars.values()])

    def listed(self) -> list[ToolSpec]:
        return list(self.specs.values())

    def shape(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The messages as this family's template takes them, and the template variables (`tools`)."""
        from llmchat.tools.prompt import messages_for_template

        specs = self.listed()
        return messages_for_template(messages, self.family, specs, self.caps), template_variables(self.family, specs)

    def grammar(self, names: Sequence[str], forced: bool, lazy: bool = False) -> Grammar:
        """The call grammar for these tools: forced (from the first token), or lazy (it starts at
        the family's first trigger)."""
        from llmchat.tools.grammar import call_grammar

        key = (tuple(names), forced, lazy)
        if key not in self._grammars:
            specs = [self.specs[n] for n in names]
            self._grammars[key] = call_grammar(self.family, specs, forced=forced, lazy=lazy).grammar
        return self._grammars[key]


def make_offer(
    host: ToolHost,
    specs: Sequence[ToolSpec],
    io: ToolIO,
    *,
    tool_choice: str = "auto",
    chain_limit: int = DEFAULT_CHAIN_LIMIT,
    approve_all: bool = False,
    interactive: bool = False,
    source: ToolSource | None = None,
    lazy_share: float | None = None,
) -> ToolOffer:
    """The tools `specs` offered to `host`'s model; every grammar is built and checked here, before
    anything is generated (what a grammar cannot hold of a tool's schema is said once). A server that renders its own
    template gets the tools natively, and no grammar (llmchat.tools.native). `source`: the tools
    to follow when a server changes them (ToolOffer.refresh). `lazy_share`: past this share of the
    context, the tools are offered lazily (llmchat.tools.lazy; None: never)."""
    engine = host.engine
    if host.structured is not None:
        raise UsageError("tools and --schema/--format/--grammar cannot be combined; drop one of them")
    ChainGuard(chain_limit)  # --chain-limit 0: a usage error
    native_engine = engine.caps.renders_template
    said: set[str] = set()

    def say(line: str) -> None:  # remembered: a refreshed list does not say it again
        said.add(line)
        io.notice(line)

    specs = offered_tools(specs, say, grammar=not native_engine and tool_choice != "none")
    by_name = {spec.name: spec for spec in specs}
    choice = parse_tool_choice(tool_choice, list(by_name))
    if native_engine:
        family, caps = native.NATIVE, native.CAPABILITIES
    else:
        family = detect_family(host.template.text)
        caps = capabilities(host.template.text, family)
    offer = ToolOffer(
        by_name,
        family,
        caps,
        choice,
        ApprovalPolicy(interactive=interactive, approve_all=approve_all),
        io,
        chain_limit,
        said=said,
        source=source,
        engine=engine,
        lazy_share=lazy_share,
    )
    if lazy_share is not None and offer.active and not offer.native and _too_big(host, offer, lazy_share):
        offer.specs, offer.lazily = offer._lazily(by_name), True
        io.notice(
            f"the {len(by_name)} tools' schemas would take more than {lazy_share:.0%} of the context: the model "
            f"gets their names and {next(iter(offer.specs))} to load the ones it needs (lazy_tools in the config)"
        )
    if offer.active and not offer.native:
        offer._check_grammars(engine)
        if family is GENERIC:
            from llmchat.prompt.format_analysis import analyze
            from llmchat.tools import generic

            template = host.template
            io.notice(generic.notice(f"{template.name} ({template.source_detail})", analyze(template.text).missing))
    return offer


def _too_big(host: ToolHost, offer: ToolOffer, share: float) -> bool:
    """Whether the offer's tools take more than `share` of the context, as its template renders them."""
    from llmchat.tools.lazy import is_lazy
    from llmchat.tools.token_cost import prompt_counter

    count = prompt_counter(host.engine.prompt_tokens, host.template, host.facts, offer.family, offer.caps)
    return is_lazy(count(offer.listed()) - count([]), host.engine.n_ctx, share)


def control_markers(engine: ChatEngine, grammar_texts: Sequence[str]) -> dict[int, bytes]:
    """The fixed texts of the call grammars that are one control token each, by token id."""
    from llmchat.tools.grammar import grammar_literals

    markup: dict[int, bytes] = {}
    for text in sorted(set().union(*(grammar_literals(g) for g in grammar_texts))):
        if not text.strip():
            continue
        ids = engine.tokenize(text, special=True)
        if len(ids) == 1 and engine.is_control(ids[0]):
            markup[ids[0]] = text.encode("utf-8")
    return markup
