"""One chat session: a loaded model, its resolved template, the conversation, and one turn at a time.

The session owns its state: the conversation, the KV prefix, the per-turn settings. Other modules
call its methods and never write its fields; `start` builds it complete. The changes a chat's
commands make (a conversation cleared, loaded, cut; a setting set) are methods it inherits from
llmchat.turn.session_changes. A turn that is not the
session's own (a batch item) runs in a `TurnScope` and leaves the session as it was.

A turn is one road for every mode (ask, chat, batch, batch `--parallel`), assembled here from parts
that each have one job (llmchat.turn):
1. `prepare` (the plan): conversation + system -> template render -> token ids (llmchat.turn.tokens),
   fitted to the budget; `request_for` makes it the `GenerateRequest` the engine decodes.
2. decoding: `engine.generate` for one sequence (read by llmchat.turn.stream), or a decoder over
   several (batch); every one runs the same reply rules and steering (llmchat.engine.driver).
3. `finish` (llmchat.turn.stats): the outcome becomes a `TurnResult` with its stats and notices.
4. `commit`: the exchange joins the conversation, and the sink (llmchat.turn.sink) saves it under
   one failure policy: a failed save is reported in the result (`saved`, `notices`), never raised.
With tools on, steps 1-3 run in rounds (llmchat.turn.tool_loop), a strategy inside `turn` that
holds its own state; step 4 is the same.

`TurnResult.to_record()` is the one JSON shape that `ask --json`, scripted `chat --json` and
`batch` print (docs/json-record.md documents it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from llmchat import interrupts
from llmchat.engine.interface import GenerateRequest, prompt_ids
from llmchat.engine.sampling import with_model_defaults
from llmchat.errors import UsageError
from llmchat.media.use import give_media
from llmchat.prompt.model_facts import ModelFacts
from llmchat.prompt.reasoning_history import preserve_variables
from llmchat.prompt.render import RenderedPrompt, ResolvedTemplate, render_prompt
from llmchat.reasoning.formats import (
    ReasoningSettings,
    starts_in_thinking,
    thinking_preface,
    thinking_variables,
)
from llmchat.reasoning.thinking import ThinkingSplitter, ThinkingTracker
from llmchat.turn.compaction import compact_before_turn
from llmchat.turn.conversation import Budget, Conversation, default_reply_reserve, fit_to_context
from llmchat.turn.model_switch import SWITCHED, ModelLoader, as_text, check_for, model_parts
from llmchat.turn.observer import NullObserver, TurnObserver
from llmchat.turn.parting import Rewrites, parting_points
from llmchat.turn.plan import PreparedTurn, TurnScope, check_message_size, request_of
from llmchat.turn.record import TurnResult
from llmchat.turn.session_changes import SessionChanges
from llmchat.turn.sink import ConversationFacts, TurnSink
from llmchat.turn.stats import result_of
from llmchat.turn.stream import read_reply
from llmchat.turn.tokens import prompt_of, shape_for_template

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.engine.interface import ChatEngine, Prompt
    from llmchat.engine.kv_store import KVStore
    from llmchat.engine.reply import GenerationOutcome
    from llmchat.engine.sampling import SamplingParams
    from llmchat.reasoning.formats import ReasoningFormat
    from llmchat.store.attachment_records import Attachment
    from llmchat.store.history import HistoryStore
    from llmchat.tools.offer import ToolOffer
    from llmchat.turn.structured import StructuredOutput
    from llmchat.turn.tool_loop import KeptPrefix


@dataclass
class ChatSession(SessionChanges):
    engine: ChatEngine  # local llama.cpp or a server: the session never asks which
    template: ResolvedTemplate
    facts: ModelFacts
    sampling: SamplingParams
    model_label: str
    conversation: Conversation = field(default_factory=Conversation)
    overflow: str = "drop"
    sink: TurnSink = field(default_factory=TurnSink)  # the history and the KV cache on disk
    last_result: TurnResult | None = None  # the current conversation's last turn (/stats)
    config: Config | None = None
    verbose: bool = False
    # Reasoning models (llmchat.reasoning.formats): the format found at start, what the user asked for,
    # and the template variables that follow from it.
    reasoning_format: ReasoningFormat | None = None
    reasoning: ReasoningSettings = field(default_factory=ReasoningSettings)
    template_vars: dict[str, Any] = field(default_factory=dict)
    _markup: dict[int, bytes] = field(default_factory=dict)
    _close_ids: list[int] = field(default_factory=list)
    structured: StructuredOutput | None = None  # --schema / --format json / --grammar, for every turn
    origins: dict[str, str] = field(default_factory=dict)  # values a saved prompt set (-p NAME), for /show
    # /branch N and /edit: the conversation (id, turns shared) that the next saved turn forks from
    # (llmchat.turn.branches); the branch is created in the history with that turn, not before.
    fork_from: tuple[str, int] | None = None
    # The tools offered to the model (-T, --functions, --mcp), in its own call format; a turn with
    # tools on goes through the tool loop (llmchat.turn.tool_loop). None: no tools.
    tools: ToolOffer | None = None
    # `/model NAME` (llmchat.turn.model_switch): loads another model; None: this session cannot switch (a server).
    model_loader: ModelLoader | None = None
    _prefix_note: str | None = None  # why the next turn's KV prefix is built anew (its `prefix` stat)
    _rewrites: Rewrites = field(default_factory=Rewrites)  # each template's rewrite of a reply (llmchat.turn.parting)

    # The sink's stores, as the commands and the chat UI name them.
    @property
    def history(self) -> HistoryStore | None:
        return self.sink.history

    @property
    def kv_store(self) -> KVStore | None:
        return self.sink.kv_store  # the KV cache on disk (llmchat.engine.kv_store); None: off

    @property
    def conversation_id(self) -> str | None:
        return self.sink.conversation_id

    @conversation_id.setter
    def conversation_id(self, value: str | None) -> None:
        self.sink.conversation_id = value

    @classmethod
    def start(
        cls,
        engine: ChatEngine,
        *,
        sampling: SamplingParams,
        model_label: str,
        template_choice: str | None = None,
        config_template: str | None = None,
        server_template: ResolvedTemplate | None = None,
        system: str | None = None,
        overflow: str = "drop",
        history: HistoryStore | None = None,
        kv_store: KVStore | None = None,
        reasoning: ReasoningSettings | None = None,
        say: Callable[[str], None] = lambda line: None,
        config: Config | None = None,
        origins: dict[str, str] | None = None,
        verbose: bool = False,
        model_loader: ModelLoader | None = None,
    ) -> ChatSession:
        """A complete session, built once: the template resolved (`server_template` stands in for
        it where the server renders its own), the reasoning format found in it and `reasoning`
        applied (what the template cannot do is said through `say`), and the stores turns save to."""
        parts = model_parts(engine, template_choice, config_template, server_template)
        session = cls(
            engine=engine,
            template=parts.template,
            facts=parts.facts,
            sampling=sampling,
            model_label=model_label,
            conversation=Conversation(system=system),
            overflow=overflow,
            sink=TurnSink(history, kv_store),
            config=config,
            verbose=verbose,
            reasoning_format=parts.reasoning_format,
            origins=dict(origins or {}),
            model_loader=model_loader,
        )
        session._markup, session._close_ids = parts.markup, parts.close_ids
        if reasoning is not None:
            session.configure_reasoning(reasoning, say)
        return session

    # --- reasoning ------------------------------------------------------------------------------
    @interrupts.changes_state
    def configure_reasoning(self, settings: ReasoningSettings, say: Callable[[str], None]) -> None:
        """Apply --think/--no-think, --reasoning-effort, --reasoning-preserve, --template-var,
        --thinking-budget and the display choice. What the template cannot do is said once through `say`."""
        self.reasoning = settings
        self.template_vars = preserve_variables(self.template.text, settings.preserve, say) | dict(settings.variables)
        self.template_vars |= thinking_variables(self.reasoning_format, settings.think, settings.effort, say)
        if settings.budget is not None and not self.engine.caps.token_ids:
            say(
                "--thinking-budget: this server returns text, not token ids, so the budget cannot act on its "
                "replies; use llama-server or a local model"
            )
        elif settings.budget is not None and self.reasoning_format is None:
            say("this model's template has no thinking block; --thinking-budget does nothing here")

    def set_thinking(self, on: bool, say: Callable[[str], None]) -> None:
        """`/think`, `/nothink`: switch thinking for the following turns."""
        self.configure_reasoning(replace(self.reasoning, think=on), say)

    def _tracker(self, prepared: PreparedTurn, tools: ToolOffer | None) -> ThinkingTracker | None:
        fmt = self.reasoning_format
        if fmt is None:
            return None
        openers = tools.family.triggers if tools is not None and tools.active else ()
        preface = thinking_preface(fmt, prepared.rendered_text[-256:]) or ""
        splitter = ThinkingSplitter(
            fmt, start_in_thinking=prepared.starts_thinking, call_openers=openers, preface=preface
        )
        return ThinkingTracker(splitter, budget=self.reasoning.budget, close_ids=self._close_ids)

    def close(self) -> None:
        """The history, then the engine: the engine is freed even when the history fails to close."""
        with ExitStack() as closing:  # run in reverse: the sink first
            closing.callback(self.engine.close)
            closing.callback(self.sink.close)

    def switch_model(self, name: str, say: Callable[[str], None]) -> None:
        """`/model NAME`: the same conversation on another model (llmchat.turn.model_switch). The new
        model loads and every part is built for it before anything changes; then the old engine is
        freed. Raises LlmchatError with nothing changed when it cannot load or take this chat."""
        if self.model_loader is None:
            raise UsageError("this chat runs on a server, whose model llmchat cannot switch; start another chat")
        new = self.model_loader(name, self.kv_store is not None)
        try:
            parts = model_parts(new.engine, None, new.config_template)
            tools = check_for(parts, self.structured, self.tools)
        except BaseException:
            new.engine.close()
            raise
        interrupts.hold()  # loaded and checked: from here on the swap is made whole (a Ctrl-C waits)
        old = self.engine
        self.engine, self.template, self.facts, self.model_label = new.engine, parts.template, parts.facts, new.label
        self.reasoning_format, self._markup, self._close_ids = parts.reasoning_format, parts.markup, parts.close_ids
        self.tools, self.conversation, self._prefix_note = tools, as_text(self.conversation), SWITCHED
        self.sampling = with_model_defaults(self.sampling, new.recommended_sampling)  # the user's own stay
        self.sink.use_kv_store(new.kv_store)
        self.configure_reasoning(self.reasoning, say)
        for line in new.notices:
            say(line)
        old.close()

    # --- tokens and budget ------------------------------------------------------------------
    def tokenize_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> Prompt:
        """The prompt of `messages` as the engine takes it (llmchat.turn.tokens)."""
        return prompt_of(self.engine, self._render(messages, add_generation_prompt, self.tools), messages)

    def _render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool, tools: ToolOffer | None
    ) -> RenderedPrompt:
        shaped, variables = shape_for_template(messages, tools, self.template_vars)
        return render_prompt(
            self.template, shaped, self.facts, add_generation_prompt=add_generation_prompt, variables=variables
        )

    def budget(self, sampling: SamplingParams | None = None) -> Budget:
        max_tokens = (sampling or self.sampling).max_tokens
        return Budget(self.engine.n_ctx, default_reply_reserve(self.engine.n_ctx, max_tokens))

    def context_used(self) -> int:
        """Tokens the current conversation takes in the window (without a pending message)."""
        messages = self.conversation.prompt_messages()
        return len(self.tokenize_messages(messages, add_generation_prompt=False)) if messages else 0

    # --- one turn -------------------------------------------------------------------------------
    def prepare(
        self,
        user_text: str,
        scope: TurnScope | None = None,
        *,
        after_user: Sequence[dict[str, Any]] = (),
        kept_prefix: KeptPrefix | None = None,
    ) -> PreparedTurn:
        """Render and tokenize the next prompt, trimming the conversation when it must (and may).
        `scope`: what the turn runs in, where it is not the session's own (a batch item).
        `after_user`: the messages of this turn after the user's (a tool round: the calls so far and
        their results). `kept_prefix`: (text, ids) of the prompt this one extends, whose tokens are
        kept as they are in the KV cache (a tool turn's first round).

        Raises ContextOverflowError (nothing changed) when it cannot fit."""
        t_submit = time.perf_counter()
        scope = scope or TurnScope()
        conversation = self.conversation if scope.conversation is None else scope.conversation
        sampling = scope.sampling or self.sampling
        tools = scope.tools or self.tools
        budget = self.budget(sampling)
        self.check_message_size(user_text, budget)
        tail = [dict(message) for message in after_user]
        renders: list[tuple[Prompt, RenderedPrompt, list[dict[str, Any]]]] = []  # each prompt tried, with its render

        def tokenize(messages: list[dict[str, Any]]) -> Prompt:
            rendered = self._render([*messages, *tail], True, tools)
            prompt = prompt_of(self.engine, rendered, [*messages, *tail], kept_prefix)
            renders.append((prompt, rendered, [*messages, *tail]))
            return prompt

        fit = fit_to_context(conversation, user_text, budget, tokenize, overflow=scope.overflow or self.overflow)
        rendered, messages = next(
            (rendered, messages) for prompt, rendered, messages in renders if prompt is fit.prompt_tokens
        )
        text = rendered.text
        stops = tuple(self.template.stop_strings)
        fmt = self.reasoning_format
        if fmt is not None:  # gpt-oss's <|end|> ends its analysis message, not the reply
            stops = tuple(stop for stop in stops if stop not in fmt.markers)
        # The generation prompt ends every render the same way, whichever messages were trimmed.
        starts = fmt is not None and starts_in_thinking(fmt, text[-256:])
        structured = scope.structured or self.structured
        prepared = PreparedTurn(user_text, conversation, sampling, budget, fit, stops, t_submit, starts, structured)
        prepared.rendered_text = text
        prepared.tracker = self._tracker(prepared, tools)
        prepared.markup = self._markup if prepared.tracker is not None else None
        if self.engine.caps.checkpoints:
            prompt = prompt_ids(fit.prompt_tokens)
            first_round = not tail  # a later tool round extends the first, whose places come first
            rewrite = self._rewritten_tail(tools, starts) if first_round else None
            prepared.parting_points = parting_points(self.engine, prompt, rendered, messages, rewrite)
        return prepared

    def _rewritten_tail(self, tools: ToolOffer | None, thinking: bool) -> tuple[int, ...]:
        """The generation prompt's tail that the template renders otherwise once the reply is
        history (llmchat.turn.parting), derived once per model, template, variables, tools and thinking."""
        offered = tuple(tools.specs) if tools is not None and tools.active else ()
        variables = repr(sorted(self.template_vars.items()))
        shape = (self.engine.info.model_path, self.template.text, variables, offered, thinking)

        def render_tokens(probe: list[dict[str, Any]]) -> list[int]:
            return prompt_ids(prompt_of(self.engine, self._render(probe, True, tools), probe))

        return self._rewrites.tail(shape, render_tokens, thinking)

    @interrupts.changes_state
    def hold_to(self, structured: StructuredOutput | None) -> None:
        """Hold every following reply to `structured` (None: free text again). UsageError when
        the engine cannot take a grammar or llama.cpp cannot parse it."""
        if structured is not None:
            self.engine.check_grammar(structured.grammar)  # UsageError where it cannot take one
        self.structured = structured

    def request_for(self, prepared: PreparedTurn) -> GenerateRequest:
        """What the engine decodes for a prepared turn: the same request in every mode."""
        return request_of(prepared, self.engine, self.reasoning_format)

    def turn(
        self,
        user_text: str,
        observer: TurnObserver | None = None,
        *,
        record: bool = True,
        on_commit: Callable[[TurnResult], object] | None = None,
        attachments: tuple[Attachment, ...] = (),
        scope: TurnScope | None = None,
    ) -> TurnResult:
        """Generate the reply to `user_text`. Ctrl-C stops generation and returns the partial reply,
        marked interrupted; it is kept in the conversation and history like any other. A failed
        save never raises: the result says `saved=False` and carries the warning. `on_commit` hears
        the result as soon as it joined the conversation, before anything that may still raise
        (a stream cut mid-reply, Ctrl-C while it is shown). `scope`: see `prepare`.

        With tools on, the turn runs in rounds (llmchat.turn.tool_loop); either way it ends here:
        the result kept (history, KV cache on disk), then the exception that stopped the reply
        raised, or the observer told."""
        observer = observer or NullObserver()
        # The images and audio of the conversation's window (no prompt renders the messages before
        # it: llmchat.turn.conversation), and the new message's: the engine takes them first.
        kept = self.history.media_dir if self.history is not None else None
        window = self.conversation.messages[self.conversation.window_start :]
        give_media(self.engine, attachments, window, kept)
        # Past the threshold, the older exchanges are summarised first (llmchat.turn.compaction).
        compacted = compact_before_turn(self, user_text) if scope is None else []
        tools = (scope.tools if scope is not None else None) or self.tools
        if tools is not None and tools.active:
            from llmchat.turn.tool_loop import tool_rounds

            prepared, result, stopped = tool_rounds(self, tools, user_text, observer, scope)
        else:
            prepared = self.prepare(user_text, scope)
            result, stopped = self.decode(prepared, observer)
        result.attachments = tuple(attachments)
        result.notices[:0] = compacted
        result.stats.prefix, self._prefix_note = self._prefix_note, None
        self.commit(prepared, result, record=record)
        self.sink.save_kv(result)
        if on_commit is not None:
            on_commit(result)
        if stopped is not None:
            raise stopped
        observer.finished(result)
        return result

    def decode(
        self, prepared: PreparedTurn, observer: TurnObserver, *, restore: bool = True
    ) -> tuple[TurnResult, BaseException | None]:
        """Decode one prepared prompt (one round of a turn) with the engine, streaming it to
        `observer` (llmchat.turn.stream), and make it a TurnResult; with the exception to raise once
        it is saved, if the reply was cut by one. `restore`: try the KV cache on disk first (the
        first round of a turn; later rounds extend what is already in the context)."""
        ids = prompt_ids(prepared.prompt)
        if prepared.fit.messages_dropped and self.engine.caps.kv_shift:
            self.engine.shift_out_dropped(ids)
        if restore and self.kv_store is not None:  # a new process (ask -c, --resume) or /load: restore from disk
            prepared.restored = self.kv_store.restore(ids)
        tracker = prepared.tracker
        generation = self.engine.generate(self.request_for(prepared))
        observer.prefill_started(len(prepared.prompt), self.engine.cached_prefix(ids), self.engine.n_ctx)
        read = read_reply(generation, tracker, observer, self.reasoning.display, self.template.text)
        result = self.finish(
            prepared, generation.outcome, read.answer, generation.seed, read.t_first_written, tracker=tracker
        )
        result.raw_reply = read.raw
        return result, read.stopped

    def finish(
        self,
        prepared: PreparedTurn,
        outcome: GenerationOutcome,
        reply: str,
        seed: int,
        t_first_written: float | None = None,
        *,
        t_submit: float | None = None,
        tracker: ThinkingTracker | None = None,
    ) -> TurnResult:
        """A decoded sequence as a TurnResult (llmchat.turn.stats), the same for every decoding loop."""
        return result_of(
            prepared,
            outcome,
            reply,
            seed,
            engine=self.engine,
            reasoning_format=self.reasoning_format,
            model=self.model_label,
            template=self.template,
            t_first_written=t_first_written,
            t_submit=t_submit,
            tracker=tracker,
        )

    def commit(self, prepared: PreparedTurn, result: TurnResult, *, record: bool = True) -> None:
        """The exchange joins its conversation (its reasoning too: the template decides what the
        model sees of it again) and, when `record`, the history store."""
        prepared.conversation.add_exchange(
            result.user,
            result.reply,
            interrupted=result.interrupted,
            token_ids=result.token_ids,
            between=result.tool_messages,
        )
        if result.reasoning:
            prepared.conversation.messages[-1]["reasoning"] = result.reasoning
        if result.attachments:  # /edit gives them back with the typed words
            user_at = len(prepared.conversation.messages) - 2 - len(result.tool_messages)
            prepared.conversation.messages[user_at]["attachments"] = result.attachments
        if prepared.conversation is self.conversation:
            self.last_result = result
        if record:
            facts = ConversationFacts(
                model=self.model_label,
                model_path=self.engine.info.model_path,
                template=f"{self.template.name} ({self.template.source})",
                system_prompt=self.conversation.system,
                sampling=self.sampling.to_record(),
            )
            self.sink.save(result, facts, self.sampling.to_record(), fork_from=self.fork_from)
            if self.conversation_id is not None:
                self.fork_from = None
        result.conversation_id = self.conversation_id if record else None

    def check_message_size(self, user_text: str, budget: Budget | None = None) -> None:
        """Refuse a message that certainly cannot fit (llmchat.turn.plan), before rendering it.
        `budget`: the one the caller fits with (default: this session's)."""
        check_message_size(self.engine, user_text, budget or self.budget())

    @interrupts.changes_state
    def disable_history(self, err: Exception, consequence: str) -> str:
        """Stop using the history (and the KV cache on disk) for the rest of the session: the
        sink's one failure policy. Returns the one warning line to show."""
        return self.sink.disable_history(err, consequence)
