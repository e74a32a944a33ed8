"""`--render markdown|plain`: how a reply is shown on a terminal.

`markdown` (the default on a terminal) renders the reply with rich while it streams
(llmchat.ui.markdown_stream): headings, lists, emphasis, tables, code blocks highlighted by their
language; finished blocks are printed once and scroll like plain text, only the last block is
redrawn, at most about 15 times a second. `plain` writes the model's text as it comes.

When stdout is not a terminal (a pipe, a file) the reply is always plain, whatever `--render` or
the config say: what a script reads is exactly what the model wrote, byte for byte.

`MarkdownPrinter` is a `StreamPrinter` (llmchat.output), so the live TTFT / tok/s readout, the
dimmed thinking on stderr and the summary line are the same in both modes; it only draws the
answer differently. `ask` and the interactive chat choose it with `wants_markdown`.
"""

from __future__ import annotations

import time
from typing import IO, TYPE_CHECKING

from llmchat import interrupts
from llmchat.errors import UsageError
from llmchat.output import StreamPrinter
from llmchat.ui.markdown_stream import MarkdownStream

if TYPE_CHECKING:
    from rich.console import Console

    from llmchat.turn.record import TurnResult

RENDER_MODES = ("markdown", "plain")


def wants_markdown(choice: str | None, configured: str | None, stdout_isatty: bool) -> bool:
    """Whether replies are rendered: `--render` (else the config's `render`, else markdown), and
    only ever when stdout is a terminal."""
    mode = choice if choice is not None else configured or "markdown"
    if mode not in RENDER_MODES:
        raise UsageError(f"--render must be markdown or plain, not {mode!r}")
    return mode == "markdown" and stdout_isatty


def terminal_console(out: IO[str]) -> Console:
    """The console a rendered reply is drawn with: a terminal's (the caller decided it is one)."""
    from rich.console import Console

    return Console(file=out, force_terminal=True, highlight=False)


class MarkdownPrinter(StreamPrinter):
    """A StreamPrinter whose answer is rendered as Markdown while it streams (see the module)."""

    def __init__(
        self,
        out: IO[str],
        err: IO[str],
        *,
        show_live: bool,
        show_summary: bool,
        mark_interrupted: bool = True,
        out_isatty: bool | None = None,
        err_isatty: bool | None = None,
        console: Console | None = None,
    ):
        super().__init__(
            out,
            err,
            show_live=show_live,
            show_summary=show_summary,
            echo_text=False,  # the answer is drawn here, with write_reply
            echo_thinking=True,  # the thinking still streams dimmed on stderr
            mark_interrupted=mark_interrupted,
            out_isatty=out_isatty,
            err_isatty=err_isatty,
        )
        self.console = console if console is not None else terminal_console(self.out)
        self.markdown = MarkdownStream(self.console)

    def text(self, fragment: str) -> None:
        super().text(fragment)  # the switch from thinking to the answer; nothing is echoed
        self._draw_frame(fragment)

    # A frame is computed and written under `uninterrupted`: the renderer counts the rows a frame
    # draws as drawn once it returns the frame, so a Ctrl-C landing in a slow write (SSH) would
    # leave the next frame erasing rows that never reached the screen. The Ctrl-C waits for the
    # decode loop's next checkpoint instead, a token later.
    @interrupts.uninterrupted
    def _draw_frame(self, fragment: str) -> None:
        frame = self.markdown.feed(fragment, time.perf_counter())
        if frame:
            self.write_reply(frame)

    def round_ended(self) -> None:
        self._close_markdown()  # the round's text stays printed above the tool calls
        super().round_ended()

    def finished(self, result: TurnResult) -> None:
        self._close_markdown()
        super().finished(result)

    def abort(self) -> None:
        try:
            self._close_markdown()  # the reply so far stays on the screen, rendered
        except (OSError, ValueError):  # stdout closed by the reader: nothing more to draw
            pass
        super().abort()

    @interrupts.uninterrupted
    def _close_markdown(self) -> None:
        frame = self.markdown.close()
        self.markdown = MarkdownStream(self.console)
        if frame:
            self.write_reply(frame)
