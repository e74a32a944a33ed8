"""The conversation and its token budget. Prints nothing.

The context window holds the rendered prompt plus the reply. We keep a reserve for the reply and
count the prompt with the model's own tokenizer on the rendered template (never estimated).

When the next prompt does not fit, the oldest whole exchanges are dropped, in one chunk down to
about 65% of the budget rather than one message at a time: the turns after a trim then extend a
stable prefix and reuse the KV cache, instead of shifting the front of the window (and
re-prefilling everything) on every turn.

Compaction (llmchat.turn.compaction) is the other way to make room: the older exchanges are
replaced in the model's context by a summary the model wrote (`Summary`), sent as an exchange of
its own (the request, then the summary as the assistant's reply: templates that insist on
alternating roles take it as they take any exchange), followed by the messages after the ones it
stands for. The messages themselves all stay; the summary only moves the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from llmchat.errors import ContextOverflowError

if TYPE_CHECKING:
    from llmchat.engine.interface import Prompt
    from llmchat.store.records import StoredConversation

TRIM_TARGET = 0.65
# What the summary answers in the model's context (the summarising prompt itself is longer:
# llmchat.turn.compaction).
SUMMARY_REQUEST = "Summarise our conversation so far."


@dataclass(frozen=True)
class Summary:
    """A compaction's summary: it stands for the first `covers` messages in the model's context.
    `made_at`: how many messages the conversation had when it was written; removing messages
    below that (/undo, /branch) forgets it, as the history deletes it with them."""

    text: str
    covers: int
    made_at: int


@dataclass
class Conversation:
    """System prompt plus user/assistant messages. `window_start` marks the oldest message still
    sent to the model; earlier ones were trimmed from the context, or summarised (`summary`), but
    stay in history."""

    system: str | None = None
    # {"role", "content"} and maybe "interrupted", "reasoning" (a reply's thinking, as the history keeps it)
    messages: list[dict] = field(default_factory=list)
    window_start: int = 0
    summary: Summary | None = None  # the latest compaction's; the window starts at or after it

    @classmethod
    def from_stored(cls, stored: StoredConversation) -> Conversation:
        """A conversation continued from the history store (`ask -c`, `chat --resume`, `/load`)."""
        conversation = cls(system=stored.system_prompt)
        for message in stored.messages:
            count = len(conversation.messages)
            if message.role == "summary" and message.summarised is not None and message.summarised <= count:
                # The latest summary wins: the model's context is rebuilt from it and what follows.
                conversation.summary = Summary(message.content, message.summarised, made_at=count)
                conversation.window_start = message.summarised
            elif message.role in ("user", "assistant", "tool"):
                # A tool turn's calls and results come back as they were sent (StoredMessage.tool).
                conversation.messages.append(message.chat_message())
                if getattr(message, "reasoning", None):  # the template decides what to show again
                    conversation.messages[-1]["reasoning"] = message.reasoning
        return conversation

    def prompt_messages(self, pending_user: str | None = None, start: int | None = None) -> list[dict]:
        start = self.window_start if start is None else start
        result = [{"role": "system", "content": self.system}] if self.system else []
        if self.summary is not None and start >= self.summary.covers:
            result += [
                {"role": "user", "content": SUMMARY_REQUEST},
                {"role": "assistant", "content": self.summary.text},
            ]
        result += [_prompt_message(m) for m in self.messages[start:]]
        if pending_user is not None:
            result.append({"role": "user", "content": pending_user})
        return result

    def add_exchange(
        self,
        user: str,
        assistant: str,
        *,
        interrupted: bool = False,
        token_ids: list[int] | None = None,
        between: Sequence[dict] = (),
    ) -> None:
        """`token_ids`: the reply as it was sampled, when they spell exactly `assistant` (the next
        prompt gives them back to the model unchanged: see `Engine.prompt_tokens`). `between`: a
        tool turn's calls and results, between the user's message and the final reply."""
        self.messages.append({"role": "user", "content": user})
        self.messages.extend(_kept_as_stored(message) for message in between)
        reply: dict = {"role": "assistant", "content": assistant, "interrupted": interrupted}
        if token_ids:
            reply["token_ids"] = token_ids
        self.messages.append(reply)

    def last_exchange_start(self) -> int | None:
        """Where the last exchange begins: the index of the last user message. The exchange is that
        message and everything after it (a tool turn's calls and results, the reply, an interrupted
        reply). None: no user message yet."""
        return next((i for i in range(len(self.messages) - 1, -1, -1) if self.messages[i]["role"] == "user"), None)

    def drop_last_exchange(self) -> dict | None:
        """Remove the last exchange (see `last_exchange_start`); returns its user message, or None
        when there was nothing to remove."""
        start = self.last_exchange_start()
        if start is None:
            return None
        user = self.messages[start]
        del self.messages[start:]
        self.window_start = min(self.window_start, len(self.messages))
        self._forget_a_later_summary()
        return user

    def last_user_message(self) -> str | None:
        for message in reversed(self.messages):
            if message["role"] == "user":
                return message["content"]
        return None

    def keep_turns(self, turns: int) -> None:
        """Keep the first `turns` turns (a turn: a user message and everything after it up to the
        next one) and drop the rest."""
        starts = [i for i, message in enumerate(self.messages) if message["role"] == "user"]
        del self.messages[starts[turns] if turns < len(starts) else len(self.messages) :]
        self.window_start = min(self.window_start, len(self.messages))
        self._forget_a_later_summary()

    def clear(self) -> None:
        self.messages.clear()
        self.window_start = 0
        self.summary = None

    # --- compaction (llmchat.turn.compaction) ------------------------------------------------------
    def exchange_starts(self) -> list[int]:
        """Where each exchange in the window begins (its user message), oldest first."""
        return [i for i in range(self.window_start, len(self.messages)) if self.messages[i]["role"] == "user"]

    def up_to(self, end: int) -> Conversation:
        """A copy of the conversation before message `end`, window and summary included: what a
        summary is written over (trimming the copy leaves this one as it is)."""
        copied = [dict(message) for message in self.messages[:end]]
        return Conversation(self.system, copied, min(self.window_start, end), self.summary)

    def compact(self, text: str, covers: int) -> None:
        """From now on the model sees `text` in place of the first `covers` messages."""
        self.summary = Summary(text, covers, made_at=len(self.messages))
        self.window_start = max(self.window_start, covers)

    def _forget_a_later_summary(self) -> None:
        """Messages were removed from before the point a summary was written at (it may stand for
        them): forget it, and give the model the whole conversation again (trimmed when it must)."""
        if self.summary is not None and self.summary.made_at > len(self.messages):
            self.summary = None
            self.window_start = 0


# What a tool turn's messages carry for the template besides role and content (llmchat.tools.prompt).
_TOOL_KEYS = ("tool_calls", "tool_call_id", "name")


def _prompt_message(message: dict) -> dict:
    """What the template sees of a message, plus the sampled ids of a reply (never rendered). A
    reply's thinking goes as `reasoning_content`, as llama.cpp passes it: the template decides
    whether the model sees it again (llmchat.prompt.reasoning_history)."""
    shown = {"role": message["role"], "content": message["content"]}
    if message.get("token_ids"):
        shown["token_ids"] = message["token_ids"]
    for key in _TOOL_KEYS:
        if key in message:
            shown[key] = message[key]
    if message["role"] == "assistant" and message.get("reasoning"):
        shown["reasoning_content"] = message["reasoning"]
    return shown


def _kept_as_stored(message: dict) -> dict:
    """A tool round's message as the conversation keeps it: its thinking under `reasoning`, as the
    history stores it (the rounds hand it to the template as `reasoning_content`)."""
    kept = {key: value for key, value in message.items() if key != "reasoning_content"}
    if message.get("reasoning_content"):
        kept["reasoning"] = message["reasoning_content"]
    return kept


@dataclass(frozen=True)
class Budget:
    n_ctx: int
    reply_reserve: int

    @property
    def prompt_limit(self) -> int:
        return self.n_ctx - self.reply_reserve


def default_reply_reserve(n_ctx: int, max_tokens: int | None) -> int:
    """`--max-tokens` when given, otherwise min(1024, n_ctx/4)."""
    return max_tokens if max_tokens is not None else min(1024, n_ctx // 4)


@dataclass(frozen=True)
class FitResult:
    prompt_tokens: Prompt  # token ids, or messages with their count (an engine that renders its template)
    messages_dropped: int = 0
    tokens_dropped: int = 0


def fit_to_context(
    conversation: Conversation,
    user_text: str,
    budget: Budget,
    tokenize_messages: Callable[[list[dict]], Prompt],
    *,
    overflow: str = "drop",
) -> FitResult:
    """Tokens of the next prompt, trimming `conversation.window_start` forward when it must.

    Raises ContextOverflowError when the newest message cannot fit even alone (with the system
    prompt), or when trimming is needed and `overflow == "error"`.
    """
    tokens = tokenize_messages(conversation.prompt_messages(user_text))
    if len(tokens) <= budget.prompt_limit:
        return FitResult(tokens)
    full_size = len(tokens)

    alone = tokenize_messages(conversation.prompt_messages(user_text, start=len(conversation.messages)))
    if len(alone) > budget.prompt_limit:
        raise ContextOverflowError(
            f"the prompt is {len(alone):,} tokens but the context of {budget.n_ctx:,} holds at most "
            f"{budget.prompt_limit:,} with {budget.reply_reserve:,} kept for the reply; "
            f"raise --ctx, lower --max-tokens or shorten the message",
            prompt_tokens=len(alone),
            limit=budget.prompt_limit,
        )
    if overflow == "error":
        raise ContextOverflowError(
            f"the conversation is {full_size:,} tokens but the context holds {budget.prompt_limit:,} "
            f"(plus {budget.reply_reserve:,} for the reply); raise --ctx or use --overflow drop",
            prompt_tokens=full_size,
            limit=budget.prompt_limit,
        )

    target = int(budget.prompt_limit * TRIM_TARGET)
    # Whole exchanges only: a user message without its reply (or the reverse) confuses the model.
    starts = []
    start = conversation.window_start
    while start < len(conversation.messages):
        start = _next_exchange_start(conversation.messages, start)
        starts.append(start)
    # The fewest exchanges dropped that reach the target. The prompt only shrinks as more are
    # dropped, so a binary search finds it with log2(n) renders instead of one per exchange
    # (each render and tokenize of a long conversation costs ~10 ms, on the turn that trims).
    prompts: dict[int, Prompt] = {}

    def prompt_from(index: int) -> Prompt:
        if index not in prompts:
            prompts[index] = tokenize_messages(conversation.prompt_messages(user_text, start=starts[index]))
        return prompts[index]

    low, high = 0, len(starts) - 1  # the last start drops everything: `alone`, which fits
    prompts[high] = alone
    while low < high:
        middle = (low + high) // 2
        if len(prompt_from(middle)) <= target:
            high = middle
        else:
            low = middle + 1
    start, tokens = starts[low], prompt_from(low)
    if len(tokens) > budget.prompt_limit:  # cannot happen given the check above; kept as a guard
        tokens = alone
        start = len(conversation.messages)
    dropped = start - conversation.window_start
    conversation.window_start = start
    return FitResult(tokens, messages_dropped=dropped, tokens_dropped=full_size - len(tokens))


def _next_exchange_start(messages: list[dict], start: int) -> int:
    """Index after the exchange that begins at `start` (a user message and the replies after it)."""
    index = start + 1
    while index < len(messages) and messages[index]["role"] != "user":
        index += 1
    return index
