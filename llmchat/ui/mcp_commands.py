"""Slash commands for MCP resources and prompts (llmchat.tools.mcp.sources): /resources, /prompts, and
`/prompt mcp:SERVER/NAME k=v` (a saved prompt's `/prompt NAME` stays settings_commands').

The servers are the chat's McpSources (`CommandContext.mcp`: the config's [mcp.*] and chat's
--mcp), started on first use. `/file mcp:SERVER/URI` is file_commands'.
"""

from __future__ import annotations

import shlex

from llmchat.edges import person
from llmchat.errors import LlmchatError
from llmchat.tools.mcp.sources import McpSources, argument_asker, is_mcp_ref, listing_lines, parse_prompt_args
from llmchat.ui import settings_commands as settings
from llmchat.ui.context import CONTINUE, Action, CommandContext, Outcome


def _sources(ctx: CommandContext) -> McpSources | None:
    if ctx.mcp is None or not ctx.mcp.server_names():
        ctx.error("no MCP servers: add an [mcp.NAME] table to the config, or start the chat with --mcp")
        return None
    return ctx.mcp


def cmd_prompt(ctx: CommandContext, arg: str) -> Outcome:
    """`/prompt mcp:SERVER/NAME k=v ...`: the prompt's messages are sent now, as the next message
    (with the files attached to it). `/prompt NAME`: a saved prompt, as before."""
    if not is_mcp_ref(arg):
        return settings.cmd_prompt(ctx, arg)
    sources = _sources(ctx)
    if sources is None:
        return CONTINUE
    try:
        words = shlex.split(arg)
        asker = argument_asker(person.current())
        text = sources.prompt_text(words[0], parse_prompt_args(words[1:]), asker)
    except ValueError as err:  # shlex: an unclosed quote
        ctx.error(f"error: /prompt {arg}: {err}; quote a value with spaces as k='two words'")
        return CONTINUE
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if not text.strip():
        ctx.error(f"error: {words[0]} gave no text")
        return CONTINUE
    return Outcome(Action.TURN, text=text)


def _listing(ctx: CommandContext, what: str, arg: str) -> Outcome:
    sources = _sources(ctx)
    if sources is None:
        return CONTINUE
    try:
        lines = listing_lines(sources, what, arg.strip() or None)
    except LlmchatError as err:
        ctx.error(f"error: {err}")
        return CONTINUE
    if not lines:
        ctx.info(f"no {what}")
    for line in lines:
        ctx.out.print(line, markup=False, highlight=False, soft_wrap=True)  # a URI stays whole
    return CONTINUE


def cmd_resources(ctx: CommandContext, arg: str) -> Outcome:
    """`/resources [SERVER]`: each resource as /file takes it, and the templates with their arguments."""
    return _listing(ctx, "resources", arg)


def cmd_prompts(ctx: CommandContext, arg: str) -> Outcome:
    """`/prompts [SERVER]`: each prompt as /prompt takes it, with its arguments (`?`: optional)."""
    return _listing(ctx, "prompts", arg)
