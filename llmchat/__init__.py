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
# package is imported), take over SIGINT and SIGTERM from the first line of llmchat's code.
if _sys.argv and (_sys.argv[0] == "-m" or _sys.argv[0].replace("\\", "/").rsplit("/", 1)[-1].startswith("llmchat")):
    import signal as _signal

    _signal.signal(_signal.SIGINT, _stop_at_once)
    _signal.signal(_signal.SIGTERM, _stop_at_once)
