"""The console entry point: the signal handlers first, then everything else.

Importing the command line (Typer, rich, the commands) takes a few hundred milliseconds, and a
Ctrl-C during it used to print a traceback from llmchat's imports. Here the handlers of
`llmchat.interrupts` are installed before any of that, so an interrupt at any moment from now on
ends in one line and exit 130 (143 for SIGTERM). Before this module runs, Python's own start-up
handles the signal: the process is killed by it.

A one-shot `ask` whose options llmchat.quick_ask reads runs from there, without Typer; every other
command line goes to llmchat.cli.

The process's `hashlib` is also set up here, before anything imports it: CPython's own hash
functions instead of OpenSSL's (see `_hashlib_without_openssl`).
"""

import sys
from typing import Callable, NoReturn


def main() -> None:
    _hashlib_without_openssl()
    from llmchat import interrupts

    interrupts.install()
    try:
        run = _runner(sys.argv[1:])
    except SystemExit:
        if interrupts.terminated():
            _stopped("terminated (SIGTERM)", interrupts.TERMINATED_EXIT)
        raise
    except (KeyboardInterrupt, RuntimeError) as err:  # Python wraps a signal's exception in some imports
        _stopped_by_signal(err)
    try:
        run()
    except SystemExit as done:
        if done.code in (130, interrupts.TERMINATED_EXIT):
            _exit_now(int(done.code))
        _collector_off_for_teardown()
        raise
    except (KeyboardInterrupt, RuntimeError) as err:  # in the few steps before the command's own handling
        _stopped_by_signal(err)
    _collector_off_for_teardown()


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
    """What runs this command line: a one-shot `ask` that llmchat.quick_ask reads, without Typer;
    anything else, the command line of llmchat.cli."""
    if args[:1] == ["ask"]:
        from llmchat import quick_ask

        given = quick_ask.parse(args[1:])
        if given is not None:
            return quick_ask.runner(given)
    from llmchat.cli import main as run

    return run


def _hashlib_without_openssl() -> None:
    """Import `hashlib` with OpenSSL's `_hashlib` hidden, so it takes CPython's own md5, sha1,
    sha2, sha3 and blake2 (the same digests). Loading OpenSSL's libcrypto costs 3.5-4 MiB of
    resident memory, a quarter of what llmchat adds to a one-shot `ask` (peak RSS against
    llama-completion's, bench/oneshot_vs_completion.py), and nothing in the process needs it:
    Jinja imports hashlib only for a bytecode cache llmchat does not use, and llmchat's own
    digests are SHA-256 cache keys and attachment checksums. Lost: OpenSSL's extra algorithms in
    `hashlib.new`, `pbkdf2_hmac` and `scrypt`, which nothing here calls. `_hashlib` is visible
    again afterwards: `hmac` or `ssl` load OpenSSL themselves where an MCP connection needs them."""
    if "hashlib" in sys.modules:
        return
    sys.modules["_hashlib"] = None  # type: ignore[assignment]  # None: "import _hashlib" fails
    try:
        import hashlib  # noqa: F401
    finally:
        del sys.modules["_hashlib"]


def _collector_off_for_teardown() -> None:
    """The command is done and everything it opened is closed: what is left is the interpreter's
    teardown, whose garbage collections trace every object the run made (Jinja's, Typer's, the
    modules') only to find them alive until their modules are cleared. That was about 100 ms of a
    one-shot `ask` on a small model, 5 % of its wall time (bench/oneshot_vs_completion.py).
    Frozen, those objects are skipped by the collector; the teardown still runs as ever (the
    exit handlers, the streams flushed, each module cleared), and the process ends just after."""
    import gc

    gc.freeze()


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


def _stopped(message: str, code: int) -> NoReturn:
    try:
        sys.stderr.write(("\n" if sys.stderr.isatty() else "") + f"llmchat: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(code)


if __name__ == "__main__":
    main()
