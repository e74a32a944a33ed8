"""The tool options of `ask`, `chat` and `batch` (-T, --functions, --mcp, --tool-choice,
--chain-limit, --approve-tools) as one checked request, and offering the chosen tools to a session.

The tools are gathered before the model loads (a bad --functions file or an unknown -T NAME is a
usage error at once; MCP servers start here and are stopped with the ToolSet). Calls are shown on
stderr before they run; where a person is there (llmchat.edges.person) they are asked yes / no / always,
and elsewhere nothing runs unless --approve-tools or the tool's `approve = "always"`. In the
interactive chat each result's first lines follow its call, dimmed, with its full length.
The command-line flags themselves are declared with the commands (llmchat.commands.tool_options).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from llmchat.defaults import DEFAULT_CHAIN_LIMIT
from llmchat.edges.safe_text import terminal_safe

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.tools.offer import ToolTaker
    from llmchat.tools.registry import ToolSet
    from llmchat.tools.spec import CallRecord

RESULT_PREVIEW_LINES = 3  # of a tool's result, shown after its call in the chat


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    mcp: tuple[str, ...] = ()
    tool_choice: str = "auto"
    chain_limit: int = DEFAULT_CHAIN_LIMIT
    approve_all: bool = False

    @property
    def wanted(self) -> bool:
        return bool(self.tools or self.functions or self.mcp)


def tool_request(
    tool: list[str] | None,
    functions: list[str] | None,
    mcp: list[str] | None,
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


def gather(request: ToolRequest, config: Config, *, saved_conversation: bool = True) -> ToolSet | None:
    """The chosen tools (MCP servers started), before the model loads; None when none were asked for.
    A server that cannot start is kept aside (say_down tells), unless --tool-choice names its tool.
    `saved_conversation`: False where the history is off (the servers' images go at exit)."""
    if not request.wanted:
        return None
    from llmchat.tools.registry import gather_tools

    toolset = gather_tools(
        config, request.tools, request.functions, request.mcp, keep_going=True, saved_conversation=saved_conversation
    )
    try:
        check_choice(request.tool_choice, toolset)  # a wrong NAME: exit 2 before the load
    except BaseException:
        toolset.close()
        raise
    return toolset


def say_down(toolset: ToolSet | None) -> None:
    """One line for each MCP server that could not start: the run goes on without its tools. Said
    once nothing else asked of it (-f, -p mcp:SERVER/...) stopped the run."""
    from llmchat.output import notice

    for down in toolset.down.values() if toolset is not None else ():
        notice(f"llmchat: {down}; going on without its tools")


def check_choice(tool_choice: str, toolset: ToolSet) -> None:
    """--tool-choice against the tools that are there: a tool of a server that did not start is
    one line naming the server and why (the forced call cannot be made)."""
    from llmchat.errors import UsageError
    from llmchat.tools.choice import parse_tool_choice

    try:
        parse_tool_choice(tool_choice, list(toolset.tools))
    except UsageError:
        for name, down in toolset.down.items():
            if tool_choice.startswith(f"{name}_"):
                raise UsageError(f"--tool-choice {tool_choice}: {down}") from None
        raise
    if tool_choice == "required" and not toolset.tools and toolset.down:
        servers = ", ".join(toolset.down)
        raise UsageError(f"--tool-choice required: no tool is there to call (not started: {servers})")


@contextmanager
def closed_on_failure(toolset: ToolSet | None) -> Iterator[None]:
    """Close the gathered tools (their MCP servers) when the block fails, then let it fail."""
    try:
        yield
    except BaseException:
        if toolset is not None:
            toolset.close()
        raise


def offer(
    session: ToolTaker, toolset: ToolSet, request: ToolRequest, *, dim: bool = False, lazy_share: float | None = None
) -> None:
    """Offer the tools to the session's model. `dim`: calls shown dimmed (the interactive chat).
    `lazy_share`: the config's lazy_tools (llmchat.tools.lazy; None: never lazily)."""
    from llmchat.edges import person as people
    from llmchat.output import is_tty, notice
    from llmchat.tools.approval import ask_approval
    from llmchat.tools.offer import ToolIO, make_offer

    person = people.current()
    interactive = person.present()  # else nothing runs unapproved

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
        show_result=(lambda record: show_result(record, sys.stderr)) if dim else None,
        ask=(lambda name, arguments: ask_approval(name, arguments, person.ask)) if interactive else None,
    )
    session.use_tools(
        make_offer(
            session,
            toolset.specs(),
            io,
            tool_choice=request.tool_choice,
            chain_limit=request.chain_limit,
            approve_all=request.approve_all,
            interactive=interactive,
            source=toolset,  # a server that changes its tools: offered again from the next turn
            lazy_share=lazy_share,
        )
    )


def show_result(record: CallRecord, stream: TextIO) -> None:
    """After a call in the chat: its result's first lines, dimmed on a terminal, with its length.
    `/show tools` prints the last turn's calls whole (llmchat.ui.conversation_commands)."""
    from llmchat.output import notice

    for line in result_preview(record.result or "", shutil.get_terminal_size().columns):
        notice(line, stream)


def result_preview(text: str, width: int, lines: int = RESULT_PREVIEW_LINES) -> list[str]:
    """`tool result: N chars, M lines` and the first `lines` lines, each cut to `width`, with what
    is left out counted. A tool's output may hold escapes: each line is made terminal-safe
    (llmchat.edges.safe_text), its tabs spaces first, so that the cut counts the columns it takes."""
    rows = text.splitlines() or [""]
    head = f"tool result: {len(text):,} chars, {len(rows):,} line" + ("" if len(rows) == 1 else "s")
    room = max(width - 4, 20)
    shown = [f"  │ {_clipped(terminal_safe(row.expandtabs(4)), room)}" for row in rows[:lines]]
    left = len(rows) - lines
    more = [f"  │ … {left:,} more line" + ("" if left == 1 else "s") + " (/show tools prints them)"] if left > 0 else []
    return [head, *shown, *more]


def _clipped(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"
