"""`llmchat chat`: interactive on a terminal; with piped stdin, one message per line, one reply per turn."""

from contextlib import ExitStack
from typing import TYPE_CHECKING, Annotated, Optional

import typer

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
from llmchat.errors import UsageError
from llmchat.options import RunOptions

if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import BinaryIO

    from llmchat.edges.bounded_input import Bound
    from llmchat.store.attachment_records import Attachment
    from llmchat.turn.session import ChatSession


@model_command()
def chat(
    json_output: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Scripted chat: one JSON record per turn (the shape ask --json prints).",
            rich_help_panel=OUTPUT,
        ),
    ] = False,
    stats: Annotated[
        Optional[bool],
        typer.Option("--stats/--no-stats", help="Live readout and per-reply summary.", rich_help_panel=OUTPUT),
    ] = None,
    render: RenderOption = None,
    resume: Annotated[
        Optional[str],
        typer.Option(
            "--resume", "-r", help="Continue a saved conversation: an id, a name or 'last'.", rich_help_panel=CONTEXT
        ),
    ] = None,
    overflow: Annotated[
        str,
        typer.Option(
            "--overflow",
            help="When the conversation outgrows the context: drop (oldest exchanges) | error.",
            rich_help_panel=CONTEXT,
        ),
    ] = "drop",
    compact: Annotated[
        Optional[str],
        typer.Option(
            "--compact",
            metavar="[auto|off]",
            help="auto: when a turn would pass compact_threshold (80 %) of the context, the model summarises the older exchanges first; off: only trim. Default: the config's compact, else auto. In the chat: /compact [INSTRUCTIONS].",
            show_default=False,
            rich_help_panel=CONTEXT,
        ),
    ] = None,
    no_history: Annotated[
        bool, typer.Option("--no-history", help="Do not save this conversation.", rich_help_panel=CONTEXT)
    ] = False,
    files: Annotated[
        Optional[list[str]],
        typer.Option(
            "--file",
            "-f",
            help="Attach a text file, an image or audio clip to the first message (repeatable; a glob or folder: its text files; mcp:SERVER/URI: an MCP resource). In the chat: /file PATH, /image PATH.",
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
    *,
    opts: RunOptions = RunOptions(),
    env: Environment,
) -> None:
    """Chat: interactive on a terminal; with piped stdin, one message per line and one reply per turn."""
    from llmchat.commands.turns import check_overflow, continue_conversation
    from llmchat.edges import person
    from llmchat.edges.bounded_input import text_bound
    from llmchat.startup.before_load import context_ahead
    from llmchat.startup.loading import start_session
    from llmchat.tools import options as tool_options
    from llmchat.tools.mcp.roots import use_roots
    from llmchat.tools.mcp.run_mode import model_answers
    from llmchat.tools.mcp.sources import McpSources, argument_asker
    from llmchat.turn.attachments import STDIN, collect
    from llmchat.turn.compaction import with_mode
    from llmchat.turn.structured import from_options
    from llmchat.ui.markdown import wants_markdown

    check_overflow(overflow)
    use_roots(root)  # a --root that is not a folder: exit 2, before any MCP server starts
    model_answers()  # the servers it starts may ask this run's model (sampling)
    person.use(person.Person(env.stdin, env.stderr))  # who every question of the run is asked
    config = with_mode(env.config, compact)  # a bad --compact: exit 2 before the load
    markdown = wants_markdown(render, env.config.render, env.stdout_isatty)  # a bad --render: exit 2 before the load
    if STDIN in (files or ()):
        raise UsageError("chat reads its messages from stdin; -f - is for ask (attach a file by its path)")
    tools = tool_options.tool_request(tool, functions, mcp, tool_choice, chain_limit, approve_tools)
    saved = not no_history and env.config.history  # else the MCP servers' images go at exit, with the chat
    # A bad --functions file, an unknown -T: exit 2 before the load.
    toolset = tool_options.gather(tools, env.config, saved_conversation=saved)
    # -f, -p, /file, /prompt mcp:SERVER/...: through the tools' connections where they are the same server.
    sources = McpSources(env.config, mcp or (), stderr=env.stderr, shared=toolset, saved_conversation=saved)
    with tool_options.closed_on_failure(toolset):  # MCP servers stop if the model cannot load
        with sources:  # read before the model loads, its own servers stopped (a later /file mcp:... starts one again)
            # A binary file, or one bigger than the context it will open can hold: exit 2 now.
            bound = text_bound(context_ahead(opts, config)) if files else None
            attachments = tuple(collect(files or (), resources=sources.resource_bytes, bound=bound))
            from llmchat.media.use import check_before_loading

            check_before_loading(opts, config, attachments)  # an image and no projector: exit 2 now
            asker = argument_asker(person.current())
            opening = sources.opening(opts.saved_prompt, prompt_arg or (), asker)  # goes with the first message
        tool_options.say_down(toolset)  # after -f/-p mcp:... naming one of them: exit 2
        structured = from_options(opts, env.config)  # a bad --schema is a usage error before the model loads
        session = start_session(opts, config=config, overflow=overflow, with_history=not no_history)
    try:
        session.hold_to(structured)
        if toolset is not None:
            tool_options.offer(
                session, toolset, tools, dim=env.stdin_isatty and not json_output, lazy_share=config.lazy_tools
            )
        if resume:
            continue_conversation(session, resume)
        from llmchat.turn.room import check_room

        check_room(session, attachments)  # a file too big for the room the turn can make: exit 2, nothing sent
        interactive = env.stdin_isatty and not json_output
        if interactive:
            from llmchat.ui.chat import run_interactive

            run_interactive(
                session,
                show_stats=env.config.stats if stats is None else stats,
                markdown=markdown,
                verbose=opts.verbose,
                attachments=attachments,
                opening=opening,
                mcp=sources,
                editing_mode=env.config.editing_mode,
                stdout=env.stdout,
                stderr=env.stderr,
            )
        else:
            exit_code = run_scripted_chat(
                session, env, json_output=json_output, show_stats=bool(stats), attachments=attachments, opening=opening
            )
            if exit_code:
                raise typer.Exit(exit_code)
    finally:
        # Each is closed even when one closed before it fails (the MCP servers stop), the last opened first.
        with ExitStack() as closing:
            if toolset is not None:
                closing.callback(toolset.close)
            closing.callback(sources.close)
            closing.callback(session.close)


def run_scripted_chat(
    session: "ChatSession",
    env: Environment,
    *,
    json_output: bool,
    show_stats: bool,
    attachments: "tuple[Attachment, ...]" = (),
    opening: str = "",
) -> int:
    """One user message per stdin line; each reply on stdout (or one JSON record per turn, with
    the turn number as its id). `attachments` (-f) and `opening` (an MCP prompt's text, -p
    mcp:SERVER/NAME) go with the first message."""
    from llmchat.commands.turns import run_turn
    from llmchat.edges.bounded_input import text_bound
    from llmchat.errors import ContextOverflowError
    from llmchat.output import StreamPrinter, notice, write_json
    from llmchat.tools.mcp.sources import joined
    from llmchat.turn.policy import INVALID_REPLY_EXIT, invalid_reply_line
    from llmchat.turn.record import error_record

    exit_code = 0
    turn_number = 0
    # Bytes, decoded line by line: one undecodable line is reported like any bad message, and
    # never reaches the tokenizer as surrogates (text-mode stdin would pass them through); a line
    # longer than the context could hold is reported without being held.
    for raw, too_long in _piped_lines(env.stdin.buffer, text_bound(session.engine.n_ctx)):
        message, bad_input = _decode_line(raw.rstrip(b"\r\n"))
        if not bad_input and not too_long and not message.strip():
            continue
        turn_number += 1
        printer = StreamPrinter(
            env.stdout,
            env.stderr,
            show_live=False,
            show_summary=show_stats,
            echo_text=not json_output,
            mark_interrupted=False,
            out_isatty=env.stdout_isatty,
            err_isatty=env.stderr_isatty,
        )
        try:
            if too_long:
                raise ContextOverflowError(too_long)
            if bad_input:
                raise UsageError(bad_input)
            result = run_turn(session, joined(opening, message), printer, attachments)
            attachments, opening = (), ""
        except (ContextOverflowError, UsageError) as err:
            # The session goes on: this message is reported and skipped, nothing else is lost.
            notice(f"llmchat: error: turn {turn_number}: {err}", env.stderr)
            exit_code = exit_code or int(err.exit_code)
            if json_output:
                write_json(
                    error_record(turn_number, str(err), model=session.model_label, template=session.template.name),
                    env.stdout,
                )
            continue
        if json_output:
            write_json(result.to_record(turn_number), env.stdout)  # its `error` says why a structured reply is invalid
        if result.error is not None:
            # The same policy as every mode (llmchat.turn.policy): said here, exit 5 at the end.
            notice(invalid_reply_line(result.error, turn_number), env.stderr)
            exit_code = exit_code or int(INVALID_REPLY_EXIT)
        if result.interrupted:
            raise KeyboardInterrupt
    return exit_code


def _piped_lines(stream: "BinaryIO", bound: "Bound") -> "Iterator[tuple[bytes, str | None]]":
    """stdin's lines, each read no further than `bound`: one longer is (b"", why it cannot fit),
    the rest of it read past a chunk at a time and dropped (llmchat.edges.bounded_input)."""
    from llmchat.edges.bounded_input import TooLong, read_line, skip_line

    number = 0
    while True:
        number += 1
        try:
            raw = read_line(stream, f"line {number} of stdin", bound)
        except TooLong as err:
            skip_line(stream)
            yield b"", str(err)
            continue
        if not raw:
            return
        yield raw, None


def _decode_line(raw: bytes) -> "tuple[str, Optional[str]]":
    """(text, None), or ("", why the line cannot be a message)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return (
            "",
            f"the line is not UTF-8 text (bad byte at offset {err.start}); convert the input first, e.g. with iconv",
        )
    if "\x00" in text:
        return "", "the line contains NUL bytes (binary input?); pass text"
    return text, None
