"""The progress a server reports while a call runs (`notifications/progress`), or the status of
a task it runs (llmchat.tools.mcp.tasks), on stderr.

On a terminal it is one line, rewritten in place and wiped when the call ends; elsewhere (a pipe,
a log file) each new state is one line of its own, so a log keeps what happened without the
carriage returns. The message is the server's: on a terminal it is made terminal-safe
(llmchat.edges.safe_text) and kept to one line, so that it cannot move the cursor nor break the line
that is rewritten.
"""

from __future__ import annotations

from typing import IO

from llmchat.edges.safe_text import terminal_safe
from llmchat.output import is_tty


class ProgressLine:
    def __init__(self, stream: IO[str], label: str):
        self.stream = stream
        self.label = label
        self.tty = is_tty(stream)
        self._last = ""
        self._drawn = False

    def update(self, progress: float, total: float | None, message: str | None) -> None:
        amount = f"{progress:g}/{total:g}" if total else f"{progress:g}"
        self._show(f"llmchat: {self.label}: progress {amount}" + (f" ({message})" if message else ""))

    def status(self, status: str, message: str | None) -> None:
        """A task's status (`working`, `input_required`, ...) and the server's words for it."""
        self._show(f"llmchat: {self.label}: task {status}" + (f" ({message})" if message else ""))

    def _show(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        try:
            if self.tty:
                one_line = " ".join(text.split())  # whatever the server wrote: the line is rewritten in place
                self.stream.write("\r\x1b[K" + terminal_safe(one_line))
                self._drawn = True
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr must not fail the call
            pass

    def end(self) -> None:
        if self._drawn:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._drawn = False
