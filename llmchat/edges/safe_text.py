"""The one rule for text that came from outside llmchat on its way to a terminal.

A model, a server, an MCP server, a tool, a file name or a template can hold terminal escape
sequences: OSC 52 sets the user's clipboard, OSC 8 makes a link whose text hides another address,
OSC 0 renames the window, CSI 2J clears the screen, a carriage return or cursor movement hides what
the person is about to approve. On a terminal such text is shown with every control character
other than newline and tab made visible (ESC as ␛, as the Unicode control pictures draw them) or
dropped (a carriage return: "a\\rb" shows as "ab", so nothing written before it can be hidden),
and so are the bidirectional overrides that reorder what is shown (U+202A-U+202E, U+2066-U+2069).
Everything else passes: other scripts, emoji and their joiners, Markdown.

llmchat's own styling (the readout, dim notices, the Markdown renderer's colours) is added after
this rule, never passed through it. Piped stdout keeps the exact text: it is the answer
(`for_stream` leaves it alone where the stream is not a terminal).
"""

from __future__ import annotations

_CONTROL_PICTURES = {code: chr(0x2400 + code) for code in range(0x20)}  # U+2400 SYMBOL FOR NULL...
_CONTROL_PICTURES[0x7F] = "\u2421"  # ␡ SYMBOL FOR DELETE
del _CONTROL_PICTURES[ord("\n")], _CONTROL_PICTURES[ord("\t")]
_CONTROL_PICTURES[ord("\r")] = ""  # dropped: "\r\n" reads as "\n", a lone "\r" cannot overwrite
_C1_AND_BIDI = [*range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_TABLE: dict[int, str] = {
    **_CONTROL_PICTURES,
    **{code: f"\\u{code:04x}" for code in _C1_AND_BIDI},  # 0x9b alone is CSI on some terminals
}


def terminal_safe(text: str) -> str:
    """`text` as it may be written to a terminal: no control character but newline and tab."""
    return text.translate(_TABLE)


def for_stream(text: str, is_terminal: bool) -> str:
    """`text` for a stream: made terminal-safe where the stream is a terminal, exact elsewhere."""
    return terminal_safe(text) if is_terminal else text


_JSON_ESCAPES = {code: f"\\u{code:04x}" for code in _C1_AND_BIDI}


def json_terminal_safe(json_text: str) -> str:
    """JSON text (written with ensure_ascii=False) as it may be written to a terminal: the same
    JSON value, with the C1 controls and bidi overrides that json.dumps leaves raw written as
    \\uXXXX escapes (C0 controls are escaped by json.dumps already)."""
    return json_text.translate(_JSON_ESCAPES)


def is_terminal_safe(text: str) -> bool:
    """Whether `text` would be shown unchanged (nothing to make visible or drop)."""
    return terminal_safe(text) == text
