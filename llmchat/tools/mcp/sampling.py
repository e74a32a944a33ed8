"""A server's `sampling/createMessage`, answered by the run's own model after the person approves.

Giving the SDK this callback declares the sampling capability; a run declares it only where a
model will answer (`ask`, `chat`, `batch`: llmchat.tools.mcp.run_mode, before any server starts), so
`llmchat mcp` and `tools list`, which load no model, never do. The session's side (the turn that
answers, llmchat.turn.sampled) is handed over once it exists (answer_with).

- The request is checked first: text messages only, the last one the user's, no tools, and
  `maxTokens` from 1 up to the model's cap (the run's reply cap: --max-tokens, else 2,048). A
  request that breaks a rule gets an error answer naming why (invalid params): the call that
  caused it fails in one line, for the model, and the turn goes on.
- The person approves it (llmchat.edges.person): the messages, the system prompt and the token limit,
  terminal-safe (they are the server's text), then "Let the model answer?". `approve = "always"`
  in the server's config table answers without asking. Where nobody is there (no terminal, a
  batch), and without that setting, it is declined at once with one notice saying how to allow it.
- The completion runs on the thread that waits for the server's request (llmchat.tools.mcp.desk),
  the one that owns the engine: the tool loop runs calls between two decodes, never during one,
  so a request waits for the decode before it, never shares the engine with it. A request that
  comes while no request of llmchat's to that server waits (mid-decode, between turns) is
  declined at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, Any, Protocol

from llmchat.edges import person as people
from llmchat.edges.safe_text import for_stream
from llmchat.output import is_tty, notice
from llmchat.tools.mcp import run_mode
from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.desk import NobodyWaits, PersonDesk
from llmchat.tools.mcp.elicitation import Elicitation

QUESTION = "Let the model answer? [y/N] "
DECLINED = -1  # the spec's code for "the user rejected the request"
SHOWN_CHARS = 2000  # of each message on the terminal: enough to judge, not a screenful of a document


@dataclass(frozen=True)
class SampleRequest:
    """What the server asks the model: the conversation (role and text), its system prompt, and
    the reply's limits."""

    messages: tuple[tuple[str, str], ...]
    system: str | None
    max_tokens: int
    temperature: float | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sampled:
    """The model's completion: its text, the model's name, and why it ended (the turn's finish_reason)."""

    text: str
    model: str
    finish_reason: str
    tokens: int = 0  # the stats of its turn, for the one line that says it ran
    seconds: float = 0.0


class SamplingModel(Protocol):
    """The run's model, as a sampling request uses it (llmchat.turn.sampled)."""

    @property
    def cap(self) -> int: ...  # the most tokens one request may ask for

    def __call__(self, request: SampleRequest) -> Sampled: ...


class SamplingError(Exception):
    """A request llmchat will not answer; the message says why, for the server."""


def answer_with(model: SamplingModel | None) -> None:
    """The model that answers from now on (None: the session closed; requests are refused)."""
    run_mode.answer_with(model)


def person_callbacks(label: str, server: McpServerConfig, desk: PersonDesk, stderr: IO[str]) -> dict[str, Any]:
    """The SDK's callbacks that reach the person (and the model) for one connection: elicitation
    always, sampling where this run declares it (approved by the server's `approve`)."""
    callbacks: dict[str, Any] = {"elicitation_callback": Elicitation(label, stderr, desk, server.elicitation)}
    if run_mode.sampling_declared():
        callbacks["sampling_callback"] = Sampling(label, server, desk, stderr)
    return callbacks


class Sampling:
    def __init__(self, label: str, server: McpServerConfig, desk: PersonDesk, stderr: IO[str]):
        self.label = label
        self.server = server
        self.approved = server.approve == "always"
        self.desk = desk
        self.stderr = stderr

    async def __call__(self, context: Any, params: Any) -> Any:
        model: SamplingModel | None = run_mode.answering_model()
        if model is None:
            return _error(f"{self.label}: no model is loaded to answer it")
        try:
            request = sample_request(params, model.cap)
        except SamplingError as err:
            return _error(f"llmchat cannot answer this: {err}")
        person = people.current()
        if not self.approved and not person.present():
            self._notice(
                f"llmchat: {self.label} asks the model for a completion ({_one_line(request.messages[-1][1])}): "
                f"declined, no terminal to ask on ({self._how_to_allow()})"
            )
            return _declined()
        try:
            return await self.desk.ask(lambda: self._answer(model, request, person))
        except NobodyWaits:
            self._notice(f"llmchat: {self.label} asked the model for a completion while nothing waited on it: declined")
            return _error(f"{self.label}: the request came while llmchat waited on nothing of this server's")

    def _how_to_allow(self) -> str:
        """Where `approve = "always"` goes for this server: its config table, or one to add for it
        (a server given with --mcp has none, and one named like a configured server is that one)."""
        name = self.server.name
        if self.server.source == f"config:mcp.{name}":
            return f'approve = "always" in its config table [mcp.{name}] allows it'
        return f'an [mcp.{name}] table in the config for it, with approve = "always", allows it'

    def _answer(self, model: SamplingModel, request: SampleRequest, person: people.Person) -> Any:
        """On the waiting thread: ask the person (unless approved), then run the model."""
        if not self.approved and not self._approved_now(request, person):
            return _declined()
        try:
            sampled = model(request)
        except (KeyboardInterrupt, SystemExit):  # the user stopped it: the turn ends, as in decode
            raise
        except Exception as err:  # a prompt too big for the context, an engine failure: one line
            self._notice(f"llmchat: {self.label}: the completion it asked for failed: {_one_line(str(err))}")
            return _error(f"the completion failed: {_one_line(str(err))}")
        self._notice(
            f"llmchat: {self.label}: the model answered it: {sampled.tokens:,} tokens in {sampled.seconds:.1f} s "
            f"({sampled.finish_reason})"
        )
        return _result(sampled)

    def _approved_now(self, request: SampleRequest, person: people.Person) -> bool:
        limits = f"at most {request.max_tokens:,} tokens"
        if request.temperature is not None:
            limits += f", temperature {request.temperature:g}"
        about = [f"llmchat: {self.label} asks the model for a completion ({limits}):"]
        if request.system:
            about.append(f"  system: {_shown(request.system)}")
        about += [f"  {role}: {_shown(text)}" for role, text in request.messages]
        typed = person.ask(QUESTION, about=about)
        if typed is None or typed.strip().lower() not in ("y", "yes"):
            person.say("declined")
            return False
        return True

    def _notice(self, line: str) -> None:
        notice(for_stream(line, is_tty(self.stderr)), self.stderr)


def sample_request(params: Any, cap: int) -> SampleRequest:
    """The SDK's CreateMessageRequestParams as a SampleRequest; SamplingError when llmchat cannot answer it."""
    if getattr(params, "tools", None):
        raise SamplingError("it offers tools, which llmchat does not declare for sampling")
    messages: list[tuple[str, str]] = []
    for number, message in enumerate(params.messages, 1):
        blocks = message.content if isinstance(message.content, list) else [message.content]
        texts = []
        for block in blocks:
            kind = getattr(block, "type", "?")
            if kind != "text":
                raise SamplingError(f"message {number} holds {kind} content; llmchat's model reads text only")
            texts.append(block.text)
        messages.append((message.role, "\n".join(texts)))
    if not messages or messages[-1][0] != "user":
        raise SamplingError("the last message must be the user's")
    max_tokens = params.max_tokens
    if max_tokens < 1:
        raise SamplingError(f"maxTokens is {max_tokens}; it must be at least 1")
    if max_tokens > cap:
        raise SamplingError(f"it asks for up to {max_tokens:,} tokens, above the cap of {cap:,} (--max-tokens)")
    temperature = params.temperature
    if temperature is not None and not 0 <= temperature <= 2:
        raise SamplingError(f"temperature {temperature:g} is outside 0 to 2")
    return SampleRequest(
        tuple(messages), params.system_prompt or None, max_tokens, temperature, tuple(params.stop_sequences or ())
    )


def _result(sampled: Sampled) -> Any:
    from mcp_types import CreateMessageResult, TextContent

    reason = {"length": "maxTokens", "stop": "endTurn"}.get(sampled.finish_reason, sampled.finish_reason)
    return CreateMessageResult(
        role="assistant", content=TextContent(type="text", text=sampled.text), model=sampled.model, stop_reason=reason
    )


def _error(message: str, code: int | None = None) -> Any:
    from mcp_types import INVALID_PARAMS, ErrorData

    return ErrorData(code=INVALID_PARAMS if code is None else code, message=message)


def _declined() -> Any:
    return _error("the user declined the sampling request", DECLINED)


def _shown(text: str) -> str:
    flat = text.replace("\n", "\n    ")
    return flat if len(flat) <= SHOWN_CHARS else flat[: SHOWN_CHARS - 1] + "…"


def _one_line(text: str, limit: int = 120) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
