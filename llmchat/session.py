"""One chat session: a loaded model, its resolved template, the conversation, and one turn at a time.

Every mode (ask, chat, batch) runs its turns through `ChatSession.turn`, so the template, the
budget, the stop rules and the stats are the same everywhere; only where input comes from and
where output goes differ.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from llmchat.chat_template import ModelFacts, ResolvedTemplate, marker_tokens, render_prompt, resolve_template
from llmchat.conversation import Budget, Conversation, default_reply_reserve, fit_to_context
from llmchat.errors import ContextOverflowError, HistoryError
from llmchat.metrics import TurnStats
from llmchat.sampling import SamplingParams


class TurnObserver(Protocol):
    """What a display needs to know during a turn. All methods are optional no-ops in NullObserver."""

    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None: ...
    def text(self, fragment: str) -> None: ...
    def token(self, generated: int, t_first: float, now: float) -> None: ...
    def finished(self, result: "TurnResult") -> None: ...


class NullObserver:
    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        pass

    def text(self, fragment: str) -> None:
        pass

    def token(self, generated: int, t_first: float, now: float) -> None:
        pass

    def finished(self, result: "TurnResult") -> None:
        pass


@dataclass
class TurnResult:
    user: str
    reply: str
    finish_reason: str
    stats: TurnStats
    seed: int

    @property
    def interrupted(self) -> bool:
        return self.finish_reason == "interrupted"


def model_facts(engine: Any) -> ModelFacts:
    """What template resolution needs to know about a loaded model."""
    meta = engine.metadata
    named = {
        key.removeprefix("tokenizer.chat_template."): value
        for key, value in meta.items()
        if key.startswith("tokenizer.chat_template.")
    }
    return ModelFacts(
        architecture=meta.get("general.architecture", ""),
        name=meta.get("general.name", ""),
        basename=meta.get("general.basename", ""),
        chat_template=meta.get("tokenizer.chat_template"),
        named_templates=named,
        bos_token=engine.bos_text,
        eos_token=engine.eos_text,
        tokens=frozenset(marker for marker in marker_tokens() if engine.has_single_token(marker)),
        vocab_known=True,
    )


@dataclass
class ChatSession:
    engine: Any  # llmchat.engine.Engine; typed loosely so this module never imports llama_cpp
    template: ResolvedTemplate
    facts: ModelFacts
    sampling: SamplingParams
    model_label: str
    conversation: Conversation = field(default_factory=Conversation)
    overflow: str = "drop"
    history: Any = None  # llmchat.history.HistoryStore or None
    conversation_id: str | None = None
    last_result: TurnResult | None = None

    @classmethod
    def start(
        cls,
        engine: Any,
        *,
        sampling: SamplingParams,
        model_label: str,
        template_choice: str | None = None,
        config_template: str | None = None,
        system: str | None = None,
        overflow: str = "drop",
        history: Any = None,
    ) -> "ChatSession":
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

    # --- tokens and budget ------------------------------------------------------------------
    def tokenize_messages(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        rendered = render_prompt(self.template, messages, self.facts, add_generation_prompt=add_generation_prompt)
        return self.engine.prompt_tokens([(piece.text, piece.trusted) for piece in rendered.pieces])

    def budget(self) -> Budget:
        return Budget(self.engine.n_ctx, default_reply_reserve(self.engine.n_ctx, self.sampling.max_tokens))

    def context_used(self) -> int:
        """Tokens the current conversation takes in the window (without a pending message)."""
        messages = self.conversation.prompt_messages()
        return len(self.tokenize_messages(messages, add_generation_prompt=False)) if messages else 0

    # --- one turn -------------------------------------------------------------------------------
    def turn(self, user_text: str, observer: TurnObserver | None = None, *, record: bool = True) -> TurnResult:
        """Generate the reply to `user_text`. Ctrl-C stops generation and returns the partial reply,
        marked interrupted; it is kept in the conversation and history like any other."""
        observer = observer or NullObserver()
        t_submit = time.perf_counter()
        self.check_message_size(user_text)
        fit = fit_to_context(self.conversation, user_text, self.budget(), self.tokenize_messages, overflow=self.overflow)
        if fit.messages_dropped and self.engine.settings.kv_shift:
            self.engine.shift_out_dropped(fit.prompt_tokens)
        generation = self.engine.generate(
            fit.prompt_tokens,
            self.sampling,
            max_tokens=self.sampling.max_tokens,
            stop_strings=self.template.stop_strings,
        )
        outcome = generation.outcome
        observer.prefill_started(len(fit.prompt_tokens), self.engine.cached_prefix(fit.prompt_tokens), self.engine.n_ctx)
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
        reply = "".join(fragments)
        stats = self._stats(outcome, fit, t_submit, t_first_written)
        result = TurnResult(user_text, reply, outcome.finish_reason, stats, generation.seed)
        self.conversation.add_exchange(user_text, reply, interrupted=result.interrupted)
        self.last_result = result
        if stopped is not None:
            if record:
                try:
                    self._record(result)
                except HistoryError:
                    pass  # the process is ending for another reason; that one is reported
            raise stopped
        if record:
            self._record(result)
        observer.finished(result)
        return result

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

    def _stats(self, outcome: Any, fit: Any, t_submit: float, t_first_written: float | None) -> TurnStats:
        end = outcome.t_last_token or outcome.t_first_token or time.perf_counter()
        first = outcome.t_first_token
        return TurnStats(
            ttft_s=(t_first_written - t_submit) if t_first_written else 0.0,
            prefill_s=(first - outcome.t_start) if first else 0.0,
            decode_s=(end - first) if first else 0.0,
            total_s=time.perf_counter() - t_submit,
            prompt_tokens=outcome.prompt_tokens,
            cached_tokens=outcome.cached_tokens,
            generated_tokens=outcome.generated_tokens,
            context_used=outcome.prompt_tokens + outcome.generated_tokens,
            context_limit=self.engine.n_ctx,
            messages_dropped=fit.messages_dropped,
            tokens_dropped=fit.tokens_dropped,
            finish_reason=outcome.finish_reason,
            draft_proposed=outcome.draft_proposed,
            draft_accepted=outcome.draft_accepted,
        )

    # --- history -------------------------------------------------------------------------------
    def _record(self, result: TurnResult) -> None:
        if self.history is None:
            return
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

    def load_conversation(self, stored: Any) -> None:
        """Continue a conversation from the history store."""
        self.conversation = Conversation(system=stored.system_prompt)
        for message in stored.messages:
            if message.role in ("user", "assistant"):
                self.conversation.messages.append({"role": message.role, "content": message.content})
        self.conversation_id = stored.id

    def set_sampling(self, sampling: SamplingParams) -> None:
        self.sampling = sampling

    def with_system(self, system: str | None) -> None:
        self.conversation = replace(self.conversation, system=system or None)
        if self.history is not None and self.conversation_id is not None:
            self.history.update_system_prompt(self.conversation_id, system or None)
