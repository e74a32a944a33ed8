"""The console entry point: the signal handlers first, then everything else.

Importing the command line (Typer, rich, the commands) takes a few hundred milliseconds, and a
Ctrl-C during it used to print a traceback from llmchat's imports. Here the handlers of
`llmchat.interrupts` are installed before any of that, so an interrupt at any moment from now on
ends in one line and exit 130 (143 for SIGTERM). Before this module runs, Python's own start-up
handles the signal: the process is killed by it.

A one-shot `ask` whose options llmchat.commands.quick_ask reads runs from there, without Typer; every other
command line goes to llmchat.cli.

Nothing here repairs CPython's state after the fact: a signal that lands inside the import system
is deferred by llmchat.interrupts (an exception raised there would outlive its catch), and acted on
at the checkpoint after the imports below. The exit is Python's own, with the command's code,
except after a signal, which ends the process without the interpreter's teardown once llmchat's own
cleanup has run (`_ended_by_signal`).
"""

import sys
from typing import Callable, NoReturn


def main() -> None:
    from llmchat import interrupts

    interrupts.install()
    try:
        run = _runner(sys.argv[1:])
        interrupts.raise_pending()  # one deferred while Python imported the command (llmchat.interrupts)
    except SystemExit:
        if interrupts.terminated():
            _stopped("terminated (SIGTERM)", interrupts.TERMINATED_EXIT)
        raise
    except (KeyboardInterrupt, RuntimeError) as err:  # Python wraps a signal's exception in some imports
        _stopped_by_signal(err)
    try:
        try:
            run()
        except (KeyboardInterrupt, RuntimeError) as err:  # in the few steps before the command's own handling
            _stopped_by_signal(err)
        finally:
            _no_load_left_running()
            _collector_off_for_teardown()
    except SystemExit as done:
        if done.code in (130, interrupts.TERMINATED_EXIT):
            _ended_by_signal(int(done.code))
        raise


def _ended_by_signal(code: int) -> NoReturn:
    """After a Ctrl-C or SIGTERM the run ends as a process a signal ends: its own cleanup has run
    (every `finally`, the servers and tools it started, the load it began, its temporary folder),
    and the interpreter's teardown is skipped. llama.cpp may still be inside a load it could not
    stop on a thread of its own, which a teardown meets in its log callback (SIGSEGV, about one
    sweep in five of tests/test_signals.py on a 2-core machine)."""
    import os

    private_files = sys.modules.get("llmchat.private_files")
    if private_files is not None:
        private_files.remove_temporary_dir()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _no_load_left_running() -> None:
    """A model load begun ahead (llmchat.engine.load_ahead) is stopped and freed before Python's
    exit, whichever way the command ended: the exit frees llama.cpp's static tables, which a load
    still in flight reads (a SIGSEGV after a Ctrl-C that landed while the load was beginning)."""
    load_ahead = sys.modules.get("llmchat.engine.load_ahead")
    if load_ahead is None:
        return
    try:
        load_ahead.cancel()
    except BaseException:  # noqa: BLE001 - a second signal while it stops: the run's own end stands
        pass


def _stopped_by_signal(err: BaseException) -> NoReturn:
    """One line and the signal's exit code for an interrupt raised outside a command's own handling
    (llmchat.exits); a RuntimeError that wraps no signal is raised again."""
    from llmchat import interrupts

    if isinstance(err, RuntimeError) and interrupts.signal_behind(err) is None:
        raise err
    if interrupts.terminated():
        _stopped("terminated (SIGTERM)", interrupts.TERMINATED_EXIT)
    _stopped("interrupted", 130)


def _runner(args: list[str]) -> Callable[[], None]:
    """What runs this command line: a one-shot `ask` that llmchat.commands.quick_ask reads, without Typer;
    anything else, the command line of llmchat.cli."""
    if args[:1] == ["ask"]:
        from llmchat.commands import quick_ask

        given = quick_ask.parse(args[1:])
        if given is not None:
            return quick_ask.runner(given)
    from llmchat.cli import main as run

    return run


def _collector_off_for_teardown() -> None:
    """The command is done and everything it opened is closed: what is left is the interpreter's
    teardown, whose garbage collections trace every object the run made (Jinja's, Typer's, the
    modules') only to find them alive until their modules are cleared. That was about 100 ms of a
    one-shot `ask` on a small model, 5 % of its wall time (bench/oneshot_vs_completion.py).
    Frozen, those objects are skipped by the collector; the teardown still runs as ever (the
    exit handlers, the streams flushed, each module cleared), and the process ends just after."""
    import gc

    gc.freeze()


def _stopped(message: str, code: int) -> NoReturn:
    try:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + f"llmchat: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":
    main()
