"""`llmchat tools list`: every tool the model could be offered, with its source and schema.

With no selection it lists everything the config defines ([tools.NAME] commands and every
[mcp.NAME] server's tools, which means starting those servers); with -T, --functions or --mcp it
lists exactly that selection, as ask/chat will offer it. Only typer is imported at module level.
(No `from __future__ import annotations`: Typer reads the annotations at run time.)
"""

from typing import List, Optional

import typer

TOOL_HELP = "A [tools.NAME] from the config, or mcp:SERVER for every tool of an [mcp.SERVER] (repeatable)."
FUNCTIONS_HELP = (
    "A Python file whose public functions become tools. This imports and runs that file: use your own code."
)
MCP_HELP = (
    'An MCP server: a command to start over stdio, e.g. --mcp "mcp-server-time --local-timezone UTC", '
    "or an http:// URL (Streamable HTTP; NAME=URL names it) (repeatable)."
)


def list_command(
    tool: Optional[List[str]] = typer.Option(None, "-T", "--tool", help=TOOL_HELP),
    functions: Optional[List[str]] = typer.Option(None, "--functions", help=FUNCTIONS_HELP),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list: name, source, description, parameters."),
) -> None:
    """Show each tool: name, source, description and argument schema."""
    import json

    from llmchat.env import current_environment
    from llmchat.tools.describe import describe_parameters
    from llmchat.tools.registry import gather_tools

    env = current_environment()
    config = env.config
    selected = bool(tool or functions or mcp)
    with gather_tools(config, tool or (), functions or (), mcp or (), everything_configured=not selected) as toolset:
        specs = toolset.specs()
    if as_json:
        entries = [
            {
                "name": spec.name,
                "source": spec.source,
                "description": spec.description,
                "parameters": spec.parameters,
                "approve": spec.approve,
            }
            for spec in specs
        ]
        env.stdout.write(json.dumps(entries, indent=2, ensure_ascii=False) + "\n")
        return
    if not specs:
        env.stderr.write(
            "llmchat: no tools: add [tools.NAME] or [mcp.NAME] to the config (llmchat config path), "
            "or give --functions FILE.py or --mcp COMMAND\n"
        )
        return
    for number, spec in enumerate(specs):
        if number:
            typer.echo("", file=env.stdout)
        typer.echo(
            f"{spec.name}  ({spec.source}{', runs without asking' if spec.approve == 'always' else ''})",
            file=env.stdout,
        )
        if spec.description:
            for line in spec.description.strip().splitlines():
                typer.echo(f"  {line}", file=env.stdout)
        typer.echo("  arguments:" + ("" if spec.parameters.get("properties") else " none"), file=env.stdout)
        for line in describe_parameters(spec.parameters):
            typer.echo(f"    {line}", file=env.stdout)
