"""The one rule for outside text on a terminal (llmchat.edges.safe_text), with the escapes a hostile
model, server or tool would send."""

from __future__ import annotations

import pytest

from llmchat.edges.safe_text import for_stream, is_terminal_safe, terminal_safe

ESC = "\x1b"
HOSTILE = {
    "OSC 52 (sets the clipboard)": f"{ESC}]52;c;cm0gLXJmIH4K{ESC}\\",
    "OSC 8 (a link hiding its address)": f"{ESC}]8;;https://evil.example/{ESC}\\https://good.example/{ESC}]8;;{ESC}\\",
    "OSC 0 (the window title)": f"{ESC}]0;pwned\x07",
    "CSI 2J (clear screen)": f"{ESC}[2J{ESC}[H",
    "cursor up and erase": f"safe{ESC}[1A{ESC}[2K",
    "8-bit CSI": "\x9b2J",
    "backspaces": "yes\x08\x08\x08no",
    "bidi override": "abc\u202eevil\u202c",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_no_control_character_reaches_a_terminal(text):
    shown = terminal_safe(text)
    assert all(ch in "\n\t" or (ch.isprintable() and not 0x80 <= ord(ch) < 0xA0) for ch in shown), repr(shown)
    assert "\u202e" not in shown and "\u2066" not in shown
    assert not is_terminal_safe(text)


def test_escape_is_made_visible_not_silently_dropped():
    assert terminal_safe(f"{ESC}]0;title\x07") == "␛]0;title␇"
    assert terminal_safe("\x9b") == "\\u009b"


def test_newline_and_tab_pass_and_carriage_return_cannot_overwrite():
    assert terminal_safe("a\tb\nc") == "a\tb\nc"
    assert terminal_safe("line one\r\nline two") == "line one\nline two"
    assert terminal_safe("approve: ls\rrm -rf ~") == "approve: lsrm -rf ~"


def test_ordinary_text_passes_whole():
    text = "Größe 東京 ½ — **bold** `code` 👨\u200d👩\u200d👧 e\u0301 ﷺ"
    assert terminal_safe(text) == text
    assert is_terminal_safe(text)


def test_piped_output_stays_exact():
    hostile = "".join(HOSTILE.values())
    assert for_stream(hostile, is_terminal=False) == hostile
    assert for_stream(hostile, is_terminal=True) == terminal_safe(hostile)


def test_json_on_a_terminal_keeps_its_value_without_raw_c1_or_bidi():
    import json

    from llmchat.edges.safe_text import json_terminal_safe

    value = {"reply": "a\x9b2Jb\u202eevil\x1b]0;t\x07"}
    text = json_terminal_safe(json.dumps(value, ensure_ascii=False))
    assert json.loads(text) == value
    assert not any(0x80 <= ord(ch) < 0xA0 or ch in "\u202e\x1b" for ch in text)
