"""`llmchat batch`: answer many prompts from a JSONL or text file, one JSON record per item.

Only Typer and the shared options are imported here; the command (llmchat.batch.command) and the engine are
imported when the command runs, so `llmchat --help` stays fast.
"""

from pathlib import Path
from typing import Annotated, Optional

import typer

from llmchat.commands.help_panels import BATCH
from llmchat.commands.model_options import PromptArgOption, model_command
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
def batch(
    input_path: Annotated[
        str, typer.Argument(metavar="INPUT", help="JSONL or plain text (one prompt per line); - for stdin.")
    ],
    output: Annotated[
        Optional[Path],
        typer.Option("--output", "-o", help="Write the JSONL records here (default: stdout).", rich_help_panel=BATCH),
    ] = None,
    parallel: Annotated[
        Optional[int],
        typer.Option(
            "--parallel",
            "-P",
            help="Decode this many items at once in one context (1 = one after another); with a server, this many concurrent requests (per server). Default: 1; over several servers, each server's slots.",
            show_default=False,
            rich_help_panel=BATCH,
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Skip the ids already in OUTPUT and append the rest.", rich_help_panel=BATCH),
    ] = False,
    progress: Annotated[
        str,
        typer.Option(
            "--progress",
            help="auto | bar | lines | json | off (stderr; auto = a bar on a terminal, lines otherwise).",
            rich_help_panel=BATCH,
        ),
    ] = "auto",
    fsync: Annotated[
        bool,
        typer.Option(
            "--fsync", help="fsync OUTPUT after each record (survives a power cut; slower).", rich_help_panel=BATCH
        ),
    ] = False,
    tool: ToolOption = None,
    functions: FunctionsOption = None,
    mcp: McpOption = None,
    root: RootOption = None,
    tool_choice: ToolChoiceOption = "auto",
    chain_limit: ChainLimitOption = DEFAULT_CHAIN_LIMIT,
    approve_tools: ApproveToolsOption = False,
    prompt_arg: PromptArgOption = None,
    *,
    opts: RunOptions,
    env: Environment,
) -> None:
    """Answer every item of INPUT with one loaded model; one JSON line per item, in input order.

    A JSONL line holds `id?`, `prompt` or `messages` ([{role, content}]), `system?` and optional
    sampling: temperature, top_p, top_k, min_p, repeat_penalty, max_tokens, seed, stop. Items without
    an id get their line number. Each record: id, reply, finish_reason, seed, stats, error.

    A bad line or an item that cannot fit the context gets an error record and the run goes on.
    Each item is a fresh conversation; a batch is not saved to the history. Replies are bounded by
    max_tokens (default: 2,048 tokens, as in ask and chat).

    With --server given several times (or a configured group), the items spread over the servers
    by free slots; a server that stops answering hands its items to the others; when all have
    stopped, the exit is 6 and --resume finishes the rest.

    Tools (-T, --functions, --mcp) are offered to every item; an item's own `tools` and
    `tool_choice` replace them. Nobody is at a terminal to approve a call, so tools run only with
    --approve-tools (or a tool's approve = "always"); without it the batch stops before the load.
    """
    from llmchat.batch.command import run_batch
    from llmchat.edges import person
    from llmchat.errors import ExitCode, LlmchatError
    from llmchat.tools.mcp.roots import use_roots
    from llmchat.tools.mcp.run_mode import model_answers
    from llmchat.tools.options import tool_request

    use_roots(root)  # a --root that is not a folder: exit 2, before any MCP server starts
    # Items run unattended, maybe in parallel: nobody is asked anything (a server's elicitation is
    # declined at once, and its sampling answered only where its config approves it).
    person.use(person.Person(attended=False))
    model_answers()
    tools = tool_request(tool, functions, mcp, tool_choice, chain_limit, approve_tools, offered_elsewhere=True)
    try:
        failed, total = run_batch(
            input_path,
            output,
            parallel=parallel,
            resume=resume,
            progress=progress,
            fsync=fsync,
            opts=opts,
            config=env.config,
            tools=tools,
            prompt_args=tuple(prompt_arg or ()),
        )
    except KeyboardInterrupt:
        # Raised as SystemExit: Typer (standalone_mode=False) turns KeyboardInterrupt into a *returned*
        # exit code, which `cli.main` does not pass on. The records written so far are complete lines.
        fresh_line = "\n" if env.stderr_isatty else ""  # after the echoed ^C on a terminal
        env.stderr.write(f"{fresh_line}llmchat: interrupted (rerun with --resume -o OUTPUT to finish)\n")
        raise SystemExit(int(ExitCode.INTERRUPTED)) from None
    if failed:
        # An error (not typer.Exit, whose code is returned, not raised, under standalone_mode=False): exit 1.
        where = f"in {output}" if output is not None else "on stdout"
        raise LlmchatError(
            f"{failed} of {total} items failed; see their error records {where}", exit_code=ExitCode.ERROR
        )
