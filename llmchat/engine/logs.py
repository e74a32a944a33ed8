"""llama.cpp's own log, routed by us.

llama-cpp-python 0.3.36 maps ggml's log levels wrongly: with verbose=False it prints warnings and
hides errors. We install our own callback: nothing reaches stdout ever; with --verbose every line
but the debug ones goes to stderr; without it, nothing is printed, but the latest error lines are
kept so that a failure (e.g. "Failed to create llama_context") can say *why* in its one-line
message. The "offloaded N/M layers to GPU" line is kept too, for the backend notice.

While a model loads, llama-cpp-python points file descriptors 1 and 2 at /dev/null (unless its own
verbose flag is set), which would swallow the load's lines under --verbose too; so verbose output
goes to a duplicate of stderr taken when the callback is installed.

The lines quote the model file's metadata (its name, its template, its tokens): on a terminal
they are made terminal-safe (llmchat.edges.safe_text); in a log they are written as they are.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections import deque

from llmchat import interrupts
from llmchat.edges.safe_text import for_stream
from llmchat.engine.bindings import llama_cpp
from llmchat.output import is_tty

GGML_LOG_LEVEL_DEBUG = 1  # per-tensor and per-layer lines: thousands per load, not shown
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5  # continuation of the previous line, same level

_state: dict = {"verbose": False, "last_level": 0, "stderr_fd": None, "stderr_tty": False, "installed": False}
recent_errors: deque[str] = deque(maxlen=8)
_partial_error: list[str] = []
# "load_tensors: offloaded 31/31 layers to GPU" (only GPU builds print it).
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
offloaded: dict[str, int] = {}


@llama_cpp.llama_log_callback
@interrupts.native_callback  # a Ctrl-C landing here is deferred, not dropped (llmchat.interrupts)
def _on_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace")
    if level == GGML_LOG_LEVEL_CONT:
        level = _state["last_level"]
    _state["last_level"] = level
    if level == GGML_LOG_LEVEL_ERROR:
        _partial_error.append(message)
        if message.endswith("\n"):
            recent_errors.append("".join(_partial_error).strip())
            _partial_error.clear()
    found = _OFFLOADED.search(message)
    if found:
        offloaded.update(layers=int(found.group(1)), of=int(found.group(2)))
    if _state["verbose"] and level != GGML_LOG_LEVEL_DEBUG:
        _write(message)


def _write(message: str) -> None:
    message = for_stream(message, _state["stderr_tty"])
    fd = _state["stderr_fd"]
    if fd is None:
        sys.stderr.write(message)
        return
    try:
        os.write(fd, message.encode("utf-8", errors="replace"))
    except OSError:
        pass  # stderr closed: the log is best-effort


def install(verbose: bool) -> None:
    """Install the callback (idempotent). `_on_log` is module-level, so ctypes keeps it alive."""
    _state["verbose"] = verbose
    _state["stderr_tty"] = is_tty(sys.stderr)
    if verbose and _state["stderr_fd"] is None:
        try:
            sys.stderr.flush()
            _state["stderr_fd"] = os.dup(sys.stderr.fileno())
        except (AttributeError, OSError, ValueError):
            pass  # no real stderr (embedded use): write through sys.stderr
    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
    _state["installed"] = True


def ensure_installed() -> None:
    """Route llama.cpp's log through llmchat if nothing has yet (a --verbose choice stays), so
    that a grammar parsed before any model loads prints nothing of its own."""
    if not _state["installed"]:
        install(False)


def last_error() -> str | None:
    return recent_errors[-1] if recent_errors else None


def first_error() -> str | None:
    """The earliest error kept since `recent_errors` was cleared: usually the cause, where the last
    one is often a generic wrapper ("llama_model_load_from_file_impl: failed to load model")."""
    return " ".join(recent_errors[0].split()) if recent_errors else None
