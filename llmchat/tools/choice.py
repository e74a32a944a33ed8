"""`--tool-choice` and `--chain-limit`: what each round of a tool turn offers and forces, as pure values.

- `auto` (the default): every tool is offered; the call grammar is lazy (it switches on at the
  family's trigger), so the model may answer in plain text.
- `required`: the first round must call one of the tools, held to the call grammar from its first
  token; later rounds are `auto`, so the model can answer with the results.
- a tool's name: like `required`, with only that tool in the first round's grammar.
- `none`: no tools are offered at all.
A chain of rounds stops after `--chain-limit` rounds that called tools (default 5), with one notice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from llmchat.defaults import DEFAULT_CHAIN_LIMIT
from llmchat.errors import UsageError

MODES = ("auto", "required", "none")


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # "auto" | "required" | "none" | "named"
    name: str | None = None


@dataclass(frozen=True)
class RoundPlan:
    offered: tuple[str, ...]  # the tools the template lists this round
    grammar_tools: tuple[str, ...]  # the tools the call grammar allows
    forced: bool  # the grammar holds the reply from its first token (else lazy, or none)


def parse_tool_choice(value: str, tool_names: Sequence[str]) -> ToolChoice:
    """`--tool-choice VALUE`; a name that is not an offered tool is a usage error naming the choices."""
    if value in MODES:
        return ToolChoice(value)
    if value in tool_names:
        return ToolChoice("named", value)
    choices = ", ".join([*MODES, *tool_names])
    raise UsageError(f"--tool-choice {value}: not a mode or an offered tool; use one of {choices}")


def plan_round(choice: ToolChoice, round_index: int, tool_names: Sequence[str]) -> RoundPlan:
    """What round `round_index` (0 = the first generation of the turn) offers and forces."""
    names = tuple(tool_names)
    if choice.mode == "none" or not names:
        return RoundPlan((), (), False)
    if round_index == 0 and choice.mode == "required":
        return RoundPlan(names, names, True)
    if round_index == 0 and choice.mode == "named" and choice.name is not None:
        return RoundPlan(names, (choice.name,), True)
    return RoundPlan(names, names, False)


@dataclass
class ChainGuard:
    """Counts the rounds that called tools; past the limit, or after a round that only repeated
    calls already made, the next round runs no call and the person gets one notice."""

    limit: int = DEFAULT_CHAIN_LIMIT
    rounds_with_calls: int = 0
    notice_given: bool = False
    repeated: str | None = None  # the call a round repeated (its name)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise UsageError("--chain-limit must be 1 or more")

    def record_round(self) -> None:
        self.rounds_with_calls += 1

    def record_repeat(self, name: str) -> None:
        """A round whose every call was made before, with the same arguments. Its result is
        already in the conversation; a small model would otherwise repeat the call until the limit."""
        self.repeated = name

    @property
    def exhausted(self) -> bool:
        return self.rounds_with_calls >= self.limit or self.repeated is not None

    def notice(self) -> str | None:
        """The one line to show when the chain is stopped (None after the first time)."""
        if not self.exhausted or self.notice_given:
            return None
        self.notice_given = True
        if self.repeated is not None:
            return (
                f"the model called {self.repeated} again with the same arguments; the call was not run "
                "twice, and the model answers with the result it has"
            )
        return (
            f"tool chain stopped after {self.limit} rounds of calls (--chain-limit {self.limit}); "
            "the model answers with what it has"
        )
