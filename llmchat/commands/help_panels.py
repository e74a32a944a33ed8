"""`--help` in panels: a command's options grouped under headings, in one fixed order, so that
`llmchat ask --help` (75 options) reads like a page instead of one flat list.

Each option names its panel with Typer's `rich_help_panel`. Typer draws panels only in its rich
mode, which llmchat leaves off (`rich_markup_mode=None` in llmchat.cli: rich markup would read the
`[tools.NAME]` and `[auto|off]` in the help texts as tags), so this command class writes them in
click's own plain format: no colour and no boxes, the same on a terminal and in a pipe, which is
also what lets docs/cli.md be generated from it and compared in a test.
(No `from __future__ import annotations`: Typer reads the annotations at run time.)
"""

from typing import Any

from typer.core import TyperCommand

ENGINE = "Model and engine"
SAMPLING = "Prompt and sampling"
CONTEXT = "Context and history"
FILES = "Files and media"
TOOLS = "Tools and MCP"
REASONING = "Reasoning models"
STRUCTURED = "Structured output"
SERVERS = "Servers"
BATCH = "Batch"
OUTPUT = "Output"
# The order a reader meets them in; an option with no panel (--help, a command's few own options)
# goes under "Options", last, as click puts it.
PANEL_ORDER = (ENGINE, SAMPLING, CONTEXT, FILES, TOOLS, REASONING, STRUCTURED, SERVERS, BATCH, OUTPUT)
UNGROUPED = "Options"


def _rank(title: str) -> int:
    if title == UNGROUPED:
        return len(PANEL_ORDER) + 1
    return PANEL_ORDER.index(title) if title in PANEL_ORDER else len(PANEL_ORDER)


class PanelledCommand(TyperCommand):
    """A Typer command whose help lists its arguments, then its options panel by panel."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        arguments: list[tuple[str, str]] = []
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:  # hidden
                continue
            if param.param_type_name == "argument":
                arguments.append(record)
            else:
                panels.setdefault(getattr(param, "rich_help_panel", None) or UNGROUPED, []).append(record)
        if arguments:
            with formatter.section("Arguments"):
                formatter.write_dl(arguments)
        # One column width for every panel (click sizes each list by its own widest name, up to
        # 30), so the help texts line up down the whole page.
        width = min(max((len(name) for rows in panels.values() for name, _ in rows), default=0), 30)
        for title in sorted(panels, key=_rank):  # a stable sort: the same panel keeps its options' order
            with formatter.section(title):
                formatter.write_dl([(name.ljust(width) if text else name, text) for name, text in panels[title]])
