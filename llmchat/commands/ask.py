"""`llmchat ask`: one prompt (argument and/or piped stdin), one streamed reply on stdout.

Its options as Typer declares them; the work is llmchat.commands.ask_run's. `flags_table` writes
them out for llmchat.commands.quick_ask, which parses a one-shot `ask` without Typer.
"""

from typing import Annotated, Any, Optional

import typer

from llmchat.commands import ask_run
from llmchat.commands.help_panels import CONTEXT, FILES, OUTPUT
from llmchat.commands.model_options import PromptArgOption, RenderOption, model_command
from llmchat.commands.tool_options import (
    ApproveToolsOption,
    ChainLimitOption,
    FunctionsOption,
    McpOption,
    RootOption,
    ToolChoiceOption,
    ToolOption,
)
from llmchat.defaults import DEFAULT_CHAIN_LIMIT
from llmchat.env import Environment
from llmchat.options import RunOptions


@model_command()
def ask(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt. Piped stdin comes first, then this.")] = None,
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON record: reply, finish_reason, seed, stats, ... (docs/json-record.md).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    stats: Annotated[
        Optional[bool],
        typer.Option(
            "--stats/--no-stats", help="Stats on stderr (default: on a terminal only).", rich_help_panel=OUTPUT
        ),
    ] = None,
    continue_last: Annotated[
        bool, typer.Option("--continue", "-c", help="Continue the most recent conversation.", rich_help_panel=CONTEXT)
    ] = False,
    cid: Annotated[
        Optional[str],
        typer.Option("--cid", help="Continue the conversation with this id (or name).", rich_help_panel=CONTEXT),
    ] = None,
    overflow: Annotated[
        str,
        typer.Option(
            "--overflow",
            help="When the conversation outgrows the context: error | drop (oldest exchanges).",
            rich_help_panel=CONTEXT,
        ),
    ] = "error",
    compact: Annotated[
        Optional[str],
        typer.Option(
            "--compact",
            metavar="[auto|off]",
            help="auto: when a turn would pass compact_threshold (80 %) of the context, the model summarises the older exchanges of a continued conversation (-c, --cid) first; off: only trim. Default: the config's compact, else auto.",
            show_default=False,
            rich_help_panel=CONTEXT,
        ),
    ] = None,
    no_history: Annotated[
        bool, typer.Option("--no-history", help="Do not save this exchange.", rich_help_panel=CONTEXT)
    ] = False,
    files: Annotated[
        Optional[list[str]],
        typer.Option(
            "--file",
            "-f",
            help="Attach a text file, wrapped with its path (repeatable; - is stdin; a glob or folder: its text files, sorted; mcp:SERVER/URI: an MCP resource), or an image or audio clip for a model with a projector (--mmproj).",
            rich_help_panel=FILES,
        ),
    ] = None,
    prompt_arg: PromptArgOption = None,
    tool: ToolOption = None,
    functions: FunctionsOption = None,
    mcp: McpOption = None,
    root: RootOption = None,
    tool_choice: ToolChoiceOption = "auto",
    chain_limit: ChainLimitOption = DEFAULT_CHAIN_LIMIT,
    approve_tools: ApproveToolsOption = False,
    render: RenderOption = None,
    *,
    opts: RunOptions,
    env: Environment,
) -> None:
    """One prompt, one streamed reply on stdout."""
    # The work is ask_run's, parameter for parameter (a one-shot runs it without Typer: llmchat.commands.quick_ask).
    ask_run.run(**locals())


def flags_table() -> str:
    """The source of llmchat.commands.ask_flags: each option of `ask` as click reads this declaration,
    its parameter and what its value is. tests/test_quick_ask.py checks that the file is current;
    after a change to the options, write it again:
    python -c "from llmchat.commands.ask import flags_table; print(flags_table(), end='')" > llmchat/commands/ask_flags.py"""
    import inspect
    import json

    from typer.main import get_command

    app = typer.Typer(add_completion=False)  # as llmchat.cli runs a top-level command alone
    app.command("ask")(ask)
    options: dict[str, tuple[str, str]] = {}
    argument = ""
    for param in get_command(app).params:
        if param.param_type_name == "argument":
            argument = str(param.name)
            continue
        kind = _value_kind(param)
        for name in param.opts:
            options[name] = (str(param.name), "flag" if kind == "bool" else kind)
        for name in getattr(param, "secondary_opts", ()):
            options[name] = (str(param.name), "no-flag")
    own = set(inspect.signature(ask_run.run).parameters) - {"opts", "env"}
    shared = sorted({name for name, _ in options.values()} - own)
    quoted = json.dumps  # the names are ASCII: JSON's strings are Python's, as ruff formats them
    rows = "".join(f"    {quoted(flag)}: ({quoted(name)}, {quoted(kind)}),\n" for flag, (name, kind) in options.items())
    names = "".join(f"    {quoted(name)},\n" for name in shared)
    return (
        '"""`llmchat ask`\'s options as its Typer declaration has them (llmchat.commands.ask), for\n'
        "llmchat.commands.quick_ask. Written by llmchat.commands.ask.flags_table; do not edit.\n"
        '"""\n\n'
        f"ARGUMENT = {quoted(argument)}\n"
        "# option -> (parameter, value): flag (True), no-flag (False), str, int, int>=0, float, path, list (of str)\n"
        f"OPTIONS = {{\n{rows}}}\n"
        "# the model options (llmchat.commands.model_options), taken as one RunOptions\n"
        f"SHARED = (\n{names})\n"
    )


def _value_kind(param: Any) -> str:
    """What a click option's value is, in the few kinds llmchat.commands.quick_ask converts; ValueError for
    any other, so that a new kind of option is met here, not misread there."""
    kind = type(param.type).__name__
    if param.multiple:
        if kind != "StringParamType":
            raise ValueError(f"{param.name}: a repeatable option of type {kind}")
        return "list"
    if getattr(param, "is_flag", False) and kind == "BoolParamType":
        return "bool"
    if kind == "IntRange" and (param.type.min, param.type.max, param.type.clamp, param.type.min_open) == (
        0,
        None,
        False,
        False,
    ):
        return "int>=0"
    kinds = {"StringParamType": "str", "IntParamType": "int", "FloatParamType": "float", "TyperPath": "path"}
    if kind not in kinds or param.callback is not None or param.envvar or param.nargs != 1:
        raise ValueError(f"{param.name}: an option of type {kind} that llmchat.commands.quick_ask does not read")
    return kinds[kind]
