"""llama.cpp's own log, routed by us.

llama-cpp-python 0.3.36 maps ggml's log levels wrongly: with verbose=False it prints warnings and
hides errors. We install our own callback: nothing reaches stdout ever; with --verbose every line
goes to stderr; without it, nothing is printed, but the latest error lines are kept so that a
failure (e.g. "Failed to create llama_context") can say *why* in its one-line message.
"""

from __future__ import annotations

import ctypes
import sys
from collections import deque

import llama_cpp

GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5  # continuation of the previous line, same level

_state = {"verbose": False, "last_level": 0}
recent_errors: deque[str] = deque(maxlen=8)
_partial_error: list[str] = []


@llama_cpp.llama_log_callback
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
    if _state["verbose"]:
        sys.stderr.write(message)


def install(verbose: bool) -> None:
    """Install the callback (idempotent). `_on_log` is module-level, so ctypes keeps it alive."""
    _state["verbose"] = verbose
    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))


def last_error() -> str | None:
    return recent_errors[-1] if recent_errors else None


def first_error() -> str | None:
    """The earliest error kept since `recent_errors` was cleared: usually the cause, where the last
    one is often a generic wrapper ("llama_model_load_from_file_impl: failed to load model")."""
    return " ".join(recent_errors[0].split()) if recent_errors else None
