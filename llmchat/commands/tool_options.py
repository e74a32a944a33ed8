"""The tool options of `ask` and `chat` (-T, --functions, --mcp, --tool-choice, --chain-limit,
--approve-tools), and offering the chosen tools to a session.

The tools are gathered before the model loads (a bad --functions file or an unknown -T NAME is a
usage error at once; MCP servers start here and are stopped with the ToolSet). Calls are shown on
stderr before they run; on a terminal (stdin and stderr) the person is asked yes / no / always,
and without one nothing runs unless --approve-tools or the tool's `approve = "always"`.
(No `from __future__ import annotations`: Typer reads the annotations at run time.)
"""

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Optional, TextIO

import typer

from llmchat import interrupts
from llmchat.commands.tools import FUNCTIONS_HELP, MCP_HELP, TOOL_HELP

if TYPE_CHECKING:
    from llmchat.session import ChatSession
    from llmchat.tools.approval import Answer
    from llmchat.tools.registry import ToolSet

TOOLS = "Tools"

ToolOption = Annotated[Optional[list[str]], typer.Option("--tool", "-T", help=TOOL_HELP, rich_help_panel=TOOLS)]
FunctionsOption = Annotated[
    Optional[list[str]], typer.Option("--functions", help=FUNCTIONS_HELP, rich_help_panel=TOOLS)
]
McpOption = Annotated[Optional[list[str]], typer.Option("--mcp", help=MCP_HELP, rich_help_panel=TOOLS)]
ToolChoiceOption = Annotated[
    str,
    typer.Option(
        "--tool-choice",
        help="auto (the model decides) | required (the first reply must call a tool) | NAME (must call that tool) | none.",
        rich_help_panel=TOOLS,
    ),
]
ChainLimitOption = Annotated[
    int,
    typer.Option("--chain-limit", help="Stop after this many rounds of tool calls in one turn.", rich_help_panel=TOOLS),
]
ApproveToolsOption = Annotated[
    bool,
    typer.Option(
        "--approve-tools",
        help="Run every tool call without asking (without a terminal nothing runs unless this is given).",
        rich_help_panel=TOOLS,
    ),
]


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    mcp: tuple[str, ...] = ()
    tool_choice: str = "auto"
    chain_limit: int = 5
    approve_all: bool = False

    @property
    def wanted(self) -> bool:
        return bool(self.tools or self.functions or self.mcp)


def tool_request(
    tool: Optional[list[str]],
    functions: Optional[list[str]],
    mcp: Optional[list[str]],
    tool_choice: str,
    chain_limit: int,
    approve_tools: bool,
    *,
    offered_elsewhere: bool = False,
) -> ToolRequest:
    """The options, checked. `offered_elsewhere`: tools may come from elsewhere too (batch items),
    so a --tool-choice without -T/--functions/--mcp is checked there."""
    from llmchat.errors import UsageError

    request = ToolRequest(
        tuple(tool or ()), tuple(functions or ()), tuple(mcp or ()), tool_choice, chain_limit, approve_tools
    )
    if chain_limit < 1:
        raise UsageError("--chain-limit must be 1 or more")
    if not request.wanted and not offered_elsewhere and tool_choice not in ("auto", "none"):
        raise UsageError(f"--tool-choice {tool_choice}: no tools are offered; add -T, --functions or --mcp")
    return request


def gather(request: ToolRequest) -> "Optional[ToolSet]":
    """The chosen tools (MCP servers started), before the model loads; None when none were asked for."""
    if not request.wanted:
        return None
    from llmchat.config import load_config
    from llmchat.tools.choice import parse_tool_choice
    from llmchat.tools.registry import gather_tools

    toolset = gather_tools(load_config(), request.tools, request.functions, request.mcp)
    try:
        parse_tool_choice(request.tool_choice, list(toolset.tools))  # a wrong NAME: exit 2 before the load
    except BaseException:
        toolset.close()
        raise
    return toolset


@contextmanager
def closed_on_failure(toolset: "ToolSet | None") -> Iterator[None]:
    """Close the gathered tools (their MCP servers) when the block fails, then let it fail."""
    try:
        yield
    except BaseException:
        if toolset is not None:
            toolset.close()
        raise


def offer(session: "ChatSession", toolset: "ToolSet", request: ToolRequest, *, dim: bool = False) -> None:
    """Offer the tools to the session's model. `dim`: calls shown dimmed (the interactive chat)."""
    from llmchat.output import is_tty, notice
    from llmchat.turn.tool_loop import ToolIO, make_offer

    answers = answer_source() if is_tty(sys.stderr) else None
    interactive = answers is not None

    def show_call(text: str) -> None:
        line = f"tool call: {text}"
        if dim or is_tty(sys.stderr):
            notice(line)  # dimmed on a terminal
        else:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    io = ToolIO(
        show_call=show_call,
        notice=notice,
        ask=(lambda name, arguments: ask_on_terminal(name, arguments, answers)) if answers is not None else None,
    )
    session.tools = make_offer(
        session,
        toolset.specs(),
        io,
        tool_choice=request.tool_choice,
        chain_limit=request.chain_limit,
        approve_all=request.approve_all,
        interactive=interactive,
    )


def answer_source() -> TextIO | None:
    """Where the person's answers to approval questions come from: stdin on a terminal; with stdin
    piped (`cat notes.txt | llmchat ask ...`), the controlling terminal, as sudo and ssh ask for a
    password; None where there is no terminal at all (then nothing runs unapproved)."""
    from llmchat.output import is_tty

    if is_tty(sys.stdin):
        return sys.stdin
    try:
        return open("/dev/tty", encoding="utf-8", errors="replace")  # closed at exit
    except OSError:
        return None


def ask_on_terminal(name: str, arguments: Any, answers: TextIO | None = None) -> "Answer":
    """Ask on the terminal (stderr for the question, `answers` (stdin) for the answer). End of
    input and Ctrl-C at the question are no: the call is refused and the turn goes on."""
    from llmchat.tools.approval import ask_on_terminal as ask_until_known

    source = answers if answers is not None else sys.stdin

    def read(question: str) -> str:
        sys.stderr.write(question)
        sys.stderr.flush()
        try:
            line = source.readline()
        except KeyboardInterrupt:  # Ctrl-C at the question is a "no", not the end of the run
            interrupts.consume()
            sys.stderr.write("\n")
            return "n"
        return line if line else "n"

    return ask_until_known(name, json.dumps(arguments, ensure_ascii=False, sort_keys=True), read)
