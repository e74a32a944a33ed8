"""What this run offers the MCP servers it starts, set by the command before any server starts:
whether a model answers their sampling requests (`ask`, `chat`, `batch`: they load one; `llmchat
mcp` and `tools list` do not). Whether a person attends the run is the run's Person's
(llmchat.edges.person: `batch` makes one nobody attends). One run, one setting; a module of its own so
that a one-shot `ask` sets it without importing the MCP machinery."""

from __future__ import annotations

from typing import Any

_run = {"model_answers": False}
# The model that answers sampling requests, handed over once loaded (llmchat.turn.sampled); a
# llmchat.tools.mcp.sampling.SamplingModel. One run, one model (/model swaps the engine inside it).
_answering: list[Any] = [None]


def model_answers(on: bool = True) -> None:
    """This run has a model to answer sampling (declared to the servers it starts)."""
    _run["model_answers"] = on


def sampling_declared() -> bool:
    return _run["model_answers"]


def answer_with(model: Any) -> None:
    """The model that answers from now on (None: the session closed; requests are refused)."""
    _answering[0] = model


def answering_model() -> Any:
    return _answering[0]
