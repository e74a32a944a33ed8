"""The tool flags of `ask`, `chat` and `batch` (-T, --functions, --mcp, --root, --tool-choice,
--chain-limit, --approve-tools) as Typer declares them. What they mean, checked, and offering the chosen tools to
a session is llmchat.tools.options.
(No `from __future__ import annotations`: Typer reads the annotations at run time.)
"""

from typing import Annotated, Optional

import typer

from llmchat.commands.help_panels import TOOLS
from llmchat.commands.tools import FUNCTIONS_HELP, MCP_HELP, ROOT_HELP, TOOL_HELP

ToolOption = Annotated[
    Optional[list[str]], typer.Option("--tool", "-T", "--tools", help=TOOL_HELP, rich_help_panel=TOOLS)
]
FunctionsOption = Annotated[
    Optional[list[str]], typer.Option("--functions", help=FUNCTIONS_HELP, rich_help_panel=TOOLS)
]
McpOption = Annotated[Optional[list[str]], typer.Option("--mcp", help=MCP_HELP, rich_help_panel=TOOLS)]
RootOption = Annotated[
    Optional[list[str]], typer.Option("--root", metavar="DIR", help=ROOT_HELP, rich_help_panel=TOOLS)
]
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
