"""What the MCP SDK logs, in one line: never a traceback on stderr.

The SDK logs through `logging`, under "mcp" (its modules), "client" (the name mcp.client.session
gives its logger) and "mcp_types"; httpx2 under its own name. Left to Python's last-resort
handler, a warning with its exception is a whole traceback on stderr: a server's
`notifications/progress` without its progressToken printed one ("Failed to validate
notification"), though the call went on and succeeded. So:
- the "client" logger's warnings and errors (a message from the server the session could not
  take) become one line on the stderr of the connection whose event loop logged them:
  `llmchat: MCP server NAME: MESSAGE`, the first line of the message, each line once per
  connection; the server's words in it pass llmchat.edges.safe_text on a terminal;
- the other loggers stay silent: what they say about a failure the connection says itself, as the
  one line of the request that failed (a malformed line, a closed connection); the rest is the
  SDK's noise about its own shutdown.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

from llmchat.edges.safe_text import for_stream
from llmchat.output import is_tty, notice

SILENT = ("mcp", "mcp_types", "httpx2")
TOLD = "client"


class _Speaker:
    def __init__(self, label: str, stream: IO[str]):
        self.label = label
        self.stream = stream
        self.said: set[str] = set()


class OneLine(logging.Handler):
    """Each record one line, on the stderr of the connection whose loop thread logged it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._speakers: dict[int, _Speaker] = {}
        self._unknown = _Speaker("MCP", sys.stderr)
        self._guard = threading.Lock()

    def speak_for(self, thread: int, label: str, stream: IO[str]) -> None:
        with self._guard:
            self._speakers[thread] = _Speaker(label, stream)

    def forget(self, thread: int) -> None:
        with self._guard:
            self._speakers.pop(thread, None)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            words = record.getMessage().strip().splitlines()
        except Exception:  # arguments that do not fit the message: its bare text
            words = str(record.msg).strip().splitlines()
        with self._guard:
            speaker = self._speakers.get(record.thread or 0, self._unknown)
            line = f"llmchat: {speaker.label}: {words[0] if words else record.levelname.lower()}"
            if line in speaker.said:
                return
            speaker.said.add(line)
        try:
            notice(for_stream(line, is_tty(speaker.stream)), speaker.stream)
        except (OSError, ValueError):  # a closed or broken stderr must not fail the server's loop
            pass


_handler = OneLine()


def install() -> OneLine:
    """Route the SDK's loggers (idempotent): "client" to one line, the others to nothing."""
    for name in SILENT:
        _only(logging.getLogger(name), logging.NullHandler())
    _only(logging.getLogger(TOLD), _handler)
    return _handler


def _only(logger: logging.Logger, handler: logging.Handler) -> None:
    if not any(type(present) is type(handler) for present in logger.handlers):
        logger.addHandler(handler)
    logger.propagate = False


@contextmanager
def told_as(label: str, stream: IO[str], portal: Any) -> Iterator[None]:
    """While the block runs, what the SDK logs on the portal's loop thread is said as `label`'s."""
    handler = install()
    thread = portal.call(threading.get_ident)
    handler.speak_for(thread, label, stream)
    try:
        yield
    finally:
        handler.forget(thread)
