"""The rich console of a screen that shows text from outside llmchat.

Tables and listings name what came from outside (a model's name, a conversation's name and first
message, a tool's description, a server's words): rich draws them. On a terminal, every piece of
text rich writes passes llmchat.edges.safe_text.terminal_safe once rich has laid it out (a render hook,
rich's own seam for it): rich writes its styles (bold, dim, a table's colours) from its style
objects, never from the text, so they stay, and an escape sequence in the text is shown, never
run. Off a terminal the console writes the text as it is: a pipe reads the exact text.

Markup is off unless a caller turns it on: `[link=https://...]` in a conversation's name must not
become a hyperlink, nor `[tools]` in a usage line vanish as an unknown style.

The text is made safe after the layout, so a control character made visible (one cell where
rich counted none) can push its row past the column it was measured for: only hostile text pays.
"""

from __future__ import annotations

from typing import IO, Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment

from llmchat.edges.safe_text import terminal_safe


class _TerminalSafe:
    """A renderable drawn as `renderable` is, with each piece of its text made terminal-safe.
    Control segments are rich's own cursor movements, kept."""

    def __init__(self, renderable: ConsoleRenderable):
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            yield segment if segment.control else Segment(terminal_safe(segment.text), segment.style)


class _MadeTerminalSafe(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_TerminalSafe(renderable) for renderable in renderables]


def safe_console(file: IO[str], *, on_terminal: bool, **options: Any) -> Console:
    """A rich Console writing to `file`: terminal-safe where `file` is a terminal (`on_terminal`,
    from the command's environment, so a test can fake one), exact elsewhere; markup and
    highlighting off unless `options` turn them on."""
    options.setdefault("markup", False)
    options.setdefault("highlight", False)
    console = Console(file=file, **options)
    if on_terminal:
        console.push_render_hook(_MadeTerminalSafe())
    return console
