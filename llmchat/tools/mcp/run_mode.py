"""What this run offers the MCP servers it starts, set by the command before any server starts:
whether a model answers their sampling requests (`ask`, `chat`, `batch`: they load one; `llmchat
mcp` and `tools list` do not), and whether a person attends it (`batch` runs its items unattended,
maybe in parallel: elicitation is declined at once, sampling answered only where the server's
config approves it). One run, one setting; a module of its own so that a one-shot `ask` sets it
without importing the MCP machinery."""

from __future__ import annotations

from typing import IO, Any

_run = {"model_answers": False, "attended": True}
# The model that answers sampling requests, handed over once loaded (llmchat.turn.sampled); a
# llmchat.tools.mcp.sampling.SamplingModel. One run, one model (/model swaps the engine inside it).
_answering: list[Any] = [None]


def model_answers(on: bool = True, *, attended: bool = True) -> None:
    """This run has a model to answer sampling (declared to the servers it starts); `attended`
    False: nobody is there to approve a request or answer an elicitation."""
    _run["model_answers"], _run["attended"] = on, attended


def nobody_to_ask() -> None:
    """For the rest of this run, nobody attends it (`llmchat batch`)."""
    _run["attended"] = False


def sampling_declared() -> bool:
    return _run["model_answers"]


def attended() -> bool:
    return _run["attended"]


def person_at(stdin: IO[str], stderr: IO[str]) -> bool:
    """Whether a person can be asked: stdin and stderr are a terminal, and the run is attended."""
    try:
        return attended() and stdin.isatty() and stderr.isatty()
    except (AttributeError, ValueError, OSError):  # closed, or replaced by something without a tty
        return False


def answer_with(model: Any) -> None:
    """The model that answers from now on (None: the session closed; requests are refused)."""
    _answering[0] = model


def answering_model() -> Any:
    return _answering[0]
