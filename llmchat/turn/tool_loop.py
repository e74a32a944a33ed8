"""The tool loop: one turn in rounds of the same decode (generate, call, feed back, generate).

A round is the session's `prepare` + `decode` (a `RoundRunner`), as for any turn, and the session
keeps the turn's result as it keeps any other: the rounds are a strategy inside the turn, holding
their own state (the calls so far, the first round's prompt), never the session's. What differs
from a plain turn is only what surrounds the decode (the offer itself: llmchat.tools.offer):
- the prompt carries the tools and, after the user's message, the calls so far and their results
  (llmchat.tools.prompt), rendered through the model's own template and its trust boundary: a
  tool's output is message content, tokenized as text, never as control tokens;
- the round's reply is held to the family's call grammar: from its first token when the call is
  forced (`--tool-choice required` or a tool's name, first round only), lazily from the family's
  trigger text with `auto`, and the generic format's whole reply is always one JSON object;
- the reply is read as every finished reply is (llmchat.turn.reading.read_finished_reply: the family's
  parser, and the template's content markers off the text); each call is shown on stderr,
  approved or not (llmchat.tools.approval), run (llmchat.tools.execute) and its result goes back
  as a `tool` message. Every failure is text for the model: the turn goes on.
The rounds extend one prompt, so each round prefills only the calls and results (KV prefix reuse);
for that reason a server's changed tool list (notifications/tools/list_changed) is offered from the
next turn, never between two rounds (ToolOffer.refresh, before the first round).
A tool the model loads where the tools are offered lazily (llmchat.tools.lazy) is the one exception:
it joins from the next round, whose prompt is kept anew from there (one break of the reuse per load).
The chain stops when a reply calls nothing, or after `--chain-limit` rounds of calls, or at a reply
that only repeats calls already made with the same arguments (not run twice; one notice each): the
round after that still lists the tools (the same prefix) but runs no call.

An OpenAI-compatible server (caps.renders_template) renders the tools with its own template: they
go in the request's `tools`, each round's `tool_choice` replaces the grammar, and the round's calls
are the ones the server returned apart from the text (llmchat.tools.native).

Stats: the counts and times add up the rounds, `stats.rounds` has each; TTFT is the first round's,
`ttfa_s` the time to the final answer's first token. Each round's text streams up to its call
(`_RoundText`); the record's reply is the final answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from llmchat import interrupts
from llmchat.tools import native
from llmchat.tools.approval import format_call
from llmchat.tools.choice import ChainGuard, plan_round
from llmchat.tools.families import CALLS_IN_HEADERS, GENERIC
from llmchat.tools.prompt import assistant_tool_calls, tool_result
from llmchat.tools.spec import CallRecord
from llmchat.turn.reading import read_finished_reply

if TYPE_CHECKING:
    from llmchat.prompt.render import ResolvedTemplate
    from llmchat.tools.call_parsers import ParsedReply
    from llmchat.tools.families import Family
    from llmchat.tools.offer import ToolOffer
    from llmchat.turn.observer import TurnObserver
    from llmchat.turn.plan import PreparedTurn, TurnScope
    from llmchat.turn.record import TurnResult


INTERRUPTED_CALL = "Cancelled: interrupted by the user"

KeptPrefix = tuple[str, list[int]]  # a prompt's text and its token ids, as they are in the KV cache


class RoundRunner(Protocol):
    """What the rounds run on (a chat session): each round is prepared and decoded as any turn is.
    `after_user`: the calls so far and their results; `kept_prefix`: the first round's prompt,
    whose tokens later rounds keep as they are. `template`: the chat template the rounds render,
    whose content markers come off each reply."""

    @property
    def template(self) -> ResolvedTemplate: ...

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


class _RoundText:
    """A round's observer. The live readout goes on, and the reply's text streams as it is decoded
    up to the call: text that could be the start of the family's trigger waits for the next
    fragment, and the trigger cuts the stream (the call is shown on stderr when it runs, not as
    text). A round whose text cannot be told apart from its call (a forced call, the generic
    format's JSON, gpt-oss' channels) streams nothing: its answer is shown when the chain ends."""

    def __init__(self, observer: TurnObserver):
        self.observer = observer
        self.triggers: tuple[str, ...] | None = None  # None: this round's text is held back
        self._pending = ""
        self._cut = False
        self._ends_line = True

    def start_round(self, triggers: tuple[str, ...] | None) -> None:
        self.triggers = tuple(t.strip() for t in triggers if t.strip()) if triggers is not None else None
        self._pending, self._cut = "", False

    @property
    def streamed(self) -> bool:
        return self.triggers is not None

    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        self.observer.prefill_started(prompt_tokens, cached_tokens, context_limit)

    def text(self, fragment: str) -> None:
        if self.triggers is None or self._cut:
            return
        pending = self._pending + fragment
        found = [pending.find(t) for t in self.triggers if t in pending]
        if found:
            self._show(pending[: min(found)])
            self._pending, self._cut = "", True
            if not self._ends_line:  # the call's line (stderr) starts on a line of its own
                self._show("\n")
            return
        wait = max((n for t in self.triggers for n in range(len(t) - 1, 0, -1) if pending.endswith(t[:n])), default=0)
        self._show(pending[: len(pending) - wait])
        self._pending = pending[len(pending) - wait :]

    def _show(self, text: str) -> None:
        if text:
            self.observer.text(text)
            self._ends_line = text.endswith("\n")

    def thinking(self, fragment: str) -> None:
        self.observer.thinking(fragment)

    def token(self, generated: int, t_first: float, now: float) -> None:
        self.observer.token(generated, t_first, now)

    def finished(self, result: TurnResult) -> None:
        pass

    def round_ended(self) -> None:
        if self.triggers is not None and not self._cut:  # no trigger came: it was text after all
            self._show(self._pending)
        self._pending = ""
        self.observer.round_ended()


@dataclass
class _Round:
    result: TurnResult
    t_submit: float
    parsed: ParsedReply


def tool_rounds(
    runner: RoundRunner, offer: ToolOffer, user_text: str, observer: TurnObserver, scope: TurnScope | None = None
) -> tuple[PreparedTurn, TurnResult, BaseException | None]:
    """One turn with tools: rounds until a reply calls nothing (or the chain limit). Returns the
    last round's prepared turn, the turn's result (the final round's, with every call in
    `tool_calls` and the messages that carry them) and the exception that cut it, if one did:
    the session keeps the result as it keeps any turn's.

    A server that changed its tools since the last turn has them listed again first (the offer's
    refresh, with its notice); not between rounds, whose prompts keep the first round's prefix."""
    offer.refresh()
    if not offer.active:  # its last tools are gone: a turn without tools
        plain = runner.prepare(user_text, scope)
        return (plain, *runner.decode(plain, observer))
    guard = ChainGuard(offer.chain_limit)
    held = _RoundText(observer)
    after_user: list[dict[str, Any]] = []
    calls: list[CallRecord] = []
    made: dict[str, str] = {}  # the calls run in this turn (name and arguments): what the model read
    rounds: list[_Round] = []
    stopped: BaseException | None = None
    last_prepared = None
    kept: KeptPrefix | None = None  # later rounds extend the first one's prompt: its tokens stay as they were
    while True:
        # A lazily offered tool loaded by the last round's calls joins the list (llmchat.tools.lazy).
        names = list(offer.specs)
        schemas = {name: spec.parameters for name, spec in offer.specs.items()}
        final = guard.exhausted
        if final:
            line = guard.notice()
            if line:
                offer.io.notice(line)
        prepared = runner.prepare(user_text, scope, after_user=after_user, kept_prefix=kept)
        last_prepared = prepared
        prepared.keeps_markers = not offer.native  # read_round takes them off, after the calls
        plan = plan_round(offer.choice, len(rounds), names)
        if offer.native:  # the server holds its reply to its own call format
            prepared.tool_choice = native.round_choice(offer.choice, plan, final)
        elif final:
            if offer.family is GENERIC:  # the format's reply is JSON: held to an answer
                from llmchat.tools.grammar import answer_grammar

                prepared.tool_grammar = answer_grammar()
        elif plan.forced or offer.family is GENERIC:
            prepared.tool_grammar = offer.grammar(plan.grammar_tools, plan.forced)
        else:
            prepared.tool_grammar = offer.grammar(plan.grammar_tools, False, lazy=True)
            prepared.tool_trigger = offer.family.triggers[0]
        if kept is None:  # the first round, or the first after a load changed the tool block
            ids = prepared.prompt
            kept = (prepared.rendered_text, list(ids)) if isinstance(ids, list) else None
        if offer.markup:
            prepared.markup = {**(prepared.markup or {}), **offer.markup}
        held.start_round(_streamed_triggers(offer, plan.forced and not final))
        result, stopped = runner.decode(prepared, held, restore=not rounds)
        held.round_ended()
        # An interrupted reply is read too (its text before any call is the answer so far),
        # but no call of it runs.
        if offer.native:  # the calls came apart from the text
            parsed = native.parsed_reply(result.reply, result.server_calls)
            if plan.forced and not parsed.calls and result.finish_reason not in ("interrupted", "error"):
                offer.notice_once(native.missing_call_notice(result.finish_reason))
        else:
            parsed = read_round(runner.template.text, offer.family, result, schemas)
        rounds.append(_Round(result, prepared.t_submit, parsed))
        if stopped is not None or result.finish_reason in ("interrupted", "error") or final or not parsed.calls:
            break
        first_index = sum(1 for message in after_user if message["role"] == "tool")  # the calls' ids
        call_pairs = [(call.name, call.arguments) for call in parsed.calls]
        # The round's thinking goes with its calls: the template decides whether the next round sees it.
        thought = assistant_tool_calls(call_pairs, parsed.content, first_index, reasoning=result.reasoning)
        messages: list[dict[str, Any]] = [thought]
        keys = [_call_key(call.name, call.arguments) for call in parsed.calls]
        if all(key in made for key in keys):
            # Not run twice: the earlier results go back again, and the next round answers.
            guard.record_repeat(parsed.calls[0].name)
            for number, (call, key) in enumerate(zip(parsed.calls, keys)):
                messages.append(tool_result(first_index + number, call.name, made[key]))
            after_user.extend(messages)
            continue
        cut: BaseException | None = None  # Ctrl-C or SIGTERM while a call ran
        for number, call in enumerate(parsed.calls):
            if cut is None:
                try:
                    offer.io.show_call(format_call(call.name, call.arguments))
                    done = _run(offer, call.name, call.arguments)
                except (KeyboardInterrupt, SystemExit) as err:
                    cut = err
            if cut is not None:  # this call and any after it: each call keeps its result message
                done = CallRecord(call.name, call.arguments, False, 0.0, error=INTERRUPTED_CALL)
            elif done.approved and done.error is not None:  # the model reads it too; the person sees it here
                offer.io.notice(f"tool call {call.name} failed: {done.error.splitlines()[0] if done.error else ''}")
            elif done.approved and offer.io.show_result is not None:  # what the model is told
                offer.io.show_result(done)
            calls.append(done)
            made[keys[number]] = done.text_for_model
            messages.append(tool_result(first_index + number, call.name, done.text_for_model))
        after_user.extend(messages)
        if offer.take_loaded():  # the tools rendered before the conversation changed: once per load
            kept = None
        if cut is not None:
            # The turn ends here and is saved with the calls made so far, marked interrupted,
            # as a reply cut by Ctrl-C is; a SIGTERM then ends the process.
            result.finish_reason = "interrupted"
            if isinstance(cut, KeyboardInterrupt):
                interrupts.consume()
            else:
                stopped = cut
            break
        guard.record_round()
    assert last_prepared is not None
    final_result = _combine(rounds, calls, after_user, user_text)
    if final_result.reply and stopped is None and not held.streamed:
        observer.text(final_result.reply)
    return last_prepared, final_result, stopped


def read_round(template_source: str, family: Family, result: TurnResult, schemas: Mapping[str, Any]) -> ParsedReply:
    """A round's reply read as every finished reply is (llmchat.turn.reading.read_finished_reply, which
    `template parse` and the reference cases go through too): its calls, and its text without the
    template's content markers. A call written inside the open thinking block moves to the reply,
    with the thinking after it, as llama.cpp ends the thinking at the call."""
    # gpt-oss writes its call in the channel header (`to=functions.NAME`), which the reasoning
    # split leaves out of the answer: the reading finds it in the whole reply.
    reading = read_finished_reply(
        template_source, family, result.reply, result.reasoning or "", schemas, whole_reply=result.raw_reply
    )
    result.reply = reading.answer
    if result.reasoning is not None:  # None: the model has no reasoning format, nothing was split off
        result.reasoning = reading.reasoning
    return reading.parsed


def _streamed_triggers(offer: ToolOffer, forced: bool) -> tuple[str, ...] | None:
    """Where a round's streamed text is cut: at the family's triggers; () for a server that sends
    its calls apart from the text; None where the text is not streamed (see _RoundText)."""
    if offer.native:
        return ()
    # Functionary v3.2 begins every reply with a recipient (`all` for text) that is no answer.
    if forced or offer.family is GENERIC or offer.family.id in (*CALLS_IN_HEADERS, "functionary_v3_2"):
        return None
    return offer.family.triggers


def _call_key(name: str, arguments: Any) -> str:
    return name + "\0" + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _run(offer: ToolOffer, name: str, arguments: Any) -> CallRecord:
    from llmchat.tools.execute import run_call

    return run_call(offer.specs, name, arguments, offer.policy, ask=offer.io.ask, notify=offer.io.notice)


def _combine(rounds: list[_Round], calls: list[CallRecord], after_user: list[dict[str, Any]], user: str) -> TurnResult:
    """The final round's result, with the answer parsed out of its reply and stats over all rounds."""
    first, last = rounds[0], rounds[-1]
    result = last.result
    raw = result.reply
    result.reply = last.parsed.content
    if result.reply != raw:
        result.token_ids = None  # the ids spell the raw reply, not the answer shown
    result.user = user
    result.tool_calls = list(calls)
    result.tool_messages = list(after_user)
    notices: list[str] = []
    for each in rounds:
        notices.extend(line for line in each.result.notices if line not in notices)
    result.notices = notices
    per_round = [r.result.stats for r in rounds]
    stats = replace(result.stats, finish_reason=result.finish_reason)  # a call cut short: interrupted
    stats.ttft_s = first.result.stats.ttft_s
    stats.server = first.result.stats.server  # a server's own timings, next to the TTFT they explain
    stats.total_s = time.perf_counter() - first.t_submit
    stats.prefill_s = sum(s.prefill_s for s in per_round)
    stats.decode_s = sum(s.decode_s for s in per_round)
    stats.prompt_tokens = sum(s.prompt_tokens for s in per_round)
    stats.cached_tokens = sum(s.cached_tokens for s in per_round)
    stats.generated_tokens = sum(s.generated_tokens for s in per_round)
    stats.answer_tokens = sum(s.answer_tokens for s in per_round)
    stats.thinking_tokens = sum(s.thinking_tokens for s in per_round)
    stats.context_used = last.result.stats.prompt_tokens + last.result.stats.generated_tokens
    stats.loop_steered = sum(s.loop_steered for s in per_round)
    last_ttfa = last.result.stats.ttfa_s
    # The final answer's first token, from when the turn was submitted (the last round's own
    # clock started when that round was prepared).
    stats.ttfa_s = (last.t_submit - first.t_submit + last_ttfa) if last_ttfa is not None and result.reply else None
    stats.rounds = [
        {
            "prompt_tokens": s.prompt_tokens,
            "cached_tokens": s.cached_tokens,
            "generated_tokens": s.generated_tokens,
            "ttft_s": round(s.ttft_s, 4),
            "prefill_s": round(s.prefill_s, 4),
            "decode_s": round(s.decode_s, 4),
            "finish_reason": s.finish_reason,
        }
        for s in per_round
    ]
    if first.result.stats.disk_cached_tokens:
        stats.disk_cached_tokens = first.result.stats.disk_cached_tokens
        stats.restore_s = first.result.stats.restore_s
    result.stats = stats
    return result
