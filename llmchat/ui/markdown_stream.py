"""Markdown drawn while a reply streams: finished blocks printed once, the last block live.

`MarkdownStream` is fed the reply's text as it is decoded and answers with what to write to the
terminal (a "frame"): nothing while the last frame is younger than `FRAME_INTERVAL_S` (at most
about 15 frames a second, whatever the token rate), else

- the blocks that became finished since the last frame, rendered by rich and printed for good:
  they scroll up into the terminal's scrollback like plain text, and are never drawn again;
- the last, unfinished block, rendered and drawn "live": the next frame moves the cursor back up
  over it, erases it line by line and draws it again, longer.

A block is finished when the Markdown that follows cannot change it: a later block has begun
(markdown-it parses the whole lines received so far; the line being written is never parsed), or
it is a closed code fence, a heading or a rule, or a paragraph, table or quote followed by a blank
line. A list stays live until a block that is not part of it begins (a blank line does not end a
list: a loose list's next item may follow). An unclosed fence renders as code (markdown-it runs it
to the end of the text) until its closing fence arrives.

Only the last block is ever re-rendered, so a frame costs what that block costs, not what the
reply so far costs, and the erase never reaches above the screen: a live block taller than the
screen prints its top lines for good (rows - 2 stay live, leaving the row of the live readout).
Each frame is wrapped in the synchronized-output mode (DEC 2026), so terminals that know it show
it whole; others ignore it.

Frames are drawn in the decode loop, so a slow frame defers the next one (`RENDER_SHARE`): drawing
takes about 2 % of the time at most, even on a loaded machine or with a long live block (a frame
costs 1-2 ms on a quiet machine: rich's Markdown parse and, for code, pygments).

The reply is untrusted text (llmchat.edges.safe_text): it is made terminal-safe as it is fed, before
markdown-it splits it or rich renders it, so an escape sequence in it is shown as text while rich's
own colours stay. A link is drawn as its text and then its address, never as an OSC 8 hyperlink
whose text could name another address than the one it opens (`hyperlinks=False`).

The class is pure: the caller passes the clock (`now`) and writes the frames (llmchat.ui.markdown
writes them under the live readout's lock), so tests feed it token strings and a fake clock. A
frame it returns counts as drawn, so the caller writes each one whole before asking for the next
(llmchat.ui.markdown computes and writes a frame under `interrupts.uninterrupted`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from llmchat.edges.safe_text import terminal_safe

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from rich.console import Console
    from rich.markdown import Markdown

FRAME_INTERVAL_S = 1 / 15
# The share of the time that drawing may take: a frame that took 3 ms waits at least 3 / 0.02 =
# 150 ms for the next one, so a slow machine or a long live block draws less often instead of
# slowing the decode (frames are drawn in the decode loop, between two tokens).
RENDER_SHARE = 0.02
CODE_THEME = "monokai"  # the code blocks' colours, as `history show` and the finished replies had
SYNC_BEGIN, SYNC_END = "\x1b[?2026h", "\x1b[?2026l"
ERASE_LINE = "\r\x1b[2K"
UP_AND_ERASE = "\x1b[1A\x1b[2K"

# Blocks that end at their own last line: nothing after them can extend them.
_SELF_CLOSING = {"heading_open", "hr"}
# Blocks that a blank line ends (an indented code block may go on after one; a list's next item too).
_ENDED_BY_BLANK_LINE = {"paragraph_open", "table_open", "blockquote_open", "html_block", "fence"}


@dataclass(frozen=True)
class Block:
    """One finished top-level block: its Markdown source, and whether rich puts a blank line
    between it and the next block (`MarkdownElement.new_line`)."""

    source: str
    gap_after: bool


def split_blocks(text: str, parser: MarkdownIt | None = None) -> tuple[list[Block], int]:
    """The finished blocks at the start of `text`, and the offset where its unfinished rest starts."""
    complete = text[: text.rfind("\n") + 1]  # only whole lines decide where a block ends
    if not complete.strip():
        return [], 0
    lines = [line + "\n" for line in complete.split("\n")[:-1]]  # markdown-it's lines (not str.splitlines')
    tops = [t for t in (parser or markdown_parser()).parse(complete) if t.level == 0 and t.nesting >= 0 and t.map]
    finished: list[Block] = []
    end_line = 0
    for index, token in enumerate(tops):
        start, stop = token.map or (0, 0)
        followed = index + 1 < len(tops)
        if not (followed or _ends_here(token.type, token.markup, lines, start, stop)):
            break
        finished.append(Block("".join(lines[start:stop]), _gap_after(token.type)))
        end_line = stop
    return finished, sum(len(line) for line in lines[:end_line])


def _ends_here(kind: str, markup: str, lines: list[str], start: int, stop: int) -> bool:
    """Whether the last block of the whole lines so far is finished already."""
    if kind in _SELF_CLOSING:
        return True
    if kind == "fence" and stop - start >= 2:
        closing = lines[stop - 1].strip()
        if closing and set(closing) == {markup[0]} and len(closing) >= len(markup):
            return True
    return kind in _ENDED_BY_BLANK_LINE and stop < len(lines) and not lines[stop].strip()


def _gap_after(kind: str) -> bool:
    from rich.markdown import Markdown

    element = Markdown.elements.get(kind)
    return True if element is None else element.new_line


def terminal_markdown(source: str) -> Markdown:
    """Markdown from outside llmchat (a reply, a stored conversation) as rich draws it on a
    terminal: made terminal-safe first, links with their address shown (see the module)."""
    return _markdown(terminal_safe(source))


def _markdown(safe_source: str) -> Markdown:
    from rich.markdown import Markdown

    return Markdown(safe_source, code_theme=CODE_THEME, hyperlinks=False)


def markdown_parser() -> MarkdownIt:
    """The parser rich's Markdown uses (CommonMark with tables and strikethrough)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("strikethrough").enable("table")


class MarkdownStream:
    """One reply's Markdown on a terminal: `feed` each fragment, `close` at the end (see the module)."""

    def __init__(
        self,
        console: Console,
        *,
        interval: float = FRAME_INTERVAL_S,
        cost_clock: Callable[[], float] = time.perf_counter,
    ):
        self.console = console
        self.interval = interval
        self._cost_clock = cost_clock  # times the drawing itself (see RENDER_SHARE); tests pass a fixed one
        self._parser = markdown_parser()
        self._text = ""
        self._start = 0  # where the unfinished rest of the text starts
        self._live_rows = 0  # rows drawn live; the cursor is at the end of the last of them
        self._spilled = 0  # lines of the live block already printed for good (taller than the screen)
        self._gap = False  # a blank line is owed before the next block
        self._printed = False  # anything printed for good yet (no gap before the first block)
        self._next_frame = float("-inf")
        self.frames = 0

    def feed(self, fragment: str, now: float) -> str:
        """Take a fragment; return a frame to write, or "" when the last one is too recent."""
        self._text += terminal_safe(fragment)  # before markdown-it reads its lines (a lone CR is one)
        if now < self._next_frame:
            return ""
        started = self._cost_clock()
        frame = self._frame(final=False)
        spent = self._cost_clock() - started
        self._next_frame = now + max(self.interval, spent / RENDER_SHARE)
        return frame

    def close(self) -> str:
        """The final frame: everything not yet printed, printed for good, ending with a newline."""
        return self._frame(final=True)

    # --- frames -----------------------------------------------------------------------------------
    def _frame(self, *, final: bool) -> str:
        # A Ctrl-C landing while a frame is computed leaves the state as it was: the frame was never
        # written, so the next one (the final frame of the interrupted reply) must erase what is drawn.
        saved = (self._start, self._live_rows, self._spilled, self._gap, self._printed)
        try:
            return self._compute_frame(final=final)
        except BaseException:
            self._start, self._live_rows, self._spilled, self._gap, self._printed = saved
            raise

    def _compute_frame(self, *, final: bool) -> str:
        parts: list[str] = [self._erase()]
        blocks, offset = split_blocks(self._text[self._start :], self._parser)
        for block in blocks:
            self._print_for_good(parts, self._render(block.source)[self._spilled :], block.gap_after)
            self._spilled = 0
        self._start += offset
        rest = self._text[self._start :]
        live = self._render(rest)[self._spilled :] if rest.strip() else []
        if final:
            self._print_for_good(parts, live, gap_after=False)
            self._spilled = 0
        else:
            room = max(1, self.console.size.height - 2)  # the bottom row is the live readout's
            gap = [""] if self._gap and live and self._printed and live[0] else []
            overflow = len(gap) + len(live) - room
            if overflow > 0:  # taller than the screen: its top lines go for good, as plain text would
                self._print_for_good(parts, live[:overflow], gap_after=False)  # the gap with them
                self._spilled += overflow
                live, gap = live[overflow:], []
            shown = gap + live
            parts.append("\n".join(shown))
            self._live_rows = len(shown)
        body = "".join(parts)
        if not body:
            return ""
        self.frames += 1
        return SYNC_BEGIN + body + SYNC_END

    def _print_for_good(self, parts: list[str], lines: list[str], gap_after: bool) -> None:
        if lines:
            if self._gap and self._printed and lines[0]:  # (a table's rendering starts with its own)
                parts.append("\n")
            parts.append("".join(line + "\n" for line in lines))
            self._printed = True
            self._gap = gap_after
        elif gap_after:
            self._gap = True

    def _erase(self) -> str:
        rows, self._live_rows = self._live_rows, 0
        return ERASE_LINE + UP_AND_ERASE * (rows - 1) if rows else ""

    def _render(self, source: str) -> list[str]:
        with self.console.capture() as capture:
            self.console.print(_markdown(source))  # made terminal-safe in `feed`
        rendered = capture.get()
        return rendered.split("\n")[:-1] if rendered.endswith("\n") else rendered.split("\n")
