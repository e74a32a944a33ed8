"""The command line: commands and options, and the one place where errors become exit codes.

Heavy modules (llama_cpp, rich, prompt-toolkit) are imported inside the commands, so that
`llmchat --help` stays fast. (No `from __future__ import annotations` here: Typer reads the
annotations at run time, including those that `options.model_command` adds.)
"""

import errno
import os
import signal
import sys
from typing import Annotated, Optional

import typer

try:  # recent Typer vendors its own copy of click; its exceptions are the ones raised
    from typer import _click as click
except ImportError:  # pragma: no cover - older Typer
    import click

from llmchat import cmd_batch, cmd_bench, cmd_history, cmd_info, cmd_template
from llmchat.errors import ExitCode, LlmchatError, UsageError
from llmchat.options import RunOptions, model_command

app = typer.Typer(
    name="llmchat",
    help="Chat with local GGUF models through llama.cpp: streaming replies with live TTFT and tokens/s.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(cmd_template.app, name="template", help="List, inspect and render chat templates.")
app.add_typer(cmd_history.app, name="history", help="Saved conversations.")
app.add_typer(cmd_info.app, name="info", help="What a model needs: architecture, KV-cache math, memory fit.")
app.command("batch", epilog="Exit codes: 0 every item ok, 1 some item failed, 2 usage, 3 model, 130 interrupted.")(cmd_batch.batch)
app.command("bench")(cmd_bench.bench)
config_app = typer.Typer(no_args_is_help=True, help="The config file.")
app.add_typer(config_app, name="config")

EXIT_CODES_HELP = "Exit codes: 0 ok, 1 error, 2 usage, 3 model, 4 context, 130 interrupted, 141 closed output."


@app.callback(invoke_without_command=True, epilog=EXIT_CODES_HELP)
def _root(ctx: typer.Context) -> None:
    """Bare `llmchat` on a terminal opens a chat; otherwise it shows this help."""
    if ctx.invoked_subcommand is None:
        if sys.stdin.isatty() and sys.stdout.isatty():
            ctx.invoke(chat)
        else:
            typer.echo(ctx.get_help())


# --- ask ------------------------------------------------------------------------------------------
def read_prompt(argument: Optional[str]) -> str:
    """The prompt from piped stdin, the argument, or both (stdin first: `cat notes | llmchat ask "summarise"`)."""
    parts = []
    if not sys.stdin.isatty():
        raw = sys.stdin.buffer.read()
        try:
            piped = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise UsageError(f"stdin is not UTF-8 text (bad byte at offset {err.start}); convert it first, e.g. with iconv") from None
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
    if not prompt.strip():
        raise UsageError('empty prompt: pass it as an argument (llmchat ask "...") or pipe it on stdin')
    return prompt


@app.command(epilog=EXIT_CODES_HELP)
@model_command()
def ask(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt. Piped stdin comes first, then this.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object: reply, model, finish_reason, stats.")] = False,
    stats: Annotated[bool, typer.Option("--stats/--no-stats", help="Stats on stderr (default: on a terminal only).")] = None,
    continue_last: Annotated[bool, typer.Option("--continue", "-c", help="Continue the most recent conversation.")] = False,
    cid: Annotated[Optional[str], typer.Option("--cid", help="Continue the conversation with this id (or name).")] = None,
    overflow: Annotated[str, typer.Option("--overflow", help="When the conversation outgrows the context: error | drop (oldest exchanges).")] = "error",
    no_history: Annotated[bool, typer.Option("--no-history", help="Do not save this exchange.")] = False,
    *,
    opts: RunOptions,
) -> None:
    """One prompt, one streamed reply on stdout."""
    from llmchat.render import StreamPrinter, is_tty, write_json

    check_overflow(overflow)
    text = read_prompt(prompt)
    session = start_session(opts, overflow=overflow, history=not no_history)
    try:
        if continue_last or cid:
            continue_conversation(session, cid or "last")
        on_terminal = is_tty(sys.stderr)
        show_stats = on_terminal if stats is None else stats
        printer = StreamPrinter(
            show_live=show_stats and on_terminal and not json_output,
            show_summary=show_stats and not json_output,
            echo_text=not json_output,
            mark_interrupted=False,  # `main` reports the interruption in its one line
        )
        result = run_turn(session, text, printer)
        if json_output:
            write_json(
                {
                    "reply": result.reply,
                    "model": session.model_label,
                    "template": session.template.name,
                    "finish_reason": result.finish_reason,
                    "seed": result.seed,
                    "conversation_id": session.conversation_id,
                    "stats": result.stats.to_dict(),
                }
            )
        if result.interrupted:
            raise KeyboardInterrupt
    finally:
        close_session(session)


# --- chat -----------------------------------------------------------------------------------------
@app.command(epilog=EXIT_CODES_HELP)
@model_command()
def chat(
    json_output: Annotated[bool, typer.Option("--json", help="Scripted chat: one JSON object per turn.")] = False,
    stats: Annotated[Optional[bool], typer.Option("--stats/--no-stats", help="Live readout and per-reply summary.")] = None,
    markdown: Annotated[Optional[bool], typer.Option("--markdown/--plain", help="Render each finished reply as Markdown.")] = None,
    resume: Annotated[Optional[str], typer.Option("--resume", "-r", help="Continue a saved conversation: an id, a name or 'last'.")] = None,
    overflow: Annotated[str, typer.Option("--overflow", help="When the conversation outgrows the context: drop (oldest exchanges) | error.")] = "drop",
    no_history: Annotated[bool, typer.Option("--no-history", help="Do not save this conversation.")] = False,
    *,
    opts: RunOptions = RunOptions(),
) -> None:
    """Chat: interactive on a terminal; with piped stdin, one message per line and one reply per turn."""
    check_overflow(overflow)
    session = start_session(opts, overflow=overflow, history=not no_history)
    try:
        if resume:
            continue_conversation(session, resume)
        interactive = sys.stdin.isatty() and not json_output
        if interactive:
            from llmchat.chat_ui import run_interactive

            config = session.loaded_config
            run_interactive(
                session,
                show_stats=config.stats if stats is None else stats,
                markdown=config.markdown if markdown is None else markdown,
                verbose=opts.verbose,
            )
        else:
            exit_code = run_scripted_chat(session, json_output=json_output, show_stats=bool(stats))
            if exit_code:
                raise typer.Exit(exit_code)
    finally:
        close_session(session)


def run_scripted_chat(session, *, json_output: bool, show_stats: bool) -> int:
    """One user message per stdin line; each reply on stdout (or one JSON object per turn)."""
    from llmchat.errors import ContextOverflowError
    from llmchat.render import StreamPrinter, notice, write_json

    exit_code = 0
    turn_number = 0
    # Bytes, decoded line by line: one undecodable line is reported like any bad message, and
    # never reaches the tokenizer as surrogates (text-mode stdin would pass them through).
    for raw in sys.stdin.buffer:
        message, bad_input = _decode_line(raw.rstrip(b"\r\n"))
        if not bad_input and not message.strip():
            continue
        turn_number += 1
        printer = StreamPrinter(show_live=False, show_summary=show_stats, echo_text=not json_output, mark_interrupted=False)
        try:
            if bad_input:
                raise UsageError(bad_input)
            result = run_turn(session, message, printer)
        except (ContextOverflowError, UsageError) as err:
            # The session goes on: this message is reported and skipped, nothing else is lost.
            notice(f"llmchat: error: turn {turn_number}: {err}")
            exit_code = exit_code or int(err.exit_code)
            if json_output:
                write_json({"turn": turn_number, "reply": None, "finish_reason": "error", "error": str(err), "stats": None})
            continue
        stats = result.stats
        if stats.messages_dropped:
            notice(stats.trim_notice(session.budget().prompt_limit))
        if json_output:
            write_json({"turn": turn_number, "reply": result.reply, "finish_reason": result.finish_reason, "error": None, "stats": stats.to_dict()})
        if result.interrupted:
            raise KeyboardInterrupt
    return exit_code


def _decode_line(raw: bytes) -> tuple[str, str | None]:
    """(text, None), or ("", why the line cannot be a message)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return "", f"the line is not UTF-8 text (bad byte at offset {err.start}); convert the input first, e.g. with iconv"
    if "\x00" in text:
        return "", "the line contains NUL bytes (binary input?); pass text"
    return text, None


# --- shared plumbing ------------------------------------------------------------------------------
def run_turn(session, text: str, printer):
    """One turn for ask and scripted chat. When saving it to the history fails (disk full, read-only,
    locked past the timeout), the reply has still been produced: finish showing it, warn once, and
    go on without history, as the interactive chat does. The exit status stays that of the reply.
    """
    from llmchat.errors import HistoryError
    from llmchat.render import notice

    before = session.last_result
    try:
        return session.turn(text, printer)
    except HistoryError as err:
        result = session.last_result
        if result is before:  # failed before a reply existed (not expected): a real error
            printer.abort()
            raise
        printer.finished(result)
        store, session.history = session.history, None
        try:
            store.close()
        except Exception:  # the store is already broken; closing is a courtesy
            pass
        notice(f"warning: {err}; this reply was not saved, and nothing more will be")
        return result
    except BaseException:
        printer.abort()
        raise


def check_overflow(value: str) -> None:
    if value not in ("drop", "error"):
        raise UsageError(f"--overflow must be drop or error, got {value!r}")


def start_session(opts: RunOptions, *, overflow: str, history: bool):
    from llmchat.loading import start_session as load_session

    return load_session(opts, overflow=overflow, with_history=history)


def continue_conversation(session, reference: str) -> None:
    if session.history is None:
        raise UsageError("continuing a conversation needs the history; drop --no-history")
    session.load_conversation(session.history.get(reference))


def close_session(session) -> None:
    if session.history is not None:
        session.history.close()
    session.engine.close()


# --- config ---------------------------------------------------------------------------------------
@config_app.command("path")
def config_path() -> None:
    """Print where the config file lives."""
    from llmchat import paths

    typer.echo(str(paths.config_file()))


@config_app.command("show")
def config_show() -> None:
    """Print the config in effect (after checking it)."""
    import json

    from llmchat.config import load_config

    config = load_config()
    shown = {k: v for k, v in vars(config).items() if k not in ("path", "exists")}
    typer.echo(f"# {config.path}" + ("" if config.exists else " (not created yet: defaults)"))
    typer.echo(json.dumps(shown, indent=2, ensure_ascii=False))


# --- entry point ----------------------------------------------------------------------------------
def report_error(message: str) -> None:
    """One line on stderr: the whole contract for errors the user can act on."""
    sys.stderr.write(f"llmchat: error: {message}\n")
    sys.stderr.flush()


_terminated = False


def _terminate(signum, frame) -> None:
    # SIGTERM unwinds like Ctrl-C (finally blocks close history and outputs), then exits 143.
    # Only the first one: a second SIGTERM must not cut that cleanup short (SIGKILL still works).
    global _terminated
    if _terminated:
        return
    _terminated = True
    raise SystemExit(int(ExitCode.TERMINATED))


def _from_broken_pipe(exc: BaseException) -> bool:
    """Whether an exit was caused by writing to a closed stdout. Typer turns that into a plain
    sys.exit(1), and rich into SystemExit(1); both raise it while handling the EPIPE error."""
    seen = exc.__context__
    while seen is not None:
        if isinstance(seen, BrokenPipeError) or (isinstance(seen, OSError) and seen.errno == errno.EPIPE):
            return True
        seen = seen.__context__
    return False


def _stopped(message: str, code: ExitCode) -> None:
    # On a terminal the line starts fresh after the echoed ^C; elsewhere it is exactly one line.
    try:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + f"llmchat: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(int(code))


def _interrupted() -> None:
    _stopped("interrupted", ExitCode.INTERRUPTED)


def _quiet_broken_pipe() -> None:
    """The reader went away (`| head -c 20`): stop quietly. Point stdout at /dev/null so the
    interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Optional[list] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    signal.signal(signal.SIGTERM, _terminate)
    try:
        # Outside standalone mode, click turns `typer.Exit(code)` into the return value.
        returned = app(args=args, prog_name="llmchat", standalone_mode=False)
        if returned == ExitCode.INTERRUPTED:
            # Typer turns KeyboardInterrupt into a *returned* 130, without a word: say it here.
            # (batch reports its own interruption and raises SystemExit, which is not returned.)
            _interrupted()
        if isinstance(returned, int) and returned:
            sys.exit(returned)
    except SystemExit as done:
        if _terminated:
            _stopped("terminated (SIGTERM)", ExitCode.TERMINATED)
        if done.code and _from_broken_pipe(done):
            _quiet_broken_pipe()
            sys.exit(141)
        raise
    except LlmchatError as err:
        if debug:
            raise
        report_error(str(err))
        sys.exit(int(err.exit_code))
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except typer.Abort:
        _interrupted()
    except click.ClickException as err:
        if type(err).__name__ == "NoArgsIsHelpError" and getattr(err, "ctx", None) is not None:
            sys.stdout.write(err.ctx.get_help() + "\n")
            sys.exit(int(ExitCode.USAGE))
        hint = f" (see llmchat {err.ctx.command_path.split(' ', 1)[1]} --help)" if getattr(err, "ctx", None) and " " in err.ctx.command_path else " (see llmchat --help)"
        report_error(err.format_message().replace("\n", " ") + hint)
        sys.exit(int(ExitCode.USAGE))
    except KeyboardInterrupt:
        _interrupted()
    except BrokenPipeError:
        _quiet_broken_pipe()
        sys.exit(141)
    except OSError as err:
        if debug:
            raise
        where = f" ({err.filename})" if err.filename else ""
        report_error(f"{err.strerror or err}{where}; check the path and free space")
        sys.exit(int(ExitCode.ERROR))
    sys.exit(0)
