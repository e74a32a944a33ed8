"""The console entry point: the signal handlers first, then everything else.

Importing the command line (Typer, rich, the commands) takes a few hundred milliseconds, and a
Ctrl-C during it used to print a traceback from llmchat's imports. Here the handlers of
`llmchat.interrupts` are installed before any of that, so an interrupt at any moment from now on
ends in one line and exit 130 (143 for SIGTERM). Before this module runs, Python's own start-up
handles the signal: the process is killed by it.
"""

import sys


def main() -> None:
    from llmchat import interrupts

    interrupts.install()
    try:
        from llmchat.cli import main as run
    except KeyboardInterrupt:
        _stopped("interrupted", 130)
    except SystemExit:
        if interrupts.terminated():
            _stopped("terminated (SIGTERM)", interrupts.TERMINATED_EXIT)
        raise
    except RuntimeError as err:  # a signal's exception that Python wrapped during an import
        signum = interrupts.signal_behind(err)
        if signum is None:
            raise
        if interrupts.terminated():
            _stopped("terminated (SIGTERM)", interrupts.TERMINATED_EXIT)
        _stopped("interrupted", 130)
    try:
        run()
    except SystemExit as done:
        if done.code in (130, interrupts.TERMINATED_EXIT):
            _exit_now(int(done.code))
        raise


def _exit_now(code: int) -> None:
    """Exit with `code` exactly, skipping the interpreter's final teardown.

    CPython 3.11 remembers any KeyboardInterrupt that passed through code compiled from a string
    (dataclasses build their methods with exec(), so a Ctrl-C during an import can go through
    one), even when it was caught later, and then kills the process with SIGINT after its teardown
    instead of exiting 130. Everything llmchat opened is closed by now (the `finally` blocks ran);
    what is left is flushing the streams and the exit handlers."""
    import atexit
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    atexit._run_exitfuncs()
    os._exit(code)


def _stopped(message: str, code: int) -> None:
    try:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + f"llmchat: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":
    main()
