"""Who lets a tool call run: a pure decision, so it can be tested without a terminal.

On a terminal the person is asked each time: yes, no, or always for this tool (remembered for the
session). Without one nothing runs, unless approve-all was given (`--approve-tools`) or the config
says `approve = "always"` for that tool. A refusal goes back to the model as text, and the person
gets one notice per tool saying how to allow it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Answer = Literal["yes", "no", "always"]
APPROVE_ALL_FLAG = "--approve-tools"


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

    def decide(self, tool: str, configured: str = "ask") -> Decision:
        """Before asking: run, refuse, or ask. `configured` is the tool's `approve` setting."""
        if self.approve_all or configured == "always" or tool in self.always:
            return Decision(run=True)
        if self.interactive:
            return Decision(run=False, ask=True)
        return Decision(run=False, notice=self._notice_once(tool))

    def answer(self, tool: str, answer: Answer) -> Decision:
        """After asking: the person's answer, remembered when it is "always"."""
        if answer == "always":
            self.always.add(tool)
            return Decision(run=True)
        if answer == "yes":
            return Decision(run=True)
        return Decision(run=False)

    def _notice_once(self, tool: str) -> str | None:
        if tool in self._noticed:
            return None
        self._noticed.add(tool)
        return (
            f"tool call {tool} refused: there is no terminal to ask; allow it with {APPROVE_ALL_FLAG} "
            f'or approve = "always" in its config table'
        )


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


def ask_on_terminal(tool: str, arguments_text: str, read: Callable[[str], str]) -> Answer:
    """Ask until the answer is one we know; `read` prints the prompt and returns a line (input())."""
    while True:
        answer = parse_answer(read(f"run {tool}({arguments_text})? [y]es / [N]o / [a]lways for this tool: "))
        if answer is not None:
            return answer


def format_call(name: str, arguments: Any) -> str:
    """A call as it is shown before it runs (stderr; dimmed in chat): the name and the exact
    arguments, never shortened, so the person approves what will actually run."""
    return f"{name}({json.dumps(arguments, ensure_ascii=False, sort_keys=True)})"
