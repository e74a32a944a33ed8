"""`--markdown`: the reply rendered once it is complete.

The reply is not echoed while it is decoded; the live readout shows its progress on the bottom row
(TTFT, tok/s, tokens so far) and the finished reply is printed once, rendered by rich (code blocks
highlighted). We chose that over "stream plain, then print it again rendered" because printing
every reply twice doubles the scrollback and leaves the conversation hard to read, and over
re-rendering the Markdown live because that is a second streaming path whose cost grows with each
token (the whole reply is re-parsed on every refresh) and would slow decoding. With `--no-stats`
as well there is no readout, so the reply appears only when it is complete.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from llmchat.output import StreamPrinter
    from llmchat.turn.record import TurnResult


class MarkdownObserver:
    """Wraps a StreamPrinter (created with echo_text=False): when the reply is done, it ends the live
    readout, prints the reply rendered as Markdown, then lets the printer print its summary."""

    def __init__(self, printer: StreamPrinter, console: Console):
        self.printer = printer
        self.console = console

    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        self.printer.prefill_started(prompt_tokens, cached_tokens, context_limit)

    def text(self, fragment: str) -> None:
        self.printer.text(fragment)

    def token(self, generated: int, t_first: float, now: float) -> None:
        self.printer.token(generated, t_first, now)

    def thinking(self, fragment: str) -> None:
        self.printer.thinking(fragment)

    def round_ended(self) -> None:
        self.printer.round_ended()

    def finished(self, result: TurnResult) -> None:
        self.printer.abort()  # ends the live readout and restores the scrolling region
        if result.reply.strip():
            from rich.markdown import Markdown

            self.console.print(Markdown(result.reply, code_theme="monokai"))
        self.printer.finished(result)
