"""How a command's run ends: the one place where errors become one line and an exit code.

Every way a command runs goes through `run_guarded`: llmchat.cli for Typer's commands, and
llmchat.commands.quick_ask for a one-shot `ask` parsed without Typer. Each exception maps to one line on
stderr and a documented exit code; a closed stdout is a quiet 141; an interrupt, 130.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import TYPE_CHECKING, Callable, TextIO

from llmchat import interrupts
from llmchat.edges.safe_text import for_stream
from llmchat.errors import ExitCode, LlmchatError
from llmchat.output import is_tty

if TYPE_CHECKING:
    from llmchat.env import Environment


def report_error(message: str, stderr: TextIO, on_terminal: bool | None = None) -> None:
    """One line on stderr: the whole contract for errors the user can act on. The message may
    quote a server, a tool, a file or a template: made terminal-safe where stderr is a terminal
    (`on_terminal`: the environment's flag; else asked), exact in a log."""
    on_terminal = is_tty(stderr) if on_terminal is None else on_terminal
    stderr.write(f"llmchat: error: {for_stream(message, on_terminal)}\n")
    stderr.flush()


def from_broken_pipe(exc: BaseException) -> bool:
    """Whether an exit was caused by writing to a closed stdout. Typer turns that into a plain
    sys.exit(1), and rich into SystemExit(1); both raise it while handling the EPIPE error."""
    seen = exc.__context__
    while seen is not None:
        if isinstance(seen, BrokenPipeError) or (isinstance(seen, OSError) and seen.errno == errno.EPIPE):
            return True
        seen = seen.__context__
    return False


def stopped(env: Environment, message: str, code: ExitCode) -> None:
    # On a terminal the line starts fresh after the echoed ^C; elsewhere it is exactly one line.
    try:
        env.stderr.write(("\n" if env.stderr_isatty else "") + f"llmchat: {message}\n")
        env.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(int(code))


def interrupted(env: Environment) -> None:
    stopped(env, "interrupted", ExitCode.INTERRUPTED)


def quiet_broken_pipe() -> None:
    """The reader went away (`| head -c 20`): stop quietly. Point stdout at /dev/null so the
    interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def run_guarded(env: Environment, run: Callable[[], None], *, debug: bool) -> None:
    """Run a command (`run`) and end the process: exit 0, or the one line and exit code of what
    stopped it (`debug`: llmchat's own errors and OS errors raise, with their traceback)."""
    try:
        run()
        # A signal that landed inside one of llama.cpp's callbacks late in the run (after the last
        # decoded token) was recorded, not raised: it still ends the process by its code.
        interrupts.raise_pending()
    except SystemExit as done:
        if interrupts.terminated():
            stopped(env, "terminated (SIGTERM)", ExitCode.TERMINATED)
        if done.code and from_broken_pipe(done):
            quiet_broken_pipe()
            sys.exit(141)
        raise
    except LlmchatError as err:
        if debug:
            raise
        report_error(str(err), env.stderr, env.stderr_isatty)
        sys.exit(int(err.exit_code))
    except KeyboardInterrupt:
        interrupted(env)
    except RuntimeError as err:  # a signal's exception that Python wrapped during a late import
        if interrupts.signal_behind(err) is None:
            raise
        if interrupts.terminated():
            stopped(env, "terminated (SIGTERM)", ExitCode.TERMINATED)
        interrupted(env)
    except BrokenPipeError:
        quiet_broken_pipe()
        sys.exit(141)
    except OSError as err:
        if debug:
            raise
        where = f" ({err.filename})" if err.filename else ""
        report_error(f"{err.strerror or err}{where}; check the path and free space", env.stderr, env.stderr_isatty)
        sys.exit(int(ExitCode.ERROR))
    sys.exit(0)
