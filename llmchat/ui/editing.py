"""How the chat's prompt is edited: the message opened in `$VISUAL` / `$EDITOR`, and vi keys.

- Ctrl-X Ctrl-E (emacs keys, and vi's insert mode) or `v` (vi's normal mode) opens the message
  being typed in the editor, as bash and prompt-toolkit bind them. What the editor saves becomes
  the message, and Enter then sends it: prompt-toolkit's own binding would send it the moment the
  editor closes, before it could be read over. An editor that exits with an error, or saves what is
  not UTF-8 text, leaves the message as it was, with one line saying why.
- `editing_mode = "vi"` in the config (llmchat.config; default "emacs", IPython's and
  prompt-toolkit's names) gives vi keys; the prompt's line shows `-- NORMAL --` at its right end in
  normal mode (`-- VISUAL --`, `-- REPLACE --` in those), and nothing in insert mode, as vim's
  status line does. (prompt-toolkit's bottom toolbar would need the terminal to answer a cursor
  position request before it is drawn at all.)

The file the editor gets is private (0600, from mkstemp) and removed once it is read back. While
the editor runs, it owns the terminal and Ctrl-C is its own: llmchat ignores SIGINT until it exits
(as git does around its editor), so the chat and the message at its prompt outlive it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from prompt_toolkit.buffer import Buffer
    from prompt_toolkit.formatted_text import StyleAndTextTuples
    from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

# Tried in order when neither VISUAL nor EDITOR is set (Debian's `editor` names the system's choice).
FALLBACK_EDITORS = ("editor", "nano", "vi")
NO_EDITOR = "no editor to open the message in: set VISUAL or EDITOR (the message is unchanged)"


def editor_command() -> tuple[list[str], str] | None:
    """The editor's argv and where it came from: $VISUAL, $EDITOR, then the first fallback on PATH.
    ValueError for a variable that is not a command line (an unclosed quote)."""
    for variable in ("VISUAL", "EDITOR"):
        value = os.environ.get(variable, "").strip()
        if value:
            try:
                return shlex.split(value), variable
            except ValueError as err:
                raise ValueError(f"{variable}={value!r} is not a command line ({err})") from None
    for name in FALLBACK_EDITORS:
        path = shutil.which(name)
        if path:
            return [path], name
    return None


def edit_text(text: str, error: Callable[[str], None]) -> str | None:
    """Let the person edit `text` in their editor; the text it saved (one trailing newline off, as
    editors add it), or None when nothing changed hands (the reason told through `error`)."""
    try:
        found = editor_command()
    except ValueError as err:
        error(f"error: {err}; the message is unchanged")
        return None
    if found is None:
        error(f"error: {NO_EDITOR}")
        return None
    argv, source = found
    fd, name = tempfile.mkstemp(prefix="llmchat-message-", suffix=".md")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
        status = _run_in_the_foreground([*argv, name], error, source)
        if status is None:
            return None
        if status != 0:
            error(f"error: the editor ({source}) exited with status {status}; the message is unchanged")
            return None
        try:
            with open(name, encoding="utf-8") as file:
                edited = file.read()
        except UnicodeDecodeError:
            error("error: the editor saved text that is not UTF-8; the message is unchanged")
            return None
        return edited[:-1] if edited.endswith("\n") else edited
    finally:
        os.unlink(name)


def _run_in_the_foreground(argv: list[str], error: Callable[[str], None], source: str) -> int | None:
    """Run the editor on the terminal and wait for it; its exit status, or None when it could not
    start. SIGINT is ignored here meanwhile (the editor got the default, set before exec)."""
    try:
        child = subprocess.Popen(argv)
    except OSError as err:
        error(f"error: the editor {argv[0]!r} ({source}) could not be started: {err.strerror or err}")
        return None
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: Ctrl-C keeps its meaning
        return child.wait()
    try:
        return child.wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def editing_bindings(error: Callable[[str], None]) -> KeyBindings:
    """Ctrl-X Ctrl-E (emacs keys, vi insert mode) and `v` (vi normal mode): the message in the editor."""
    from prompt_toolkit.application import run_in_terminal
    from prompt_toolkit.document import Document
    from prompt_toolkit.filters import emacs_mode, vi_insert_mode, vi_navigation_mode
    from prompt_toolkit.key_binding import KeyBindings

    bindings = KeyBindings()

    async def edit(buffer: Buffer) -> None:
        # Run on the event loop's own (main) thread, so the SIGINT handler can be swapped; the
        # prompt is suspended meanwhile, the terminal the editor's.
        edited = await run_in_terminal(lambda: edit_text(buffer.text, error))
        if edited is not None:
            buffer.document = Document(edited, cursor_position=len(edited))

    @bindings.add("c-x", "c-e", filter=emacs_mode | vi_insert_mode)
    @bindings.add("v", filter=vi_navigation_mode)
    def _open_in_editor(event: KeyPressEvent) -> None:
        event.app.create_background_task(edit(event.current_buffer))

    return bindings


def mode_line() -> StyleAndTextTuples:
    """The prompt's right side in vi mode: the mode, except in insert mode (as vim shows it)."""
    from prompt_toolkit.application import get_app
    from prompt_toolkit.key_binding.vi_state import InputMode

    app = get_app()
    if app.current_buffer.selection_state is not None:
        return [("class:mode", "-- VISUAL --")]
    mode = app.vi_state.input_mode
    if mode == InputMode.NAVIGATION:
        return [("class:mode", "-- NORMAL --")]
    if mode in (InputMode.REPLACE, InputMode.REPLACE_SINGLE):
        return [("class:mode", "-- REPLACE --")]
    return []
