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
from typing import TYPE_CHECKING, Any, Protocol

from llmchat.chat_template import ModelFacts, ResolvedTemplate, facts_from_metadata, render_prompt, resolve_template
from llmchat.conversation import Budget, Conversation, FitResult, default_reply_reserve, fit_to_context
from llmchat.errors import ContextOverflowError, HistoryError
from llmchat.metrics import TurnStats

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.engine import Engine
    from llmchat.engine.reply import GenerationOutcome
    from llmchat.history import HistoryStore, StoredConversation
    from llmchat.sampling import SamplingParams


class TurnObserver(Protocol):
    """What a display needs to know during a turn. NullObserver implements each as a no-op."""

    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None: ...
    def text(self, fragment: str) -> None: ...
    def token(self, generated: int, t_first: float, now: float) -> None: ...
    def finished(self, result: TurnResult) -> None: ...


class NullObserver:
    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        pass

    def text(self, fragment: str) -> None:
        pass

    def token(self, generated: int, t_first: float, now: float) -> None:
        pass

    def finished(self, result: TurnResult) -> None:
        pass


RECORD_KEYS = (
    "id",
    "reply",
    "finish_reason",
    "seed",
    "model",
    "template",
    "conversation_id",
    "saved",
    "stats",
    "error",
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

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == "interrupted"

    def to_record(self, record_id: Any = None) -> dict[str, Any]:
        """The one JSON record of a turn (`ask --json`, scripted `chat --json`, `batch`)."""
        return {
            "id": record_id,
            "reply": self.reply,
            "finish_reason": self.finish_reason,
            "seed": self.seed,
            "model": self.model,
            "template": self.template,
            "conversation_id": self.conversation_id,
            "saved": self.saved,
            "stats": self.stats.to_dict(),
            "error": None,
        }


def error_record(record_id: Any, message: str, *, model: str = "", template: str = "") -> dict[str, Any]:
    """The record of a turn that produced no reply: the same keys as `TurnResult.to_record`."""
    return {
        "id": record_id,
        "reply": None,
        "finish_reason": "error",
        "seed": None,
        "model": model,
        "template": template,
        "conversation_id": None,
        "saved": False,
        "stats": None,
        "error": message.replace("\n", " "),
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

    @property
    def prompt(self) -> list[int]:
        return self.fit.prompt_tokens


class _EngineVocabulary:
    """The loaded model's vocabulary, seen the way `facts_from_metadata` asks about it."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.engine.has_single_token(text)


def model_facts(engine: Engine) -> ModelFacts:
    """What template resolution knows about a loaded model: the same builder `template show` uses
    on the GGUF file (`facts_from_metadata`), asked through the engine's tokenizer."""
    return facts_from_metadata(
        engine.metadata, _EngineVocabulary(engine), bos_token=engine.bos_text, eos_token=engine.eos_text
    )


@dataclass
class ChatSession:
    engine: Engine
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

    @classmethod
    def start(
        cls,
        engine: Engine,
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
        return cls(
            engine=engine,
            template=template,
            facts=facts,
            sampling=sampling,
            model_label=model_label,
            conversation=Conversation(system=system),
            overflow=overflow,
            history=history,
        )

    def close(self) -> None:
        if self.history is not None:
            self.history.close()
        self.engine.close()

    # --- tokens and budget ------------------------------------------------------------------
    def tokenize_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        rendered = render_prompt(self.template, messages, self.facts, add_generation_prompt=add_generation_prompt)
        return self.engine.prompt_tokens([(piece.text, piece.trusted) for piece in rendered.pieces])

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
    ) -> PreparedTurn:
        """Render and tokenize the next prompt, trimming the conversation when it must (and may).

        Raises ContextOverflowError (nothing changed) when it cannot fit."""
        t_submit = time.perf_counter()
        conversation = self.conversation if conversation is None else conversation
        sampling = sampling or self.sampling
        budget = self.budget(sampling)
        self.check_message_size(user_text, budget)
        fit = fit_to_context(
            conversation, user_text, budget, self.tokenize_messages, overflow=overflow or self.overflow
        )
        return PreparedTurn(user_text, conversation, sampling, budget, fit, tuple(self.template.stop_strings), t_submit)

    def turn(self, user_text: str, observer: TurnObserver | None = None, *, record: bool = True) -> TurnResult:
        """Generate the reply to `user_text`. Ctrl-C stops generation and returns the partial reply,
        marked interrupted; it is kept in the conversation and history like any other. A failed
        save never raises: the result says `saved=False` and carries the warning."""
        observer = observer or NullObserver()
        prepared = self.prepare(user_text)
        if prepared.fit.messages_dropped and self.engine.settings.kv_shift:
            self.engine.shift_out_dropped(prepared.prompt)
        sampling = prepared.sampling
        generation = self.engine.generate(
            prepared.prompt, sampling, max_tokens=sampling.max_tokens, stop_strings=prepared.stop_strings
        )
        outcome = generation.outcome
        observer.prefill_started(len(prepared.prompt), self.engine.cached_prefix(prepared.prompt), self.engine.n_ctx)
        fragments: list[str] = []
        t_first_written: float | None = None
        stopped: BaseException | None = None
        try:
            for event in generation:
                if event.text:
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
        result = self.finish(prepared, outcome, "".join(fragments), generation.seed, t_first_written)
        self.commit(prepared, result, record=record)
        if stopped is not None:
            raise stopped
        observer.finished(result)
        return result

    def finish(
        self,
        prepared: PreparedTurn,
        outcome: GenerationOutcome,
        reply: str,
        seed: int,
        t_first_written: float | None = None,
        *,
        t_submit: float | None = None,
    ) -> TurnResult:
        """A decoded sequence as a TurnResult: stats and notices, the same for every decoding loop.

        `t_first_written`: when the first reply text reached the user (default: when the engine
        produced it); `t_submit`: when its TTFT clock started (default: when it was prepared; a
        parallel sequence starts when it takes its slot)."""
        start = prepared.t_submit if t_submit is None else t_submit
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
        )
        result = TurnResult(
            prepared.user,
            reply,
            outcome.finish_reason,
            stats,
            seed,
            model=self.model_label,
            template=self.template.name,
        )
        if fit.messages_dropped:
            result.notices.append(stats.trim_notice(prepared.budget.prompt_limit))
        return result

    def commit(self, prepared: PreparedTurn, result: TurnResult, *, record: bool = True) -> None:
        """The exchange joins its conversation and, when `record`, the history store."""
        prepared.conversation.add_exchange(result.user, result.reply, interrupted=result.interrupted)
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
                model_path=str(self.engine.model_path),
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
        self.conversation_id = stored.id
        self.last_result = None

    def set_sampling(self, sampling: SamplingParams) -> None:
        self.sampling = sampling

    def with_system(self, system: str | None) -> None:
        self.conversation = replace(self.conversation, system=system or None)
        if self.history is not None and self.conversation_id is not None:
            self.history.update_system_prompt(self.conversation_id, system or None)
