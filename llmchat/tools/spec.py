"""What a tool is, and the record one call leaves.

A ToolSpec is the same whatever its source (a Python function, a configured command, an MCP
server's tool): a name, a description, a JSON schema for its arguments, and a `run` callable that
takes the validated arguments and returns text. Everything that makes a call safe (schema check,
approval, timeout, output cap) lives in execute.py, not in the sources.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

# "ask": a person approves each call on a terminal (and without one nothing runs unless approve-all
# is set). "always": the config says this tool may run without asking.
ApprovePolicy = Literal["ask", "always"]
APPROVE_POLICIES: tuple[str, ...] = ("ask", "always")

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_OUTPUT_BYTES = 16 * 1024

EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object
    source: str  # where it came from, for `tools list`: "functions:FILE", "config:tools.NAME", "mcp:SERVER"
    run: Callable[[dict[str, Any], float], str] = field(repr=False, compare=False)  # (arguments, timeout_s) -> text
    approve: ApprovePolicy = "ask"
    timeout_s: float | None = None  # None: the caller's default
    max_output_bytes: int | None = None  # None: the caller's default

    def openai_tool(self) -> dict[str, Any]:
        """The OpenAI-style entry that chat templates expect in their `tools` list."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class CallRecord:
    """One call, as the JSON record and the history will keep it."""

    name: str
    arguments: Any
    approved: bool
    duration_s: float
    result: str | None = None
    error: str | None = None

    @property
    def text_for_model(self) -> str:
        """What goes back to the model as the tool message: the result, or the error as text."""
        if self.error is None:
            return self.result or ""
        return self.error if self.error.startswith("Cancelled:") else f"Error: {self.error}"

    def as_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.error is None:
            record["result"] = self.result
        else:
            record["error"] = self.error
        record["approved"] = self.approved
        record["duration_s"] = round(self.duration_s, 6)
        return record


class ToolFailure(Exception):
    """A tool could not give a result (its command failed, its server died). The message is text for
    the model, not a traceback."""


class ToolTimeout(ToolFailure):
    pass
