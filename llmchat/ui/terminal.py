"""The terminal around the chat prompt: what Ctrl-C does at the prompt, the terminal settings while
a reply streams, and the file that keeps the lines typed (during a reply, Ctrl-C follows
llmchat.interrupts.FirstCtrlCOnly).

Kept apart from the loop (llmchat.ui.chat) because each piece is a small state machine or a
context manager that tests drive without a model.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    from prompt_toolkit.history import History


class CtrlCGuard:
    """What Ctrl-C does at the prompt: clear a non-empty line; on an empty one, hint first, then exit.

    "Consecutive" means no typing in between: any change to the line (or a new prompt) disarms it.
    """

    CLEAR, HINT, EXIT = "clear", "hint", "exit"

    def __init__(self) -> None:
        self.armed = False

    def press(self, line: str) -> str:
        if line:
            self.armed = False
            return self.CLEAR
        if self.armed:
            return self.EXIT
        self.armed = True
        return self.HINT

    def reset(self) -> None:
        self.armed = False


def input_history(
    warn: Callable[[str], None], persist: bool = True, owner: Callable[[], str | None] = lambda: None
) -> tuple[History, Callable[[], None]]:
    """A FileHistory at `paths.input_history_file()`, or an in-memory one when that file cannot be
    written (with one warning) or when the chat keeps no history (`persist=False`); and what ties
    the lines typed so far to their conversation once it exists (llmchat.store.typed_lines: each line
    is tagged with the conversation `owner()` names, so that deleting it deletes them).

    Every line typed is in that file, so it is created 0600 in a 0700 folder whatever the umask."""
    import os

    from prompt_toolkit.history import FileHistory, InMemoryHistory

    from llmchat import paths
    from llmchat.private_files import ensure_private_dir, open_private
    from llmchat.store.typed_lines import TaggedLines

    def nothing_to_tie() -> None:
        return None

    if not persist:
        return InMemoryHistory(), nothing_to_tie
    path = paths.input_history_file()
    try:
        ensure_private_dir(path.parent)
        os.close(open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
    except OSError as err:
        warn(
            f"warning: cannot write the input history {path} ({err.strerror or err}); lines typed now are kept for this chat only"
        )
        return InMemoryHistory(), nothing_to_tie
    tagged = TaggedLines(path, owner)

    class SafeFileHistory(FileHistory):
        """Entries tagged with their conversation (llmchat.store.typed_lines). A write that fails later
        (disk full, file removed with its folder) must not end the chat: warn once, keep the rest
        of the lines in memory."""

        failed = False

        def store_string(self, string: str) -> None:
            self._write(lambda: tagged.append(tagged.entry(string)))

        def settle(self) -> None:
            self._write(tagged.settle)

        def _write(self, write: Callable[[], None]) -> None:
            if self.failed:
                return
            try:
                write()
            except OSError as err:
                self.failed = True
                warn(
                    f"warning: cannot write the input history {path} ({err.strerror or err}); lines typed now are kept for this chat only"
                )

        def load_history_strings(self) -> Iterator[str]:
            try:
                yield from super().load_history_strings()
            except (OSError, UnicodeDecodeError):
                return

    history = SafeFileHistory(str(path))
    return history, history.settle


@contextmanager
def quiet_terminal(stream: IO[str]) -> Iterator[None]:
    """Terminal settings for while a reply streams.

    - No ECHO: keys typed ahead would land in the middle of the reply (and Ctrl-C would leave a
      `^C`). They stay in the input queue and prompt-toolkit shows them at the next prompt; a
      question asked during the reply (llmchat.edges.person) discards them and turns echo on for its
      answer.
    - NOFLSH: Ctrl-C must not make the terminal driver discard its queues, or the readout's
      escape sequences still in the output queue could be cut in half (and typed-ahead text lost).
    Signals still work: ISIG is untouched, so Ctrl-C still interrupts the reply."""
    try:
        import termios
    except ImportError:  # no termios (Windows)
        yield
        return
    try:
        fd = stream.fileno()
        saved = termios.tcgetattr(fd)
    except (OSError, ValueError, AttributeError, termios.error):  # not a terminal (tests, pipes, a file)
        yield
        return
    quiet = list(saved)
    quiet[3] = (quiet[3] & ~termios.ECHO) | termios.NOFLSH
    try:
        termios.tcsetattr(fd, termios.TCSANOW, quiet)  # TCSANOW: keep what was typed ahead
    except (OSError, termios.error):
        yield
        return
    try:
        yield
    finally:
        try:
            termios.tcsetattr(fd, termios.TCSANOW, saved)
        except (OSError, termios.error):
            pass
