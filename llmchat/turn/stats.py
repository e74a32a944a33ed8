"""A decoded sequence's outcome as a `TurnResult`: its stats and notices, the same for every
decoding loop (a serial turn, batch --parallel, server streams).

TTFT is the first token of any kind; `ttfa_s` the first answer token (after thinking).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from llmchat.reasoning.thinking import split_reply
from llmchat.turn.markers import reply_content
from llmchat.turn.metrics import TurnStats
from llmchat.turn.policy import LOOP_NOTICE
from llmchat.turn.record import TurnResult

if TYPE_CHECKING:
    from llmchat.engine.interface import ChatEngine
    from llmchat.engine.reply import GenerationOutcome
    from llmchat.prompt.render import ResolvedTemplate
    from llmchat.reasoning.formats import ReasoningFormat
    from llmchat.reasoning.thinking import ThinkingTracker
    from llmchat.turn.plan import PreparedTurn


def result_of(
    prepared: PreparedTurn,
    outcome: GenerationOutcome,
    reply: str,
    seed: int,
    *,
    engine: ChatEngine,
    reasoning_format: ReasoningFormat | None,
    model: str,
    template: ResolvedTemplate,
    t_first_written: float | None = None,
    t_submit: float | None = None,
    tracker: ThinkingTracker | None = None,
) -> TurnResult:
    """`template`: the one the prompt was rendered with; its name goes in the record, and the
    markers it wraps a reply in come off the answer (llmchat.turn.markers), but for a tool round's
    (`keeps_markers`). `t_first_written`: when the first reply text reached the user (default:
    when the engine produced it); `t_submit`: when its TTFT clock started (default: when it was
    prepared; a parallel sequence starts when it takes its slot). `tracker`: the turn's thinking
    as it was streamed; without one, a reasoning model's reply is split here."""
    start = prepared.t_submit if t_submit is None else t_submit
    if tracker is None and prepared.tracker is not None and prepared.tracker.fed:
        tracker = prepared.tracker  # fed by the decoding loop: the end of its reply is still held
        tracker.flush(outcome.generated_tokens, outcome.t_last_token or time.perf_counter())
    reasoning, reply, thinking_tokens, t_first_answer, budget_hit = _thinking_of(
        prepared, reply, tracker, reasoning_format, engine
    )
    if not prepared.keeps_markers:  # before the ids are checked: they spell the reply as written
        reply = reply_content(template.text, reply)
    first_written = t_first_written or outcome.t_first_shown
    first = outcome.t_first_token
    end = outcome.t_last_token or first or time.perf_counter()
    fit = prepared.fit
    info = engine.info
    stats = TurnStats(
        ttft_s=(first_written - start) if first_written else 0.0,
        prefill_s=(first - outcome.t_start) if first else 0.0,
        decode_s=(end - first) if first else 0.0,
        total_s=time.perf_counter() - start,
        prompt_tokens=outcome.prompt_tokens,
        cached_tokens=outcome.cached_tokens,
        media_tokens=outcome.media_tokens,
        generated_tokens=outcome.generated_tokens,
        context_used=outcome.prompt_tokens + outcome.generated_tokens,
        context_limit=prepared.budget.n_ctx,
        messages_dropped=fit.messages_dropped,
        tokens_dropped=fit.tokens_dropped,
        finish_reason=outcome.finish_reason,
        draft_proposed=outcome.draft_proposed,
        draft_accepted=outcome.draft_accepted,
        loop_steered=outcome.loop_steered,
        server=outcome.server,  # a remote engine's own timings
    )
    if prepared.restored is not None:
        stats.disk_cached_tokens = prepared.restored.tokens
        stats.restore_s = prepared.restored.seconds
    stats.flash_attn = info.flash_attn
    stats.flash_attn_why = info.flash_attn_why
    stats.threads = info.threads
    stats.threads_why = info.threads_why
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
        model=model,
        template=template.name,
        reasoning=reasoning,
    )
    result.server_calls = list(outcome.server_calls)
    if _spells_the_reply(outcome.generated_ids, reply, reasoning, engine):
        result.token_ids = list(outcome.generated_ids)
    if fit.messages_dropped:
        result.notices.append(stats.trim_notice(prepared.budget.prompt_limit))
    if outcome.finish_reason == "loop":
        result.notices.append(LOOP_NOTICE)
    if prepared.structured is not None:
        result.parsed, result.error = prepared.structured.check(reply, outcome.finish_reason)
    return result


def _spells_the_reply(ids: list[int], reply: str, reasoning: str | None, engine: ChatEngine) -> bool:
    """Whether a reply's sampled ids are its text exactly, so that the next prompt gives them back
    as they are in the KV cache (llmchat.engine.prompt_pieces). A reasoning model's reply without
    thinking too (its thinking switched off, or none written): unless a marker that the text does
    not show is among them (an empty thinking block's control tokens), which the template would
    not render."""
    if not ids or reasoning or engine.detokenize(ids) != reply:
        return False
    return reasoning is None or not any(engine.is_control(token) for token in ids)


def _thinking_of(
    prepared: PreparedTurn,
    reply: str,
    tracker: ThinkingTracker | None,
    fmt: ReasoningFormat | None,
    engine: ChatEngine,
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
    if fmt is None:
        return None, reply, 0, None, False
    reasoning, answer = split_reply(fmt, reply, start_in_thinking=prepared.starts_thinking)
    # A reply decoded whole, nobody feeding its thinking: count the thinking text's own tokens.
    thinking = len(engine.tokenize(reasoning, special=False)) if reasoning else 0
    return reasoning, answer, thinking, None, False
