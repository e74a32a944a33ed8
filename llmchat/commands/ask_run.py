"""`llmchat ask`'s work: one prompt (argument and/or piped stdin), one streamed reply on stdout.

Apart from its Typer declaration (llmchat.commands.ask), which calls `run` with every parameter it
declares, so that a one-shot `ask` can run without importing Typer (llmchat.commands.quick_ask): about
3 MiB of a small model's peak RSS (bench/oneshot_rss_parts.py). The parameters and their
defaults are the declaration's; tests/test_quick_ask.py keeps them equal.
"""

from __future__ import annotations

from contextlib import ExitStack
from functools import partial
from typing import TYPE_CHECKING

from llmchat.defaults import DEFAULT_CHAIN_LIMIT
from llmchat.errors import LlmchatError, UsageError

if TYPE_CHECKING:
    from llmchat.env import Environment
    from llmchat.options import RunOptions


def read_prompt(
    argument: str | None,
    env: Environment,
    *,
    from_stdin: bool = True,
    may_be_empty: bool = False,
    context_tokens: int | None = None,
) -> str:
    """The prompt from piped stdin, the argument, or both (stdin first: `cat notes | llmchat ask "summarise"`).
    `from_stdin=False`: stdin is a file (`-f -`), not the prompt; `may_be_empty`: files carry the message.
    Stdin is read up to what a context of `context_tokens` (None: any) could hold: more is exit 4."""
    from llmchat.edges.bounded_input import read_stream, text_bound
    from llmchat.errors import ExitCode

    parts = []
    if from_stdin and not env.stdin_isatty:
        raw = read_stream(env.stdin.buffer, "stdin", text_bound(context_tokens), exit_code=ExitCode.CONTEXT)
        try:
            piped = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(
                f"stdin is not UTF-8 text (bad byte at offset {err.start}); convert it first, e.g. with iconv"
            ) from None
        if piped.strip():
            parts.append(piped.strip("\n"))
    if argument:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:  # undecodable argv bytes arrive as lone surrogates
            raise UsageError("the prompt argument is not UTF-8 text; convert it first, e.g. with iconv") from None
        parts.append(argument)
    prompt = "\n\n".join(parts)
    if "\x00" in prompt:
        raise UsageError("the prompt contains NUL bytes (binary input?); pass text")
    if not prompt.strip() and not may_be_empty:
        raise UsageError('empty prompt: pass it as an argument (llmchat ask "...") or pipe it on stdin')
    return prompt


def run(
    prompt: str | None = None,
    json_output: bool = False,
    stats: bool | None = None,
    continue_last: bool = False,
    cid: str | None = None,
    overflow: str = "error",
    compact: str | None = None,
    no_history: bool = False,
    files: list[str] | None = None,
    prompt_arg: list[str] | None = None,
    tool: list[str] | None = None,
    functions: list[str] | None = None,
    mcp: list[str] | None = None,
    root: list[str] | None = None,
    tool_choice: str = "auto",
    chain_limit: int = DEFAULT_CHAIN_LIMIT,
    approve_tools: bool = False,
    render: str | None = None,
    *,
    opts: RunOptions,
    env: Environment,
) -> None:
    """One prompt, one streamed reply on stdout."""
    from llmchat.startup.before_load import loading_ahead
    from llmchat.startup.loading import start_session

    config = env.config
    # From here llama.cpp loads the model on another thread while this command's imports and
    # checks run, MCP servers start and stdin is read; `start_session` takes it
    # (llmchat.startup.before_load.loading_ahead). A check that fails cancels it. What is read before the
    # load is bounded by the context it opens, where that is known (llmchat.edges.bounded_input).
    with loading_ahead(opts, config) as context_tokens:
        from llmchat.commands.turns import check_overflow, continue_conversation, run_turn
        from llmchat.edges import person
        from llmchat.edges.bounded_input import text_bound
        from llmchat.media.use import check_before_loading
        from llmchat.output import StreamPrinter, write_json
        from llmchat.tools import options as tool_options
        from llmchat.tools.mcp.roots import use_roots
        from llmchat.tools.mcp.run_mode import model_answers
        from llmchat.tools.mcp.sources import McpSources, argument_asker, joined
        from llmchat.turn.attachments import STDIN, collect
        from llmchat.turn.policy import INVALID_REPLY_EXIT
        from llmchat.turn.structured import from_options
        from llmchat.ui.markdown import MarkdownPrinter, wants_markdown

        check_overflow(overflow)
        use_roots(root)  # a --root that is not a folder: exit 2, before any MCP server starts
        model_answers()  # the servers it starts may ask this run's model (sampling)
        person.use(person.Person(env.stdin, env.stderr))  # who every question of the run is asked
        if compact is not None:  # a bad --compact: exit 2
            # Imported here only: without --compact, the turn's modules it pulls in load on another
            # thread while llama.cpp loads the model (llmchat.startup.loading), 40 ms off a one-shot's TTFT.
            from llmchat.turn.compaction import with_mode

            config = with_mode(config, compact)
        # A bad --render is exit 2 (the load cancelled); --json and a pipe get the model's text as it is.
        markdown = wants_markdown(render, env.config.render, env.stdout_isatty) and not json_output
        tools = tool_options.tool_request(tool, functions, mcp, tool_choice, chain_limit, approve_tools)
        saved = not no_history and config.history  # else the MCP servers' images go at exit, with the exchange
        toolset = tool_options.gather(tools, env.config, saved_conversation=saved)  # a bad -T: exit 2
        with tool_options.closed_on_failure(toolset):  # MCP servers stop if anything fails before the turn
            # Before the model is used: a binary or non-UTF-8 file is refused. MCP resources (-f
            # mcp:SERVER/URI) and an MCP prompt (-p mcp:SERVER/NAME) are read now, through the tools'
            # own connections where the server offers tools too.
            with McpSources(
                env.config, mcp or (), stderr=env.stderr, shared=toolset, saved_conversation=saved
            ) as sources:
                bound = text_bound(context_tokens)
                attachments = tuple(collect(files or (), resources=sources.resource_bytes, bound=bound))
                check_before_loading(opts, config, attachments)  # an image and no projector: exit 2 now
                asker = argument_asker(person.current())
                opening = sources.opening(opts.saved_prompt, prompt_arg or (), asker)
            typed = read_prompt(
                prompt,
                env,
                from_stdin=STDIN not in (files or ()),
                may_be_empty=bool(attachments) or bool(opening),
                context_tokens=context_tokens,
            )
            text = joined(opening, typed)
            tool_options.say_down(toolset)  # after -f/-p mcp:... naming one of them: exit 2
            structured = from_options(opts, env.config)  # a bad schema is a usage error (exit 2)
            session = start_session(opts, config=config, overflow=overflow, with_history=not no_history)
    try:
        session.hold_to(structured)
        if toolset is not None:
            tool_options.offer(session, toolset, tools, lazy_share=config.lazy_tools)
        if continue_last or cid:
            continue_conversation(session, cid or "last")
        if attachments:  # imported after the load: the turn's modules load beside it (llmchat.startup.loading)
            from llmchat.turn.room import check_room

            check_room(session, attachments, text, in_chat=False)  # too big for the room the turn makes: exit 2
        on_terminal = env.stderr_isatty
        show_stats = on_terminal if stats is None else stats
        printer_class = MarkdownPrinter if markdown else partial(StreamPrinter, echo_text=not json_output)
        printer = printer_class(
            env.stdout,
            env.stderr,
            show_live=show_stats and on_terminal and not json_output,
            show_summary=show_stats and not json_output,
            mark_interrupted=False,  # `main` reports the interruption in its one line
            out_isatty=env.stdout_isatty,
            err_isatty=env.stderr_isatty,
        )
        result = run_turn(session, text, printer, attachments)
        if json_output:
            write_json(result.to_record(), env.stdout)
        if result.interrupted:
            raise KeyboardInterrupt
        if result.error is not None:  # the policy every mode follows (llmchat.turn.policy)
            raise LlmchatError(result.error, exit_code=INVALID_REPLY_EXIT)
    finally:
        # Each is closed even when one closed before it fails (the MCP servers stop), the last opened first.
        with ExitStack() as closing:
            if toolset is not None:
                closing.callback(toolset.close)
            closing.callback(session.close)
