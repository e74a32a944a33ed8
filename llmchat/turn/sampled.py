"""A server's sampling request (llmchat.tools.mcp.sampling) answered by the session's model.

The completion is a turn of its own through the session's one road (`prepare` + `decode`: the
template, the stop rules, the stats), scoped (llmchat.turn.plan.TurnScope) to the server's
messages and system prompt, with no tools, the server's temperature and stop sequences and its
maxTokens as the reply cap. It is never part of the conversation nor saved.

It runs while the conversation's turn waits for a tool call, between two rounds of the same KV
prefix. On the local engine the conversation's sequence state is kept in memory first (one copy,
`kept_sequence`) and put back after, so the next round reuses its whole prefix as if nothing had
run; a server engine (--server) has its own prefix cache, whose next round is prefilled again
where needed.

Only the run's switches (llmchat.tools.mcp.run_mode) are imported with this module: the MCP
machinery comes with the first request, so a one-shot `ask` that starts no server never loads it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, cast

from llmchat.tools.mcp.run_mode import answer_with, sampling_declared
from llmchat.turn.conversation import Conversation
from llmchat.turn.observer import NullObserver
from llmchat.turn.plan import TurnScope
from llmchat.turn.policy import reply_cap

if TYPE_CHECKING:
    from llmchat.engine.core import Engine
    from llmchat.tools.mcp.sampling import Sampled, SampleRequest
    from llmchat.turn.session import ChatSession


def answer_sampling(session: ChatSession) -> None:
    """Where this run declares sampling, the session's model answers it from now on."""
    if sampling_declared():
        answer_with(SessionSampler(session))


class SessionSampler:
    """The session's model as a SamplingModel: its cap is the session's reply cap (--max-tokens)."""

    def __init__(self, session: ChatSession):
        self.session = session

    @property
    def cap(self) -> int:
        return reply_cap(self.session.sampling)

    def __call__(self, request: SampleRequest) -> Sampled:
        session = self.session
        *earlier, (_, user_text) = request.messages
        conversation = Conversation(system=request.system)
        conversation.messages = [{"role": role, "content": text} for role, text in earlier]
        sampling = replace(
            session.sampling,
            max_tokens=request.max_tokens,
            temperature=session.sampling.temperature if request.temperature is None else request.temperature,
            stop=tuple(session.sampling.stop) + request.stop,
        )
        tools = replace(session.tools, enabled=False) if session.tools is not None else None
        scope = TurnScope(conversation=conversation, sampling=sampling, overflow="error", tools=tools)
        with kept_sequence(session):
            prepared = session.prepare(user_text, scope)
            prepared.structured = None  # a --schema holds the conversation's replies, not the server's
            result, stopped = session.decode(prepared, NullObserver(), restore=False)
        if stopped is not None:
            raise stopped
        stats = result.stats
        from llmchat.tools.mcp.sampling import Sampled

        return Sampled(result.reply, session.model_label, result.finish_reason, stats.generated_tokens, stats.total_s)


class kept_sequence:
    """The local engine's sequence (its tokens and KV cells) as it was, put back on the way out.

    One copy of the state is held meanwhile, and none after: llama.cpp writes it into the buffer
    kept here (`Engine.sequence_state`) and reads it back from there. Prefilling the conversation
    again instead would hold nothing, but costs the whole prefix's prefill where the copy costs a
    memory copy each way: on SmolLM2 at 4,096 tokens the copy holds 90 MiB and takes 0.11 s,
    taken and put back, where prefilling again took 61 s on a shared 2-core Xeon under load
    (bench/sampling_prefix.py; bench/results/sampling_prefix_2026-12-07_xeon_loaded.md). An 8B
    model at 32K tokens holds 4 GiB, and its prefill takes minutes on a CPU."""

    def __init__(self, session: ChatSession):
        engine = session.engine
        # Only an engine whose state can be saved (the local one: disk_cache) has a state to put back.
        self.engine: Engine | None = cast("Engine", engine) if engine.caps.disk_cache else None
        self.tokens: list[int] = []
        self.state = bytearray()

    def __enter__(self) -> None:
        if self.engine is not None:
            self.tokens = self.engine.evaluated_tokens()
            self.state = self.engine.sequence_state()

    def __exit__(self, *exc: object) -> None:
        state, self.state = self.state, bytearray()  # dropped once put back
        if self.engine is not None and self.tokens:
            self.engine.restore_sequence(self.tokens, state, len(self.tokens))
