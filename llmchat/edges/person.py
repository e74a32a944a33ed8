"""The person at the terminal: the one object that asks them every question.

Every question llmchat asks while it runs goes through `Person.ask`: the approval of a tool call
(llmchat.tools.approval), an MCP server's form or URL (llmchat.tools.mcp.elicitation, form), a
server's request for a completion (llmchat.tools.mcp.sampling) and an MCP prompt's missing
argument (llmchat.tools.mcp.sources). So one rule says whether a person is there, and one way asks:

- A person is there when the run is attended (a batch is not), stderr is a terminal to write the
  question on, and a terminal gives the answers: stdin, or the controlling terminal (/dev/tty)
  when stdin is piped (`cat notes.txt | llmchat ask ...`), as sudo and ssh ask for a password.
  Where nobody is there the caller answers at once (a refusal, a declined form), never waits.
- The question and the lines shown with it pass llmchat.edges.safe_text.terminal_safe: they hold text
  from outside (a tool's arguments, a server's message, a URL, a form field's title, the messages
  of a request), and a server must not hide what is approved behind cursor movement, or show one
  URL and link another.
- The answer is typed in the terminal's line mode with echo on, whatever the chat set while the
  reply streams (llmchat.ui.terminal.quiet_terminal turns echo off), and what was typed before the
  question was shown is discarded first, as sudo does: a "y" typed while the reply streamed does
  not answer it. The terminal's settings are put back after.
- Ctrl-C and the end of input at the question are no answer (None): the caller's "no", never the
  end of the turn. That Ctrl-C was the question's (llmchat.interrupts.taken_by_a_question), so the
  chat's next Ctrl-C stops the turn again.

The command makes the run's Person (`use`: `batch` makes one nobody attends); the code that asks
finds it with `current()`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from llmchat import interrupts
from llmchat.edges.safe_text import terminal_safe
from llmchat.output import is_tty

ANSWER_BYTES = 4096  # one line in the terminal's line mode (Linux keeps at most 4,095 characters)


class Person:
    """Whoever runs llmchat, at its terminal. `stdin`, `stderr`: the command's streams (None: the
    process's, as they are when a question is asked); `attended` False: nobody is there (batch)."""

    def __init__(self, stdin: IO[str] | None = None, stderr: IO[str] | None = None, *, attended: bool = True):
        self._stdin = stdin
        self._stderr = stderr
        self._attended = attended
        self._tty: IO[str] | None = None  # the controlling terminal, opened once where stdin is piped
        self._tty_tried = False

    @property
    def stderr(self) -> IO[str]:
        return self._stderr if self._stderr is not None else sys.stderr

    def present(self) -> bool:
        """The one rule: the run is attended, and there is a terminal to ask on and to answer from."""
        return self._attended and is_tty(self.stderr) and self._answers() is not None

    def say(self, line: str) -> None:
        """A line for the person about the question asked (terminal-safe: it may quote a server)."""
        self._write(line + "\n")

    def ask(self, question: str, about: Sequence[str] = ()) -> str | None:
        """The line typed after `question` (its lines `about` first), without its newline. None
        where nobody is there, at the end of input, and for a Ctrl-C: no answer."""
        answers = self._answers() if self.present() else None
        if answers is None:
            return None
        try:
            for line in about:
                self._write(line + "\n")
            # Echo on and the typed-ahead input discarded before the question is shown: what is
            # typed once it is there is kept, whatever the timing.
            with _answer_mode(answers):
                self._write(question)
                typed = _read_line(answers)
        except KeyboardInterrupt:  # the question's Ctrl-C: no answer, and the turn goes on
            self._write("\n")
            interrupts.taken_by_a_question()
            return None
        if typed is None:  # the end of input (Ctrl-D)
            self._write("\n")
            return None
        return typed.rstrip("\r\n")

    def _answers(self) -> IO[str] | None:
        stdin = self._stdin if self._stdin is not None else sys.stdin
        if is_tty(stdin):
            return stdin
        if not self._tty_tried:
            self._tty_tried = True
            try:
                self._tty = open("/dev/tty", encoding="utf-8", errors="replace")  # closed at exit
            except OSError:  # no controlling terminal (a service, a container without one)
                self._tty = None
        return self._tty

    def _write(self, text: str) -> None:
        self.stderr.write(terminal_safe(text))
        self.stderr.flush()


def _read_line(answers: IO[str]) -> str | None:
    """One line typed on the terminal `answers`; None at the end of input."""
    try:
        fd = answers.fileno()
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor
        return answers.readline() or None
    # The descriptor, not the stream: a line read through the stream's buffer could leave the next
    # one there, out of reach of the terminal's flush before the next question.
    data = os.read(fd, ANSWER_BYTES)
    return data.decode("utf-8", errors="replace") if data else None


@contextmanager
def _answer_mode(answers: IO[str]) -> Iterator[None]:
    """Line mode with echo on, the input typed so far discarded (TCIFLUSH, as sudo does); the
    terminal's settings put back after."""
    try:
        import termios
    except ImportError:  # no termios (Windows)
        yield
        return
    try:
        fd = answers.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, AttributeError, termios.error):  # no descriptor, or not a terminal
        yield
        return
    shown = list(saved)
    shown[3] |= termios.ECHO | termios.ICANON | termios.ECHOE | termios.ECHOK
    try:
        termios.tcsetattr(fd, termios.TCSANOW, shown)
        termios.tcflush(fd, termios.TCIFLUSH)
    except termios.error:
        pass
    try:
        yield
    finally:
        try:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
        except termios.error:
            pass


_run: list[Person | None] = [None]


def use(person: Person | None) -> None:
    """The run's Person from now on (None: a fresh one on the process's streams at the next use)."""
    _run[0] = person


def current() -> Person:
    """The run's Person: the command's, else one on the process's streams who attends it."""
    person = _run[0]
    if person is None:
        person = _run[0] = Person()
    return person
