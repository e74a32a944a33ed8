"""llmchat: local chat for GGUF models through llama.cpp."""

import sys as _sys

__version__ = "0.1.0"


def _stop_at_once(signum: int, _frame: object) -> None:
    """Until `llmchat.launch` installs the real handlers (llmchat.interrupts), a signal ends the
    process here, with its one line and exit code: nothing is open yet that needs cleaning up, and
    an exception would print a traceback from the middle of an import."""
    import os

    os.write(2, b"llmchat: terminated (SIGTERM)\n" if signum == 15 else b"llmchat: interrupted\n")
    os._exit(128 + signum)


# As the command line (`llmchat ...` or `python -m llmchat`, whose argv[0] is "-m" while this
# package is imported), take over SIGINT and SIGTERM from the first line of llmchat's code. The C
# module behind `signal` is loaded with the interpreter, so taking it leaves no gap; `signal` itself
# builds its enums first (a Ctrl-C there would be a traceback from this line), and is the fallback
# where a Python build has no `_signal`.
if _sys.argv and (_sys.argv[0] == "-m" or _sys.argv[0].replace("\\", "/").rsplit("/", 1)[-1].startswith("llmchat")):
    try:
        import _signal  # type: ignore[import-not-found,unused-ignore]
    except ImportError:  # pragma: no cover - a Python without it
        import signal as _signal

    _signal.signal(_signal.SIGINT, _stop_at_once)
    _signal.signal(_signal.SIGTERM, _stop_at_once)
