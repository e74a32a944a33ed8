"""Who lets a tool call run: a pure decision, so it can be tested without a terminal.

Where a person is there (llmchat.edges.person) they are asked each time: yes, no, or always for this
tool (remembered for the session); Ctrl-C or the end of input at the question is no. Elsewhere
nothing runs, unless approve-all was given (`--approve-tools`) or the config says
`approve = "always"` for that tool. A refusal goes back to the model as text, and the person gets
one notice per tool saying how to allow it: the flag, and the tool's config table where it has one
(a function or a server given with --mcp has none).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Answer = Literal["yes", "no", "always"]
APPROVE_ALL_FLAG = "--approve-tools"
CONFIG_SOURCE = "config:"  # the source of a tool from a config table: "config:tools.NAME", "config:mcp.NAME"


@dataclass(frozen=True)
class Decision:
    run: bool
    ask: bool = False  # the caller must ask the person (only ever on a terminal)
    notice: str | None = None  # one line for stderr, once per tool


@dataclass
class ApprovalPolicy:
    interactive: bool  # stdin and stderr are a terminal: a person can answer
    approve_all: bool = False  # --approve-tools
    always: set[str] = field(default_factory=set)  # tools the person answered "always" for, this session
    _noticed: set[str] = field(default_factory=set)

    def decide(self, tool: str, configured: str = "ask", source: str = "") -> Decision:
        """Before asking: run, refuse, or ask. `configured` is the tool's `approve` setting, and
        `source` where it comes from (ToolSpec.source: "config:tools.NAME", "config:mcp.NAME", ...)."""
        if self.approve_all or configured == "always" or tool in self.always:
            return Decision(run=True)
        if self.interactive:
            return Decision(run=False, ask=True)
        return Decision(run=False, notice=self._notice_once(tool, source))

    def answer(self, tool: str, answer: Answer) -> Decision:
        """After asking: the person's answer, remembered when it is "always"."""
        if answer == "always":
            self.always.add(tool)
            return Decision(run=True)
        if answer == "yes":
            return Decision(run=True)
        return Decision(run=False)

    def _notice_once(self, tool: str, source: str) -> str | None:
        if tool in self._noticed:
            return None
        self._noticed.add(tool)
        allow = APPROVE_ALL_FLAG
        if source.startswith(CONFIG_SOURCE):  # its `approve` is "ask", or it would have run
            allow += f' or approve = "always" in its config table [{source.removeprefix(CONFIG_SOURCE)}]'
        return f"tool call {tool} refused: there is no terminal to ask; allow it with {allow}"


def refusal_text(tool: str, interactive: bool) -> str:
    """What the model reads when a call was not allowed (so it can answer without the tool)."""
    who = "The user declined" if interactive else "Tool calls are not allowed in this session; declined"
    return f"Cancelled: {who} the call to {tool}. Do not retry it; answer without it."


def parse_answer(text: str) -> Answer | None:
    """A typed answer: y/yes, n/no, a/always (case-insensitive); anything else asks again."""
    word = text.strip().lower()
    if word in ("y", "yes"):
        return "yes"
    if word in ("n", "no", ""):
        return "no"
    if word in ("a", "always"):
        return "always"
    return None


def ask_approval(tool: str, arguments: Any, ask: Callable[[str], str | None]) -> Answer:
    """Ask until the answer is one we know. `ask` shows the question and returns the line typed
    (llmchat.edges.person.Person.ask): None, no answer (Ctrl-C, the end of input), is no."""
    question = f"run {format_call(tool, arguments)}? [y]es / [N]o / [a]lways for this tool: "
    while True:
        typed = ask(question)
        answer = parse_answer(typed) if typed is not None else "no"
        if answer is not None:
            return answer


def format_call(name: str, arguments: Any) -> str:
    """A call as it is shown before it runs (stderr; dimmed in chat): the name and the exact
    arguments, never shortened, so the person approves what will actually run."""
    return f"{name}({json.dumps(arguments, ensure_ascii=False, sort_keys=True)})"
