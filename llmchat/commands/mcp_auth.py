"""`llmchat mcp login NAME` and `llmchat mcp logout NAME`: an OAuth login to an MCP server over
HTTP (llmchat.tools.mcp.oauth_login), kept privately per server until logout. (Registered as
subcommands of `llmchat mcp` through llmchat.commands.mcp.) Only typer is imported at module level.
"""

from typing import List, Optional

import typer

MCP_HELP = "A server for this command only, as NAME=URL (repeatable)."


def login_command(
    server: str = typer.Argument(..., help="The server: its [mcp.NAME], or the name of one given with --mcp."),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help=MCP_HELP),
    no_browser: bool = typer.Option(
        False, "--no-browser", help="Only print the URL to open (as over SSH or without a display)."
    ),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the browser to come back."),
) -> None:
    """Log in to an MCP server over HTTP with OAuth: the URL to open goes to stderr (and to your
    browser); the tokens are kept privately for later runs, refreshed when they expire."""
    from llmchat.commands.mcp import _servers
    from llmchat.env import current_environment
    from llmchat.errors import UsageError
    from llmchat.tools.mcp.oauth_login import login

    env = current_environment()
    if timeout <= 0:
        raise UsageError("--timeout must be a number of seconds above 0")
    (config,) = _servers(env, server, mcp)
    path = login(config, env.stderr, open_browser=not no_browser, timeout_s=timeout)
    env.stderr.write(f"llmchat: logged in to MCP server {config.name} ({config.url}); kept in {path}\n")


def logout_command(
    server: str = typer.Argument(..., help="The server's name (configured or not: a login outlives its table)."),
) -> None:
    """Forget the OAuth login to an MCP server: its stored tokens and client registration."""
    import re

    from llmchat.env import current_environment
    from llmchat.errors import UsageError
    from llmchat.tools.mcp.oauth_store import remove_login

    env = current_environment()
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", server):
        raise UsageError(f"{server!r} is not an MCP server name (letters, digits, - and _)")
    if remove_login(server):
        env.stderr.write(f"llmchat: logged out of MCP server {server}\n")
    else:
        env.stderr.write(f"llmchat: no login was kept for MCP server {server}\n")
