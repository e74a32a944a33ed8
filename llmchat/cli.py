"""The command line: app assembly, and the run of a command under Typer.

Each command lives in `llmchat/commands/` as a plain function; this module registers them, in
the order a newcomer needs them (ask, chat, batch first), and runs them under `main`, which maps
every exception to one line on stderr and a documented exit code (llmchat.exits; click's usage
errors here). A one-shot `ask` whose options llmchat.commands.quick_ask can read runs without this
module, and so without Typer. `main` builds the run's one
`Environment` (llmchat.env: the streams, the config read once, the paths) and hands it to the
command as click's context object. (No `from __future__ import annotations` here: Typer reads the
annotations at run time.)
"""

import importlib
import sys
from typing import Any, Callable, Optional

import typer

try:  # recent Typer vendors its own copy of click; its exceptions are the ones raised
    from typer import _click as click  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # pragma: no cover - older Typer
    import click  # type: ignore[no-redef,unused-ignore]

from llmchat import interrupts
from llmchat.commands.help_panels import PanelledCommand
from llmchat.env import Environment, current_environment
from llmchat.errors import ExitCode
from llmchat.exits import report_error, run_guarded

EXIT_CODES_HELP = (
    "Exit codes: 0 ok, 1 error, 2 usage, 3 model, 4 context, 5 structured output invalid, 6 server, "
    "130 interrupted, 141 closed output."
)

_APP_SETTINGS: dict = dict(
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# The top-level commands, as (module in llmchat.commands, function, settings): registered on the
# full app, and the one being run also on an app of its own (`_app_for`). A command's module is
# imported only when the command is registered: a one-shot `ask` imports none of the others.
TOP_COMMANDS: dict[str, tuple[str, str, dict]] = {
    "ask": ("ask", "ask", {"epilog": EXIT_CODES_HELP}),
    "chat": ("chat", "chat", {"epilog": EXIT_CODES_HELP}),
    "batch": (
        "batch",
        "batch",
        {"epilog": "Exit codes: 0 every item ok, 1 some item failed, 2 usage, 3 model, 130 interrupted."},
    ),
    "info": ("info", "info", {"help": "Show a model's architecture, KV-cache size and memory needs."}),
    "bench": ("bench", "bench", {}),
}
# The command groups: name, help, and each subcommand's name and function in the group's module.
GROUPS: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    (
        "template",
        "List, inspect, render chat templates, and parse a model's output with one.",
        (("list", "list_templates"), ("show", "show"), ("render", "render"), ("parse", "parse")),
    ),
    (
        "history",
        "Saved conversations: list, show, search, export, rm, fork.",
        (
            ("list", "list_command"),
            ("show", "show_command"),
            ("search", "search_command"),
            ("export", "export_command"),
            ("rm", "rm_command"),
            ("fork", "fork_command"),
        ),
    ),
    (
        "models",
        "Every GGUF on this machine (HF cache, Ollama, LM Studio, folders): list, show, pull, rm, alias.",
        (
            ("list", "list_command"),
            ("show", "show_command"),
            ("pull", "pull_command"),
            ("rm", "rm_command"),
            ("alias", "alias_command"),
        ),
    ),
    ("config", "The config file.", (("path", "config_path"), ("show", "config_show"))),
    ("cache", "The KV cache on disk: list, clear.", (("list", "list_command"), ("clear", "clear_command"))),
    (
        "prompts",
        "Saved prompts ([prompts.NAME] in the config): list, show.",
        (("list", "list_command"), ("show", "show_command")),
    ),
    ("schema", "Structured output: see what a --schema holds the model to.", (("show", "show"),)),
    ("tools", "Tools the model can call: functions, commands, MCP servers.", (("list", "list_command"),)),
    (
        "mcp",
        "MCP servers without a model: list, tools, resources, prompts, call, login, logout.",
        (
            ("list", "list_command"),
            ("tools", "tools_command"),
            ("resources", "resources_command"),
            ("prompts", "prompts_command"),
            ("call", "call_command"),
            ("login", "mcp_auth.login_command"),
            ("logout", "mcp_auth.logout_command"),
        ),
    ),
)


def _command(module: str, function: str) -> Callable[..., Any]:
    if "." in function:  # a group's command kept in a module of its own: "module.function"
        module, function = function.split(".")
    return getattr(importlib.import_module(f"llmchat.commands.{module}"), function)


def full_app() -> typer.Typer:
    """The whole command line: every command and group (for `llmchat --help`, the groups, and a
    bare `llmchat`)."""
    app = typer.Typer(
        name="llmchat",
        help="Chat with local GGUF models through llama.cpp: streaming replies with live TTFT and tokens/s.",
        **_APP_SETTINGS,
    )
    app.callback(invoke_without_command=True, epilog=EXIT_CODES_HELP)(_root)
    for name, (module, function, settings) in TOP_COMMANDS.items():
        app.command(name, cls=PanelledCommand, **settings)(_command(module, function))
    for group, help_text, commands in GROUPS:
        group_app = typer.Typer(no_args_is_help=True, help=help_text)
        for name, function in commands:
            group_app.command(name, cls=PanelledCommand)(_command(group, function))
        app.add_typer(group_app, name=group)
    return app


def _print_version(value: bool) -> None:
    if not value:
        return
    from llmchat import __version__

    out = current_environment().stdout
    typer.echo(f"llmchat {__version__}", file=out)
    from llmchat.engine.devices import runtime_versions

    for line in runtime_versions():
        typer.echo(line, file=out)
    raise typer.Exit()


def _root(
    ctx: typer.Context,
    version: Optional[bool] = typer.Option(
        None,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the llmchat, llama-cpp-python and llama.cpp versions and the backend.",
    ),
) -> None:
    """Bare `llmchat` on a terminal opens a chat; otherwise it shows this help."""
    if ctx.invoked_subcommand is None:
        env = current_environment()
        if env.stdin_isatty and env.stdout_isatty:
            ctx.invoke(_command("chat", "chat"))
        else:
            typer.echo(ctx.get_help(), file=env.stdout)


# --- entry point ----------------------------------------------------------------------------------
def _app_for(args: list) -> tuple[typer.Typer, list, str]:
    """The app that runs `args`, the arguments it gets, and its program name. For a top-level
    command (`llmchat ask ...`), an app holding that command alone: Typer turns every registered
    command's signature into click parameters each time an app runs, about 22 ms for llmchat's
    thirty commands, paid by every one-shot `ask` (bench/results/oneshot_vs_completion.md). The
    command's usage, help and errors read the same either way ("llmchat ask")."""
    if args and args[0] in TOP_COMMANDS:
        module, function, settings = TOP_COMMANDS[args[0]]
        alone = typer.Typer(add_completion=False, **_APP_SETTINGS)
        alone.command(args[0], cls=PanelledCommand, **settings)(_command(module, function))
        return alone, args[1:], f"llmchat {args[0]}"
    return full_app(), args, "llmchat"


def main(argv: Optional[list] = None, env: Optional[Environment] = None) -> None:
    """Run one command line in `env` (by default the process's own streams and config file)."""
    args = sys.argv[1:] if argv is None else argv
    env = env if env is not None else Environment()
    interrupts.install()  # already done by llmchat.launch; here too for in-process callers

    def run() -> None:
        try:
            # Outside standalone mode, click turns `typer.Exit(code)` into the return value.
            runner, runner_args, prog_name = _app_for(args)
            returned = runner(args=runner_args, prog_name=prog_name, standalone_mode=False, obj=env)
        except typer.Exit as done:
            sys.exit(done.exit_code)
        except typer.Abort:
            raise KeyboardInterrupt from None
        except click.ClickException as err:
            _usage_error(err, env)
        if returned == ExitCode.INTERRUPTED:
            # Typer turns KeyboardInterrupt into a *returned* 130, without a word: say it here.
            # (batch reports its own interruption and raises SystemExit, which is not returned.)
            raise KeyboardInterrupt
        if isinstance(returned, int) and returned:
            sys.exit(returned)

    run_guarded(env, run, debug="--debug" in args)


def _usage_error(err: "click.ClickException", env: Environment) -> None:
    """click's complaint about the command line, as one line and exit 2 (a bare group: its help)."""
    context: click.Context | None = getattr(err, "ctx", None)
    if type(err).__name__ == "NoArgsIsHelpError" and context is not None:
        env.stdout.write(context.get_help() + "\n")
        sys.exit(int(ExitCode.USAGE))
    hint = (
        f" (see llmchat {context.command_path.split(' ', 1)[1]} --help)"
        if context is not None and " " in context.command_path
        else " (see llmchat --help)"
    )
    report_error(err.format_message().replace("\n", " ") + hint, env.stderr, env.stderr_isatty)
    sys.exit(int(ExitCode.USAGE))
