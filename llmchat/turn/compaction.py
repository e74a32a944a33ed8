"""Compaction: the older exchanges replaced in the model's context by a summary the model writes.

`/compact [INSTRUCTIONS]` asks for it (`compact_now`); with `compact = "auto"` (config, or
`--compact auto`) a turn whose prompt plus its reply's reserve would pass `compact_threshold` of
the context (default 80 %) compacts first (`compact_before_turn`), before trimming would drop
anything. Either way:
- the summary is a separate generation on the same engine (local or a server), over the exchanges
  being replaced: the conversation's own prompt up to them, then a summarising request (with the
  user's instructions). That prompt extends what the KV cache already holds, so only the request is
  prefilled; the summary is capped at `compact_summary_tokens` (and an eighth of the context). That
  prompt is never trimmed: the summary stands for exactly the exchanges it saw, and where the
  window up to the kept exchanges would not fit beside the summary's room, fewer are summarised
  (the rest stay verbatim after it);
- the last exchanges stay verbatim (up to `KEEP_EXCHANGES`, within `KEEP_SHARE` of the context),
  after the summary, which the model sees as an exchange of its own (llmchat.turn.conversation);
- the history keeps every message, and the summary as a message of role `summary` that says how
  many messages it stands for (m008): `history show` and `export` show both, and a resumed
  conversation (`ask -c`, `chat --resume`, `/load`) starts from the latest summary.
A summary that comes back empty, or is cut off by its cap, is a failed compaction: nothing changes,
and an automatic one falls back to trimming (one notice says so). A Ctrl-C while the summary is
written stops it before anything changed.

Like the tool loop, this runs over a protocol of the session's methods and never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from llmchat import interrupts
from llmchat.errors import ContextOverflowError, HistoryError, UsageError
from llmchat.turn.conversation import Budget, fit_to_context
from llmchat.turn.observer import NullObserver
from llmchat.turn.plan import TurnScope

if TYPE_CHECKING:
    from collections.abc import Sequence

    from llmchat.config import Config
    from llmchat.engine.interface import ChatEngine, Prompt
    from llmchat.engine.sampling import SamplingParams
    from llmchat.store.history import HistoryStore
    from llmchat.turn.conversation import Conversation
    from llmchat.turn.observer import TurnObserver
    from llmchat.turn.plan import PreparedTurn
    from llmchat.turn.record import TurnResult
    from llmchat.turn.tool_loop import KeptPrefix

MODES = ("auto", "off")
KEEP_EXCHANGES = 2  # the most recent exchanges kept verbatim after the summary ...
KEEP_SHARE = 0.25  # ... as long as they take at most this share of the context
SUMMARY_SHARE = 8  # a summary takes at most 1/8 of the context, whatever compact_summary_tokens says

SUMMARY_PROMPT = (
    "Write a summary of our conversation so far. It will replace the conversation, so keep what "
    "matters for going on: what I asked and wanted, the facts, names, numbers, decisions and code, "
    "and what is still open. Write only the summary, in a few short paragraphs."
)


@dataclass(frozen=True)
class CompactionSettings:
    """`compact`, `compact_threshold` and `compact_summary_tokens` from the config (`--compact`
    overrides the first: the commands pass a config with it replaced)."""

    mode: str = "off"
    threshold: float = 0.8
    summary_tokens: int = 512

    @classmethod
    def of(cls, config: Config | None) -> CompactionSettings:
        if config is None:  # a session built without a config (tests, embedding): no automatic compaction
            return cls()
        return cls(config.compact, config.compact_threshold, config.compact_summary_tokens)


def with_mode(config: Config, mode: str | None) -> Config:
    """The config with `--compact auto|off` over its `compact` (None: the config's, default auto);
    UsageError (exit 2, before the model loads) for another value."""
    if mode is None:
        return config
    if mode not in MODES:
        raise UsageError(f"--compact must be auto or off, got {mode!r}")
    return replace(config, compact=mode)


class Compactable(Protocol):
    """What compaction runs on (a chat session): its conversation, engine and stores, and a turn's
    `prepare` and `decode`, which the summary goes through like any reply."""

    @property
    def conversation(self) -> Conversation: ...
    @property
    def engine(self) -> ChatEngine: ...
    @property
    def sampling(self) -> SamplingParams: ...
    @property
    def overflow(self) -> str: ...
    @property
    def config(self) -> Config | None: ...
    @property
    def model_label(self) -> str: ...
    @property
    def history(self) -> HistoryStore | None: ...
    @property
    def conversation_id(self) -> str | None: ...

    def budget(self, sampling: SamplingParams | None = None) -> Budget: ...
    def tokenize_messages(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> Prompt: ...
    def prepare(
        self,
        user_text: str,
        scope: TurnScope | None = None,
        *,
        after_user: Sequence[dict[str, Any]] = (),
        kept_prefix: KeptPrefix | None = None,
    ) -> PreparedTurn: ...
    def decode(
        self, prepared: PreparedTurn, observer: TurnObserver, *, restore: bool = True
    ) -> tuple[TurnResult, BaseException | None]: ...
    def disable_history(self, err: Exception, consequence: str) -> str: ...
    def check_message_size(self, user_text: str, budget: Budget | None = None) -> None: ...


@dataclass
class Compaction:
    """What one compaction did, or why it failed (`failure`; then nothing changed)."""

    exchanges: int  # summarised (a previous summary folded in is not counted)
    tokens_before: int  # the prompt before and after (with the pending message, before a turn)
    tokens_after: int
    n_ctx: int
    summary: TurnResult | None = None  # the summary's generation: its text, finish reason and stats
    failure: str | None = None
    notices: list[str] = field(default_factory=list)  # a failed save

    @property
    def freed(self) -> int:
        return self.tokens_before - self.tokens_after

    def notice(self) -> str:
        """The one line that says what happened."""
        if self.failure is not None:
            return f"context: compaction failed: {self.failure}"
        generated = self.summary.stats.generated_tokens if self.summary is not None else 0
        plural = "s" if self.exchanges != 1 else ""
        return (
            f"context: compacted {self.exchanges} exchange{plural} into a {generated}-token summary, "
            f"{self.freed:,} tokens freed ({self.tokens_before:,} -> {self.tokens_after:,} of {self.n_ctx:,})"
        )


def summary_cap(settings: CompactionSettings, n_ctx: int) -> int:
    return max(1, min(settings.summary_tokens, n_ctx // SUMMARY_SHARE))


def compact_now(
    session: Compactable, instructions: str | None = None, *, pending: str | None = None
) -> Compaction | None:
    """Summarise the window's older exchanges and put the summary in their place. `instructions`:
    what to keep or stress (`/compact keep the code`); `pending`: the message about to be sent
    (counted in the sizes). None: nothing to compact (no exchange in the window). Raises what
    stopped the summary (KeyboardInterrupt for a Ctrl-C) with nothing changed."""
    conversation = session.conversation
    starts = conversation.exchange_starts()
    if not starts:
        return None
    settings = CompactionSettings.of(session.config)
    n_ctx = session.engine.n_ctx
    before = _prompt_size(session, pending)
    sampling = replace(session.sampling, max_tokens=summary_cap(settings, n_ctx))
    request = SUMMARY_PROMPT + (f"\n\nIn the summary: {instructions.strip()}" if instructions else "")
    cut = _seen_up_to(session, starts, _kept_from(session, starts), request, sampling)
    compaction = Compaction(sum(1 for start in starts if start < cut), before, before, n_ctx)
    try:
        # Never trimmed: the summary stands for every message before `cut`, so it must see them all.
        prepared = session.prepare(request, TurnScope(conversation.up_to(cut), sampling, overflow="error"))
    except ContextOverflowError as err:
        compaction.failure = f"the exchanges to summarise do not fit the context ({err})"
        return compaction
    # The summary is free text whatever the chat's replies are held to (--schema).
    summary, stopped = session.decode(replace(prepared, structured=None), NullObserver(), restore=False)
    if stopped is not None:
        raise stopped
    if summary.interrupted:
        raise KeyboardInterrupt
    compaction.summary = summary
    text = summary.reply.strip()
    if not text:
        compaction.failure = "the model's summary was empty"
    elif summary.finish_reason == "length":
        compaction.failure = (
            f"the summary was cut off at {sampling.max_tokens} tokens (raise compact_summary_tokens in the config)"
        )
    if compaction.failure is not None:
        return compaction
    trial = conversation.up_to(len(conversation.messages))
    trial.compact(text, cut)
    compaction.tokens_after = _prompt_size(session, pending, trial)
    if compaction.tokens_after >= before:  # a few short exchanges, a long summary
        compaction.failure = (
            f"the summary ({summary.stats.generated_tokens} tokens) is no shorter than what it replaces"
        )
        return compaction
    interrupts.hold()  # the summary is written: it is saved and takes its exchanges' place whole
    _save(session, compaction, text, cut)
    conversation.compact(text, cut)
    return compaction


def compact_before_turn(session: Compactable, user_text: str) -> list[str]:
    """Automatic compaction (`compact = "auto"`): before a turn whose prompt plus its reply's
    reserve would pass the threshold, compact; when that fails, trim now instead (so the next turn
    does not try again at once). Returns the notices to show with the turn (one for the
    compaction or its fallback, and a failed save's)."""
    settings = CompactionSettings.of(session.config)
    conversation = session.conversation
    if settings.mode != "auto" or not conversation.exchange_starts():
        return []
    budget = session.budget()
    session.check_message_size(user_text, budget)  # a message that cannot fit fails now, nothing summarised
    limit = int(settings.threshold * budget.n_ctx)
    if len(session.tokenize_messages(conversation.prompt_messages(user_text))) + budget.reply_reserve <= limit:
        return []
    compaction = compact_now(session, pending=user_text)
    if compaction is None:
        return []
    if compaction.failure is None:
        return [compaction.notice(), *compaction.notices]
    return [_trim_instead(session, user_text, compaction.failure, limit - budget.reply_reserve)]


def _trim_instead(session: Compactable, user_text: str, failure: str, prompt_limit: int) -> str:
    """The fallback of a failed automatic compaction: trim the oldest exchanges as a turn past the
    threshold would (where the chat trims at all: --overflow drop), and say so in one line."""
    line = f"context: compaction failed: {failure}"
    if session.overflow != "drop" or prompt_limit <= 0:
        return f"{line}; nothing was summarised or dropped"
    n_ctx = session.engine.n_ctx
    try:
        fit = fit_to_context(
            session.conversation, user_text, Budget(n_ctx, n_ctx - prompt_limit), session.tokenize_messages
        )
    except ContextOverflowError:  # the message alone passes the threshold: the turn trims as it must
        return f"{line}; the conversation is trimmed when it outgrows the context instead"
    if not fit.messages_dropped:
        return f"{line}; the conversation is trimmed when it outgrows the context instead"
    return f"{line}; dropped {fit.messages_dropped} oldest messages ({fit.tokens_dropped:,} tokens) instead"


def _kept_from(session: Compactable, starts: list[int]) -> int:
    """Where the kept exchanges begin: the last KEEP_EXCHANGES or fewer, within KEEP_SHARE of the
    context, always leaving one exchange to summarise. len(messages): none kept."""
    conversation = session.conversation
    end = len(conversation.messages)
    room = int(session.engine.n_ctx * KEEP_SHARE)
    base = len(session.tokenize_messages(conversation.prompt_messages(start=end)))
    for keep in range(min(KEEP_EXCHANGES, len(starts) - 1), 0, -1):
        cut = starts[-keep]
        if len(session.tokenize_messages(conversation.prompt_messages(start=cut))) - base <= room:
            return cut
    return end


def _seen_up_to(session: Compactable, starts: list[int], cut: int, request: str, sampling: SamplingParams) -> int:
    """Where the summarised exchanges end: `cut`, or an earlier exchange's start where the
    summary's prompt (the window up to there, the request, and room for the summary) would not
    hold them all. Its prompt is never trimmed from the front, which would leave the summary
    standing for exchanges it never saw: the exchanges it cannot take stay verbatim after it
    instead. `cut` itself where not even the first exchange fits (the prepare then fails)."""
    limit = session.budget(sampling).prompt_limit
    conversation = session.conversation

    def fits(end: int) -> bool:
        messages = conversation.up_to(end).prompt_messages(request)
        return len(session.tokenize_messages(messages)) <= limit

    # Each candidate leaves at least one exchange to summarise; the prompt grows with the end.
    ends = [start for start in starts[1:] if start < cut] + [cut]
    if fits(ends[-1]):
        return cut
    low, high = 0, len(ends) - 2  # the largest end that fits, if any
    if high < 0 or not fits(ends[0]):
        return cut
    while low < high:
        middle = (low + high + 1) // 2
        if fits(ends[middle]):
            low = middle
        else:
            high = middle - 1
    return ends[low]


def would_free(session: Compactable, pending: str | None = None) -> int:
    """About how many tokens `/compact` would free now (0: none): the prompt (with the `pending`
    message) less the prompt after it, with the summary as long as its cap lets it be. What the
    room for a message's files counts (llmchat.turn.room); no summary is written."""
    conversation = session.conversation
    starts = conversation.exchange_starts()
    if not starts:
        return 0
    cut = _kept_from(session, starts)
    trial = conversation.up_to(len(conversation.messages))
    trial.compact("", cut)  # the summary's frame; its words are counted at the cap
    cap = summary_cap(CompactionSettings.of(session.config), session.engine.n_ctx)
    return max(0, _prompt_size(session, pending) - _prompt_size(session, pending, trial) - cap)


def _prompt_size(session: Compactable, pending: str | None, conversation: Conversation | None = None) -> int:
    messages = (conversation or session.conversation).prompt_messages(pending)
    return len(session.tokenize_messages(messages, add_generation_prompt=pending is not None)) if messages else 0


def _save(session: Compactable, compaction: Compaction, text: str, covers: int) -> None:
    """The summary joins the stored conversation, after the messages it stands for. A failed write
    turns the history off (the one failure policy: llmchat.turn.sink) and says so."""
    history, conversation_id = session.history, session.conversation_id
    if history is None or conversation_id is None:  # history off, or a branch not saved yet
        return
    summary = compaction.summary
    assert summary is not None  # set before a summary is saved
    try:
        history.add_message(
            conversation_id,
            role="summary",
            content=text,
            summarised=covers,
            finish_reason=summary.finish_reason,
            stats=summary.stats.to_dict(),
            model=session.model_label,
        )
    except HistoryError as err:
        compaction.notices.append(session.disable_history(err, "the summary was not saved, and nothing more will be"))
