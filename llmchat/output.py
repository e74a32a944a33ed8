"""Output: stdout carries the answer (or JSON), stderr carries everything else.

The live readout is drawn on stderr, throttled to about 10 updates a second by a ticker thread, so
drawing never slows decoding (the decode loop only stores numbers). The ticker also keeps the
TTFT counter moving while the main thread is inside llama.cpp's prefill (ctypes releases the GIL).

When stdout and stderr are the same terminal, the readout lives on the bottom row, below a
scrolling region that holds the streamed reply (the technique apt uses for its progress line); when
only stderr is a terminal, it is a single line rewritten with a carriage return.

The model's text is untrusted (llmchat.edges.safe_text): on a terminal the reply and the thinking are
made terminal-safe as they stream (an escape sequence in a reply is shown, never run); piped,
stdout is the model's text byte for byte.

A reasoning model's thinking (`StreamPrinter.thinking`) streams dimmed on stderr when stderr is a
terminal, and the answer follows in the normal style on stdout; elsewhere it is not printed
(stdout stays the answer; `--show-thinking` asks for it there, marked, and JSON records carry it).
The live readout shows the phase: "thinking… 312 tokens, 4.1 s" until the answer starts.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import IO, Any

from llmchat.edges.safe_text import for_stream, json_terminal_safe, terminal_safe

DIM = "\x1b[2m"
RESET = "\x1b[0m"
CLEAR_LINE = "\x1b[2K"


def is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def same_terminal(a: IO[str], b: IO[str]) -> bool:
    try:
        return os.path.samefile(f"/proc/self/fd/{a.fileno()}", f"/proc/self/fd/{b.fileno()}") or (
            os.ttyname(a.fileno()) == os.ttyname(b.fileno())
        )
    except (OSError, ValueError, AttributeError):
        return is_tty(a) and is_tty(b)


def notice(message: str, stream: IO[str] | None = None) -> None:
    """A one-line note on stderr (model choice, trims, warnings). Notes name what came from outside
    (a model's name, a file, a server's or a tool's words): on a terminal the line is made
    terminal-safe before it is dimmed; elsewhere it is the log, written as it is."""
    stream = stream or sys.stderr
    if is_tty(stream):
        stream.write(f"{DIM}{terminal_safe(message)}{RESET}\n")
    else:
        stream.write(message + "\n")
    stream.flush()


def spinner(message: str) -> AbstractContextManager[Any]:
    """rich's spinner on stderr (a terminal: the caller checked) while a model loads or a server
    answers. The message names a file or an address: made terminal-safe, and never read as markup."""
    from rich.console import Console
    from rich.text import Text

    return Console(stderr=True).status(Text(terminal_safe(message)), spinner="dots")


def write_json(obj: Any, stream: IO[str] | None = None) -> None:
    stream = stream or sys.stdout
    text = json.dumps(obj, ensure_ascii=False)
    stream.write((json_terminal_safe(text) if is_tty(stream) else text) + "\n")
    stream.flush()


@dataclass(frozen=True)
class Readout:
    """What the live readout shows, as one value: the decode loop replaces it whole (one
    assignment), so the ticker thread, which reads it once per frame, never sees half an update
    (the phase "thinking" without the time it began)."""

    t_start: float = 0.0
    t_first: float | None = None
    t_last: float = 0.0
    ttft: float = 0.0
    generated: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    context_limit: int = 0
    phase: str = ""  # "thinking" while a reasoning model thinks, "answer" after it; "" without thinking
    thinking_since: float = 0.0


def format_live(state: Readout) -> str:
    """The live readout: TTFT (frozen once the first token arrives), decode tok/s, tokens, context."""
    if state.phase == "thinking":
        thought = time.perf_counter() - state.thinking_since
        return f"thinking… {state.generated} tokens, {thought:.1f} s"
    if state.t_first is None:
        waited = time.perf_counter() - state.t_start
        return (
            f"prefill {state.prompt_tokens - state.cached_tokens} tokens "
            f"({state.cached_tokens} cached) · TTFT {waited * 1000:.0f} ms…"
        )
    span = state.t_last - state.t_first
    rate = (state.generated - 1) / span if state.generated > 1 and span > 0 else 0.0
    used = state.prompt_tokens + state.generated
    return (
        f"TTFT {state.ttft * 1000:.0f} ms · {rate:.1f} tok/s · {state.generated} tokens · "
        f"ctx {used}/{state.context_limit}"
    )


class StreamPrinter:
    """Writes the reply to stdout as it is decoded, and optionally a live readout to stderr.

    It is a TurnObserver (see session.py). `show_live` draws the readout while decoding;
    `show_summary` prints the dim one-line summary afterwards.
    """

    REFRESH_S = 0.1

    def __init__(
        self,
        out: IO[str] | None = None,
        err: IO[str] | None = None,
        *,
        show_live: bool,
        show_summary: bool,
        echo_text: bool = True,
        mark_interrupted: bool = True,
        out_isatty: bool | None = None,
        err_isatty: bool | None = None,
        echo_thinking: bool | None = None,
    ):
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        # Given by the caller's environment (llmchat.env), so a test can fake a terminal; else asked.
        self.out_isatty = is_tty(self.out) if out_isatty is None else out_isatty
        self.err_isatty = is_tty(self.err) if err_isatty is None else err_isatty
        self.echo_text = echo_text
        # The thinking shows where the answer does, unless the caller draws the answer itself
        # (llmchat.ui.markdown renders it and writes it with `write_reply`).
        self.echo_thinking = echo_text if echo_thinking is None else echo_thinking
        # False where the command itself ends with a one-line "interrupted" report (ask, scripted chat).
        self.mark_interrupted = mark_interrupted
        self.show_live = show_live and self.err_isatty
        self.show_summary = show_summary
        self.bottom_row = self.show_live and self.out_isatty and same_terminal(self.out, self.err)
        self._lock = threading.Lock()
        self._state = Readout()  # replaced whole, never changed in place: the ticker reads it
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._rows = 0
        self._ended_with_newline = True
        self._thinking_shown = False
        self._thinking_ended_with_newline = True

    # --- TurnObserver -----------------------------------------------------------------------
    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        now = time.perf_counter()
        self._state = Readout(
            t_start=now,
            t_last=now,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            context_limit=context_limit,
        )
        self._ended_with_newline = True
        self._thinking_shown = False
        if self.show_live:
            self._begin_live()

    def thinking(self, fragment: str) -> None:
        """A reasoning model's thinking: dimmed on stderr when that is a terminal, else not shown."""
        if self._state.phase != "thinking":
            self._state = replace(self._state, phase="thinking", thinking_since=time.perf_counter())
        if not (self.echo_thinking and self.err_isatty):
            return
        with self._lock:
            self.out.flush()
            self.err.write(f"{DIM}{terminal_safe(fragment)}{RESET}")
            self.err.flush()
        self._thinking_ended_with_newline = fragment.endswith("\n")
        self._thinking_shown = True

    def text(self, fragment: str) -> None:
        if self._state.phase == "thinking":
            self._state = replace(self._state, phase="answer")
            if self._thinking_shown:  # the answer starts on a line of its own, after a blank one
                self.err.write("\n" if self._thinking_ended_with_newline else "\n\n")
                self.err.flush()
        if not self.echo_text:
            return
        with self._lock:
            self.out.write(for_stream(fragment, self.out_isatty))  # piped: the model's text, exact
            self.out.flush()
        self._ended_with_newline = fragment.endswith("\n")

    def write_reply(self, text: str) -> None:
        """Write what the caller drew of the answer itself (llmchat.ui.markdown) to stdout, under
        the readout's lock, so a frame of cursor movements is never cut by a readout frame."""
        with self._lock:
            self.out.write(text)
            self.out.flush()

    def token(self, generated: int, t_first: float, now: float) -> None:
        state = self._state
        if state.t_first is None:
            self._state = replace(state, ttft=now - state.t_start, t_first=now, generated=generated, t_last=now)
        else:
            self._state = replace(state, generated=generated, t_last=now)

    def finished(self, result: Any) -> None:
        self._end_live()
        if self._thinking_shown and self._state.phase == "thinking" and not self._thinking_ended_with_newline:
            self.err.write("\n")  # thinking that never ended: leave the line clean
            self.err.flush()
        if self.echo_text and not self._ended_with_newline:
            self.out.write("\n")
            self.out.flush()
        if result.interrupted and self.mark_interrupted:
            notice("[interrupted]", self.err)
        if self.show_summary:
            notice(result.stats.summary(), self.err)

    def abort(self) -> None:
        """Restore the terminal when a turn ends by an exception (broken pipe, error), and end the
        reply's line so that the error's line starts on its own."""
        self._end_live()
        if self.echo_text and not self._ended_with_newline:
            self._ended_with_newline = True
            try:
                self.out.write("\n")
                self.out.flush()
            except (OSError, ValueError):  # stdout closed by the reader: nothing more to end
                pass

    def round_ended(self) -> None:
        """A tool round ended: the readout stops, so the calls and the approval question are clean lines."""
        self._end_live()

    # --- live readout --------------------------------------------------------------------------
    def _begin_live(self) -> None:
        if self.bottom_row:
            try:
                self._rows = os.get_terminal_size(self.err.fileno()).lines
            except OSError:
                self.bottom_row = False
        if self.bottom_row and self._rows >= 3:
            # Make room, then confine scrolling to all rows but the last.
            self.out.flush()
            self.err.write(f"\n\x1b7\x1b[1;{self._rows - 1}r\x1b8\x1b[1A")
            self.err.flush()
        else:
            self.bottom_row = False
        self._stop.clear()
        self._ticker = threading.Thread(target=self._tick, name="llmchat-live", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(self.REFRESH_S):
            self._draw(format_live(self._state))

    def _draw(self, line: str) -> None:
        width = self._columns()
        line = line[: width - 1]
        with self._lock:
            self.out.flush()
            if self.bottom_row:
                self.err.write(f"\x1b7\x1b[{self._rows};1H{CLEAR_LINE}{DIM}{line}{RESET}\x1b8")
            else:
                self.err.write(f"\r{CLEAR_LINE}{DIM}{line}{RESET}")
            self.err.flush()

    def _end_live(self) -> None:
        if self._ticker is None:
            return
        self._stop.set()
        self._ticker.join()
        self._ticker = None
        with self._lock:
            self.out.flush()
            if self.bottom_row:
                self.err.write(f"\x1b7\x1b[1;{self._rows}r\x1b[{self._rows};1H{CLEAR_LINE}\x1b8")
            else:
                self.err.write(f"\r{CLEAR_LINE}")
            self.err.flush()

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.err.fileno()).columns
        except OSError:
            return 80
