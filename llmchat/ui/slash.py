"""The chat's slash commands: how a line is read as one, the one table of commands, and dispatch.

The handlers live by what they act on: settings_commands (how the chat answers),
conversation_commands (the conversation and the history), file_commands (the files for the next
message), model_commands (the model: /model, /models). Each takes a `CommandContext` and returns an `Outcome` (llmchat.ui.context).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from llmchat.engine.sampling import SETTABLE
from llmchat.ui import clipboard
from llmchat.ui import conversation_commands as conversation
from llmchat.ui import file_commands as files
from llmchat.ui import mcp_commands as mcp
from llmchat.ui import model_commands as models
from llmchat.ui import search_commands as search
from llmchat.ui import settings_commands as settings
from llmchat.ui.context import CONTINUE, EXIT, CommandContext, Outcome


def split_command(line: str) -> tuple[str, str]:
    """'/set temperature 0.2' -> ('/set', 'temperature 0.2'). The name is case-insensitive."""
    stripped = line.strip()
    name, _, rest = stripped.partition(" ")
    if "\n" in name:  # '/system\nline two' : the newline separates like a space
        name, _, more = name.partition("\n")
        rest = more + (" " + rest if rest else "")
    return name.lower(), rest.strip()


def is_command(line: str) -> bool:
    """A line starting with one slash is a command; `//text` sends `/text` as a message."""
    stripped = line.lstrip()
    return stripped.startswith("/") and not stripped.startswith("//")


def unescape_message(line: str) -> str:
    """`//etc/hosts is ...` -> `/etc/hosts is ...` (the escape for messages that start with a slash)."""
    stripped = line.lstrip()
    return stripped[1:] if stripped.startswith("//") else line


def cmd_help(ctx: CommandContext, arg: str) -> Outcome:
    from rich.table import Table

    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for command in COMMANDS.values():
        if command.name in ALIASES:
            continue
        usage = command.name + (f" {command.args}" if command.args else "")
        table.add_row(usage, command.help)
    ctx.out.print(table)
    ctx.out.print(
        "Enter sends · Alt-Enter (or Esc then Enter) adds a line · pasted text stays one message\n"
        'Ctrl-X Ctrl-E edits the message in $VISUAL/$EDITOR (vi keys: editing_mode = "vi" in the config)\n'
        "Ctrl-C stops a reply or clears the line; twice on an empty line exits · Ctrl-D exits\n"
        "Start a message with // to send text that begins with a slash",
        highlight=False,
    )
    return CONTINUE


def cmd_exit(ctx: CommandContext, arg: str) -> Outcome:
    return EXIT


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    help: str
    handler: Callable[[CommandContext, str], Outcome]


def _table(commands: Iterable[Command]) -> dict[str, Command]:
    return {command.name: command for command in commands}


COMMANDS: dict[str, Command] = _table(
    [
        Command("/help", "", "this list", cmd_help),
        Command("/exit", "", "leave the chat (also /quit, Ctrl-D)", cmd_exit),
        Command("/quit", "", "leave the chat", cmd_exit),
        Command("/clear", "", "start a new conversation; the old one is kept, not deleted", conversation.cmd_clear),
        Command("/system", "[TEXT|--clear]", "show or set the system prompt", settings.cmd_system),
        Command(
            "/think", "", "a reasoning model thinks before it answers (its template's switch)", settings.thinking(True)
        ),
        Command(
            "/nothink", "", "a reasoning model answers without thinking, if its template can", settings.thinking(False)
        ),
        Command(
            "/prompt",
            "NAME|mcp:SERVER/NAME [k=v]",
            "apply a saved prompt (system prompt, preset, sampling, schema), or send an MCP prompt's messages",
            mcp.cmd_prompt,
        ),
        Command("/prompts", "[SERVER]", "the MCP servers' prompts, with their arguments", mcp.cmd_prompts),
        Command(
            "/resources", "[SERVER]", "the MCP servers' resources and templates (/file mcp:...)", mcp.cmd_resources
        ),
        Command(
            "/file",
            "PATH",
            "attach a file to the next message: text (a glob, a folder, mcp:SERVER/URI), an image or audio",
            files.cmd_file,
        ),
        Command("/image", "PATH", "attach an image or audio clip (as /file)", files.cmd_file),
        Command("/files", "", "the files attached to the next message, with their tokens", files.cmd_files),
        Command("/drop", "[PATH]", "remove an attached file (all of them without PATH)", files.cmd_drop),
        Command("/model", "[NAME]", "switch the model, same conversation (alone: the current one)", models.cmd_model),
        Command("/models", "", "the models /model can switch to (llmchat models list)", models.cmd_models),
        Command("/set", "KEY VALUE", f"change a setting: {', '.join(SETTABLE)}, preset", settings.cmd_set),
        Command(
            "/show",
            "[tools]",
            "model, template, context use, settings and where each came from; tools: the last turn's calls in full",
            settings.cmd_show,
        ),
        Command("/stats", "", "every number about the last reply", settings.cmd_stats),
        Command("/retry", "", "regenerate the last reply", conversation.cmd_retry),
        Command("/undo", "", "remove the last message and its reply", conversation.cmd_undo),
        Command(
            "/edit",
            "",
            "change the last message and resend it; the old exchange stays as a branch",
            conversation.cmd_edit,
        ),
        Command(
            "/branch",
            "[N]",
            "a new conversation sharing turns 1..N (default: all) with this one",
            conversation.cmd_branch,
        ),
        Command(
            "/compact",
            "[INSTRUCTIONS]",
            "the model summarises the older exchanges in its context (what to keep: INSTRUCTIONS)",
            conversation.cmd_compact,
        ),
        Command("/save", "[NAME]", "name this conversation in the history", conversation.cmd_save),
        Command("/load", "NAME|ID", "continue a saved conversation", conversation.cmd_load),
        Command("/history", "[N]", "recent saved conversations", conversation.cmd_history),
        Command("/search", "TEXT", "search every saved conversation's messages; /load ID opens one", search.cmd_search),
        Command("/copy", "[N]", "copy the last reply, or its code block N, to the clipboard", clipboard.cmd_copy),
        Command("/tools", "", "the tools the model may call, with their arguments", settings.cmd_tools),
        Command("/tool", "on|off", "offer the tools to the model from the next message, or not", settings.cmd_tool),
    ]
)
ALIASES = {"/quit"}


def dispatch(line: str, ctx: CommandContext) -> Outcome:
    """Run one slash command line. Bad input prints one line and keeps the session."""
    name, arg = split_command(line)
    command = COMMANDS.get(name)
    if command is None:
        ctx.error(f"unknown command {name}; /help lists them")
        return CONTINUE
    return command.handler(ctx, arg)
