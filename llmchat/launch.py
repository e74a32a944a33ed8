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
    run()


def _stopped(message: str, code: int) -> None:
    try:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + f"llmchat: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":
    main()
