"""One chat session: a loaded model, its resolved template, the conversation, and one turn at a time.

A turn is one road for every mode (ask, chat, batch, batch `--parallel`):
1. `prepare`: conversation + system -> template render -> token ids, fitted to the budget.
2. decoding: `Engine.generate` for one sequence, or `ParallelDecoder` for several; both apply the
   same reply rules (llmchat.engine.reply) and fill the same `GenerationOutcome`.
3. `finish`: the outcome becomes a `TurnResult` with its stats and notices.
4. the exchange joins the conversation and is saved; a failed save turns the history off once
   (`disable_history`) and is reported in the result (`saved`, `notices`), never raised.

`TurnResult.to_record()` is the one JSON shape that `ask --json`, scripted `chat --json` and
`batch` print (the README documents it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol

from llmchat.chat_template import ModelFacts, ResolvedTemplate, facts_from_metadata, render_prompt, resolve_template
from llmchat.conversation import Budget, Conversation, FitResult, default_reply_reserve, fit_to_context
from llmchat.engine.interface import GenerateRequest, prompt_ids
from llmchat.errors import ContextOverflowError, HistoryError, ServerError
from llmchat.metrics import TurnStats
from llmchat.reasoning import (
    THINKING,
    ReasoningSettings,
    ThinkingSplitter,
    ThinkingTracker,
    detect_format,
    split_reply,
    starts_in_thinking,
    thinking_variables,
)

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.engine.grammar import Grammar
    from llmchat.engine.interface import ChatEngine, Prompt
    from llmchat.engine.kv_store import KVStore, Restored
    from llmchat.engine.reply import GenerationOutcome
    from llmchat.history import HistoryStore, StoredConversation
    from llmchat.reasoning import ReasoningFormat, Segment
    from llmchat.sampling import SamplingParams
    from llmchat.structured import StructuredOutput


class TurnObserver(Protocol):
    """What a display needs to know during a turn. NullObserver implements each as a no-op."""

    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None: ...
    def text(self, fragment: str) -> None: ...
    def thinking(self, fragment: str) -> None: ...  # a reasoning model's thinking (may show nothing)
    def token(self, generated: int, t_first: float, now: float) -> None: ...
    def finished(self, result: TurnResult) -> None: ...


class NullObserver:
    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        pass

    def text(self, fragment: str) -> None:
        pass

    def thinking(self, fragment: str) -> None:
        pass

    def token(self, generated: int, t_first: float, now: float) -> None:
        pass

    def finished(self, result: TurnResult) -> None:
        pass


# A reply without --max-tokens stops here (or where the context ends, if sooner). Without a cap, a
# small model stuck in a loop (or a long story) ran until the window was full: minutes on a CPU.
# 2048 tokens is about 1,500 words, room for a long answer and a reasoning model's thinking.
DEFAULT_REPLY_CAP = 2048
LOOP_NOTICE = "the reply kept repeating itself, so it was stopped (finish_reason loop); --no-loop-stop lets it run"


def reply_cap(sampling: SamplingParams) -> int:
    """The most tokens a reply may take: --max-tokens, else DEFAULT_REPLY_CAP."""
    return sampling.max_tokens if sampling.max_tokens is not None else DEFAULT_REPLY_CAP


RECORD_KEYS = (
    "id",
    "reply",
    "reasoning",
    "finish_reason",
    "seed",
    "model",
    "template",
    "conversation_id",
    "saved",
    "stats",
    "error",
    "parsed",
)


@dataclass
class TurnResult:
    user: str
    reply: str
    finish_reason: str
    stats: TurnStats
    seed: int
    model: str = ""
    template: str = ""
    conversation_id: str | None = None
    saved: bool = False  # written to the history store
    notices: list[str] = field(default_factory=list)  # one line each for stderr: trims, a failed save
    reasoning: str | None = None  # a reasoning model's thinking, apart from `reply` (None: it has none)
    parsed: Any = None  # structured output: the reply's decoded JSON, once it validated
    error: str | None = None  # structured output: why the reply is not what was asked (invalid, cut off)
    token_ids: list[int] | None = None  # the reply as sampled, when they spell it exactly (not in records)

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == "interrupted"

    def to_record(self, record_id: Any = None) -> dict[str, Any]:
        """The one JSON record of a turn (`ask --json`, scripted `chat --json`, `batch`)."""
        return {
            "id": record_id,
            "reply": self.reply,
            "reasoning": self.reasoning,
            "finish_reason": self.finish_reason,
            "seed": self.seed,
            "model": self.model,
            "template": self.template,
            "conversation_id": self.conversation_id,
            "saved": self.saved,
            "stats": self.stats.to_dict(),
            "error": self.error,
            "parsed": self.parsed,
        }


def error_record(record_id: Any, message: str, *, model: str = "", template: str = "") -> dict[str, Any]:
    """The record of a turn that produced no reply: the same keys as `TurnResult.to_record`."""
    return {
        "id": record_id,
        "reply": None,
        "reasoning": None,
        "finish_reason": "error",
        "seed": None,
        "model": model,
        "template": template,
        "conversation_id": None,
        "saved": False,
        "stats": None,
        "error": message.replace("\n", " "),
        "parsed": None,
    }


@dataclass
class PreparedTurn:
    """A turn ready to decode: its prompt tokens, fitted to the budget, and what ends its reply."""

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
    # A reasoning model's thinking as it streams, with its budget; the decoding loop that runs
    # the turn feeds it (batch --parallel: `ParallelItem(steering=p.tracker, markup=p.markup)`).
    tracker: ThinkingTracker | None = None
    markup: dict[int, bytes] | None = None  # the format's control-token markers, shown as text

    @property
    def prompt(self) -> Prompt:
        return self.fit.prompt_tokens


class _EngineVocabulary:
    """The loaded model's vocabulary, seen the way `facts_from_metadata` asks about it."""

    def __init__(self, engine: ChatEngine):
        self.engine = engine

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.engine.has_single_token(text)


def model_facts(engine: ChatEngine) -> ModelFacts:
    """What template resolution knows about a loaded model: the same builder `template show` uses
    on the GGUF file (`facts_from_metadata`), asked through the engine's tokenizer."""
    return facts_from_metadata(
        engine.metadata, _EngineVocabulary(engine), bos_token=engine.bos_text, eos_token=engine.eos_text
    )


@dataclass
class ChatSession:
    engine: ChatEngine  # local llama.cpp or a server: the session never asks which
    template: ResolvedTemplate
    facts: ModelFacts
    sampling: SamplingParams
    model_label: str
    conversation: Conversation = field(default_factory=Conversation)
    overflow: str = "drop"
    history: HistoryStore | None = None
    conversation_id: str | None = None
    last_result: TurnResult | None = None
    config: Config | None = None
    verbose: bool = False
    # Reasoning models (llmchat.reasoning): the format found at start, what the user asked for,
    # and the template variables that follow from it.
    reasoning_format: ReasoningFormat | None = None
    reasoning: ReasoningSettings = field(default_factory=ReasoningSettings)
    template_vars: dict[str, Any] = field(default_factory=dict)
    _prompt_tail: str = ""  # the end of the last rendered generation prompt
    _markup: dict[int, bytes] = field(default_factory=dict)
    _close_ids: list[int] = field(default_factory=list)
    structured: StructuredOutput | None = None  # --schema / --format json / --grammar, for every turn
    kv_store: KVStore | None = None  # the KV cache on disk (llmchat.engine.kv_store); None: off

    @classmethod
    def start(
        cls,
        engine: ChatEngine,
        *,
        sampling: SamplingParams,
        model_label: str,
        template_choice: str | None = None,
        config_template: str | None = None,
        system: str | None = None,
        overflow: str = "drop",
        history: HistoryStore | None = None,
    ) -> ChatSession:
        facts = model_facts(engine)
        template = resolve_template(facts, template_choice, config_template)
        session = cls(
            engine=engine,
            template=template,
            facts=facts,
            sampling=sampling,
            model_label=model_label,
            conversation=Conversation(system=system),
            overflow=overflow,
            history=history,
        )
        session.reasoning_format = detect_format(template.text, _EngineVocabulary(engine))
        session._reasoning_tokens()
        return session

    # --- reasoning ------------------------------------------------------------------------------
    def _reasoning_tokens(self) -> None:
        """The format's markers that are control tokens (shown as their text to the parser) and
        the token ids the budget forces in to close a thinking block."""
        fmt = self.reasoning_format
        self._markup, self._close_ids = {}, []
        if fmt is None:
            return
        for marker in fmt.markers:
            ids = self.engine.tokenize(marker, special=True)
            if len(ids) == 1:
                self._markup[ids[0]] = marker.encode("utf-8")
        self._close_ids = self.engine.tokenize(fmt.forced_close, special=True)

    def configure_reasoning(self, settings: ReasoningSettings, say: Callable[[str], None]) -> None:
        """Apply --think/--no-think, --reasoning-effort, --template-var, --thinking-budget and the
        display choice. What the template cannot do is said once through `say`."""
        self.reasoning = settings
        self.template_vars = dict(settings.variables) | thinking_variables(
            self.reasoning_format, settings.think, settings.effort, say
        )
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

    def _tracker(self, prepared: PreparedTurn) -> ThinkingTracker | None:
        fmt = self.reasoning_format
        if fmt is None:
            return None
        splitter = ThinkingSplitter(fmt, start_in_thinking=prepared.starts_thinking)
        return ThinkingTracker(splitter, budget=self.reasoning.budget, close_ids=self._close_ids)

    def _show(self, observer: TurnObserver, segments: list[Segment], state: dict[str, bool]) -> None:
        """Thinking goes where the user asked (auto: the observer's `thinking`, dimmed on a
        terminal; stdout: marked in the answer stream; hide: nowhere); the answer to `text`."""
        display = self.reasoning.display
        for segment in segments:
            if segment.kind == THINKING:
                if display == "stdout":
                    if not state.get("open"):
                        observer.text("<thinking>\n")
                        state["open"] = True
                    observer.text(segment.text)
                elif display == "auto":
                    observer.thinking(segment.text)
                continue
            self._close_shown_thinking(observer, state)
            observer.text(segment.text)

    def _close_shown_thinking(self, observer: TurnObserver, state: dict[str, bool]) -> None:
        if state.pop("open", False):
            observer.text("\n</thinking>\n\n")

    def close(self) -> None:
        if self.history is not None:
            self.history.close()
        self.engine.close()

    # --- tokens and budget ------------------------------------------------------------------
    def tokenize_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> Prompt:
        rendered = render_prompt(
            self.template,
            messages,
            self.facts,
            add_generation_prompt=add_generation_prompt,
            variables=self.template_vars,
        )
        if add_generation_prompt:
            # The generation prompt ends every render the same way, whichever messages were trimmed.
            self._prompt_tail = rendered.text[-256:]
        # Earlier replies go back to the model as the ids they were sampled as (exact KV reuse).
        sampled = {m["content"]: m["token_ids"] for m in messages if m["role"] == "assistant" and m.get("token_ids")}
        return self.engine.prompt_tokens(
            [
                (piece.text, piece.trusted, sampled.get(piece.text) if piece.role == "assistant" else None)
                for piece in rendered.pieces
            ]
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
        *,
        conversation: Conversation | None = None,
        sampling: SamplingParams | None = None,
        overflow: str | None = None,
        structured: StructuredOutput | None = None,
    ) -> PreparedTurn:
        """Render and tokenize the next prompt, trimming the conversation when it must (and may).
        `structured`: what this reply is held to (default: the session's own).

        Raises ContextOverflowError (nothing changed) when it cannot fit."""
        t_submit = time.perf_counter()
        conversation = self.conversation if conversation is None else conversation
        sampling = sampling or self.sampling
        budget = self.budget(sampling)
        self.check_message_size(user_text, budget)
        fit = fit_to_context(
            conversation, user_text, budget, self.tokenize_messages, overflow=overflow or self.overflow
        )
        stops = tuple(self.template.stop_strings)
        fmt = self.reasoning_format
        if fmt is not None:  # gpt-oss's <|end|> ends its analysis message, not the reply
            stops = tuple(stop for stop in stops if stop not in fmt.markers)
        starts = fmt is not None and starts_in_thinking(fmt, self._prompt_tail)
        structured = structured or self.structured
        prepared = PreparedTurn(user_text, conversation, sampling, budget, fit, stops, t_submit, starts, structured)
        prepared.tracker = self._tracker(prepared)
        prepared.markup = self._markup if prepared.tracker is not None else None
        return prepared

    def hold_to(self, structured: StructuredOutput | None) -> None:
        """Hold every following reply to `structured` (None: free text again). UsageError when
        the engine cannot take a grammar or llama.cpp cannot parse it."""
        if structured is not None:
            self.engine.check_grammar(structured.grammar)  # UsageError where it cannot take one
        self.structured = structured

    def grammar_for(self, prepared: PreparedTurn) -> tuple[Grammar | None, str | None]:
        """The grammar a turn decodes under, and the text after which it applies: when the prompt
        leaves a thinking block open, the model thinks freely and is held to the grammar once it
        has closed the block (a grammar from the first token would make the close unreachable)."""
        if prepared.structured is None:
            return None, None
        if not self.engine.caps.grammar:
            self.engine.check_grammar(prepared.structured.grammar)  # says why, as a UsageError
        fmt = self.reasoning_format
        after = fmt.close_tag if fmt is not None and fmt.kind == "tags" and prepared.starts_thinking else None
        return prepared.structured.grammar, after

    def request_for(self, prepared: PreparedTurn) -> GenerateRequest:
        """What the engine decodes for a prepared turn: the same request in every mode."""
        grammar, grammar_after = self.grammar_for(prepared)
        return GenerateRequest(
            prepared.prompt,
            prepared.sampling,
            max_tokens=reply_cap(prepared.sampling),
            stop_strings=prepared.stop_strings,
            steering=prepared.tracker,
            markup=prepared.markup,
            grammar=grammar,
            grammar_after=grammar_after,
        )

    def turn(self, user_text: str, observer: TurnObserver | None = None, *, record: bool = True) -> TurnResult:
        """Generate the reply to `user_text`. Ctrl-C stops generation and returns the partial reply,
        marked interrupted; it is kept in the conversation and history like any other. A failed
        save never raises: the result says `saved=False` and carries the warning."""
        observer = observer or NullObserver()
        prepared = self.prepare(user_text)
        ids = prompt_ids(prepared.prompt)
        if prepared.fit.messages_dropped and self.engine.caps.kv_shift:
            self.engine.shift_out_dropped(ids)
        if self.kv_store is not None:  # a new process (ask -c, --resume) or /load: restore from disk
            prepared.restored = self.kv_store.restore(ids)
        tracker = prepared.tracker
        generation = self.engine.generate(self.request_for(prepared))
        outcome = generation.outcome
        observer.prefill_started(len(prepared.prompt), self.engine.cached_prefix(ids), self.engine.n_ctx)
        fragments: list[str] = []
        t_first_written: float | None = None
        stopped: BaseException | None = None
        shown: dict[str, bool] = {}
        try:
            for event in generation:
                if event.text and tracker is not None:
                    self._show(observer, tracker.feed(event.text, outcome.generated_tokens, time.perf_counter()), shown)
                elif event.text:
                    fragments.append(event.text)
                    observer.text(event.text)
                now = time.perf_counter()
                if t_first_written is None:
                    t_first_written = now
                observer.token(outcome.generated_tokens, t_first_written, now)
        except KeyboardInterrupt:
            outcome.finish_reason = "interrupted"
        except (SystemExit, BrokenPipeError) as err:
            # SIGTERM (raised as SystemExit by cli) or the reader closing stdout: the process ends,
            # but the partial reply is saved first, marked interrupted, as for Ctrl-C.
            outcome.finish_reason = "interrupted"
            stopped = err
        except ServerError as err:
            # A remote stream cut mid-reply: what arrived is kept (saved, marked as an error), then
            # the error is reported with its exit code.
            outcome.finish_reason = "error"
            stopped = err
        if tracker is not None:
            held = tracker.flush(outcome.generated_tokens, time.perf_counter())
            if stopped is None:  # with stdout closed, showing more would raise before the save
                self._show(observer, held, shown)
                self._close_shown_thinking(observer, shown)
            fragments = [tracker.splitter.answer]
        result = self.finish(prepared, outcome, "".join(fragments), generation.seed, t_first_written, tracker=tracker)
        self.commit(prepared, result, record=record)
        self._save_kv(result)
        if stopped is not None:
            raise stopped
        observer.finished(result)
        return result

    def _save_kv(self, result: TurnResult) -> None:
        """Write this turn's KV cache to disk for the next process. A failed write costs only speed
        later: it turns the disk cache off with one notice, and never fails the turn."""
        if self.kv_store is None:
            return
        try:
            self.kv_store.save(result.conversation_id)
        except OSError as err:
            self.kv_store = None
            result.notices.append(f"warning: KV cache not saved ({err.strerror or err}); the disk cache is off now")

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
        """A decoded sequence as a TurnResult: stats and notices, the same for every decoding loop.

        `t_first_written`: when the first reply text reached the user (default: when the engine
        produced it); `t_submit`: when its TTFT clock started (default: when it was prepared; a
        parallel sequence starts when it takes its slot). `tracker`: the turn's thinking as it was
        streamed; without one, a reasoning model's reply is split here (batch --parallel).

        TTFT is the first token of any kind; `ttfa_s` the first answer token (after thinking)."""
        start = prepared.t_submit if t_submit is None else t_submit
        if tracker is None and prepared.tracker is not None and prepared.tracker.fed:
            tracker = prepared.tracker  # fed by the parallel loop: the end of its reply is still held
            tracker.flush(outcome.generated_tokens, outcome.t_last_token or time.perf_counter())
        reasoning, reply, thinking_tokens, t_first_answer, budget_hit = self._thinking_of(prepared, reply, tracker)
        first_written = t_first_written or outcome.t_first_shown
        first = outcome.t_first_token
        end = outcome.t_last_token or first or time.perf_counter()
        fit = prepared.fit
        stats = TurnStats(
            ttft_s=(first_written - start) if first_written else 0.0,
            prefill_s=(first - outcome.t_start) if first else 0.0,
            decode_s=(end - first) if first else 0.0,
            total_s=time.perf_counter() - start,
            prompt_tokens=outcome.prompt_tokens,
            cached_tokens=outcome.cached_tokens,
            generated_tokens=outcome.generated_tokens,
            context_used=outcome.prompt_tokens + outcome.generated_tokens,
            context_limit=prepared.budget.n_ctx,
            messages_dropped=fit.messages_dropped,
            tokens_dropped=fit.tokens_dropped,
            finish_reason=outcome.finish_reason,
            draft_proposed=outcome.draft_proposed,
            draft_accepted=outcome.draft_accepted,
            server=outcome.server,  # a remote engine's own timings
        )
        if prepared.restored is not None:
            stats.disk_cached_tokens = prepared.restored.tokens
            stats.restore_s = prepared.restored.seconds
        info = self.engine.info
        stats.flash_attn = info.flash_attn
        stats.flash_attn_why = info.flash_attn_why
        stats.thinking_tokens = min(thinking_tokens, outcome.generated_tokens)
        stats.answer_tokens = outcome.generated_tokens - stats.thinking_tokens
        stats.thinking_budget_hit = budget_hit
        if reasoning is None or not stats.thinking_tokens:
            stats.ttfa_s = stats.ttft_s if reply else None
        else:
            stats.ttfa_s = (t_first_answer - start) if t_first_answer else None
        result = TurnResult(
            prepared.user,
            reply,
            outcome.finish_reason,
            stats,
            seed,
            model=self.model_label,
            template=self.template.name,
            reasoning=reasoning,
        )
        if reasoning is None and outcome.generated_ids and self.engine.detokenize(outcome.generated_ids) == reply:
            result.token_ids = list(outcome.generated_ids)
        if fit.messages_dropped:
            result.notices.append(stats.trim_notice(prepared.budget.prompt_limit))
        if outcome.finish_reason == "loop":
            result.notices.append(LOOP_NOTICE)
        if prepared.structured is not None:
            result.parsed, result.error = prepared.structured.check(reply, outcome.finish_reason)
        return result

    def _thinking_of(
        self, prepared: PreparedTurn, reply: str, tracker: ThinkingTracker | None
    ) -> tuple[str | None, str, int, float | None, bool]:
        """(reasoning, or None for a model without; the answer; thinking tokens; when the first
        answer token came; whether the budget ended the thinking)."""
        if tracker is not None:
            return (
                tracker.splitter.reasoning,
                tracker.splitter.answer,
                tracker.thinking_tokens,
                tracker.t_first_answer,
                tracker.budget_hit,
            )
        if self.reasoning_format is None:
            return None, reply, 0, None, False
        reasoning, answer = split_reply(self.reasoning_format, reply, start_in_thinking=prepared.starts_thinking)
        # A reply decoded whole (batch --parallel): count the thinking text's own tokens.
        thinking = len(self.engine.tokenize(reasoning, special=False)) if reasoning else 0
        return reasoning, answer, thinking, None, False

    def commit(self, prepared: PreparedTurn, result: TurnResult, *, record: bool = True) -> None:
        """The exchange joins its conversation and, when `record`, the history store. The reply's
        reasoning rides along in the message but is not sent back to the model (prompt_messages
        copies role and content only): templates drop earlier thinking, or should."""
        prepared.conversation.add_exchange(
            result.user, result.reply, interrupted=result.interrupted, token_ids=result.token_ids
        )
        if result.reasoning:
            prepared.conversation.messages[-1]["reasoning"] = result.reasoning
        if prepared.conversation is self.conversation:
            self.last_result = result
        if record and self.history is not None:
            try:
                self._record(result)
                result.saved = True
            except HistoryError as err:
                result.notices.append(self.disable_history(err, "this reply was not saved, and nothing more will be"))
        result.conversation_id = self.conversation_id if record else None

    def check_message_size(self, user_text: str, budget: Budget | None = None) -> None:
        """Refuse a message that certainly cannot fit, before rendering or tokenizing it.

        Pasting a 10 MB file would otherwise be rendered by the template (whose size limits
        would then blame the template) and tokenized several times (seconds each) only to fail.
        Only a certain bound is used (`Engine.min_tokens`); anything closer is left to the exact
        count in `fit_to_context`. `budget`: the one the caller fits with (default: this session's).
        """
        budget = budget or self.budget()
        if len(user_text) <= budget.prompt_limit:
            return  # the bound cannot exceed the limit here (at most one token per 4 bytes)
        at_least = self.engine.min_tokens(user_text)
        if at_least is not None and at_least > budget.prompt_limit:
            raise ContextOverflowError(
                f"the message cannot fit: it is {len(user_text.encode('utf-8', errors='replace')):,} bytes, at least "
                f"{at_least:,} tokens, but the context of {budget.n_ctx:,} holds at most {budget.prompt_limit:,} with "
                f"{budget.reply_reserve:,} kept for the reply; raise --ctx or shorten the message",
                prompt_tokens=at_least,
                limit=budget.prompt_limit,
            )

    # --- history -------------------------------------------------------------------------------
    def disable_history(self, err: Exception, consequence: str) -> str:
        """A history write failed (locked, disk full, read-only): stop using the store for the rest
        of the session. Returns the one warning line to show; once the store is gone nothing writes
        to it again, so the warning cannot repeat."""
        store, self.history = self.history, None
        # The KV cache on disk is the conversation in another form: it goes wherever history goes.
        self.kv_store = None
        if store is not None:
            try:
                store.close()
            except Exception:  # the store is already broken; closing is a courtesy
                pass
        return f"warning: {err}; {consequence}"

    def _record(self, result: TurnResult) -> None:
        assert self.history is not None
        if self.conversation_id is None:
            self.conversation_id = self.history.new_conversation(
                model=self.model_label,
                model_path=self.engine.info.model_path,
                template=f"{self.template.name} ({self.template.source})",
                system_prompt=self.conversation.system,
                sampling=self.sampling.to_record(),
            )
        self.history.add_turn(
            self.conversation_id,
            result.user,
            result.reply,
            interrupted=result.interrupted,
            finish_reason=result.finish_reason,
            stats=result.stats.to_dict(),
            sampling=self.sampling.to_record() | {"seed": result.seed},
            reasoning=result.reasoning,
        )

    def new_conversation(self) -> None:
        """`/clear`: a fresh conversation with the same model, template and system prompt."""
        self.conversation = Conversation(system=self.conversation.system)
        self.conversation_id = None
        self.last_result = None

    def load_conversation(self, stored: StoredConversation) -> None:
        """Continue a conversation from the history store."""
        self.conversation = Conversation(system=stored.system_prompt)
        for message in stored.messages:
            if message.role in ("user", "assistant"):
                self.conversation.messages.append({"role": message.role, "content": message.content})
                if getattr(message, "reasoning", None):  # kept beside the reply, never sent back
                    self.conversation.messages[-1]["reasoning"] = message.reasoning
        self.conversation_id = stored.id
        self.last_result = None

    def set_sampling(self, sampling: SamplingParams) -> None:
        self.sampling = sampling

    def with_system(self, system: str | None) -> None:
        self.conversation = replace(self.conversation, system=system or None)
        if self.history is not None and self.conversation_id is not None:
            self.history.update_system_prompt(self.conversation_id, system or None)
