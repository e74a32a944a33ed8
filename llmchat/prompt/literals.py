"""Argument values as templates write them: JSON, Python literals (`True`, `None`, 'single
quotes': LFM2) and a template's own string quoting with bare keys (Gemma 4's `<|"|>text<|"|>`)."""

from __future__ import annotations

import json
import re
from typing import Any

_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


_WORDS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def literal_at(text: str, pos: int, quote_open: str = "", quote_close: str = "") -> tuple[Any, int] | None:
    """A value written as JSON, as a Python literal (`True`, `None`, 'single quotes': LFM2) or
    in a template's own quoting (Gemma 4's `<|"|>text<|"|>`, bare keys), and the index after it."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        pass
    try:
        return _Literal(text, quote_open, quote_close).value(pos)
    except (ValueError, IndexError):
        return None


class _Literal:
    def __init__(self, text: str, quote_open: str, quote_close: str):
        self.text, self.quote_open, self.quote_close = text, quote_open, quote_close

    def value(self, pos: int) -> tuple[Any, int]:
        text = self.text
        pos = _skip_space(text, pos)
        if self.quote_open and self.quote_open not in ('"', "'") and text.startswith(self.quote_open, pos):
            end = text.index(self.quote_close, pos + len(self.quote_open))
            return text[pos + len(self.quote_open) : end], end + len(self.quote_close)
        char = text[pos]
        if char in "\"'":
            return self.string(pos)
        if char in "[{":
            return self.container(pos)
        number = _NUMBER.match(text, pos)
        if number is not None:
            return json.loads(number.group(0)), number.end()
        word = _BARE_KEY.match(text, pos)
        if word is not None and word.group(0) in _WORDS:
            return _WORDS[word.group(0)], word.end()
        raise ValueError("not a literal")

    def string(self, pos: int) -> tuple[str, int]:
        import ast

        quote, i = self.text[pos], pos + 1
        while self.text[i] != quote:
            i += 2 if self.text[i] == "\\" else 1
        return ast.literal_eval(self.text[pos : i + 1]), i + 1

    def container(self, pos: int) -> tuple[Any, int]:
        text = self.text
        closing = "]" if text[pos] == "[" else "}"
        items: list[Any] = []
        mapping: dict[str, Any] = {}
        pos = _skip_space(text, pos + 1)
        while text[pos] != closing:
            if closing == "}":
                key_match = _BARE_KEY.match(text, pos)
                if text[pos] in "\"'" or text.startswith(self.quote_open or "\0", pos):
                    key, pos = self.value(pos)
                elif key_match is not None:
                    key, pos = key_match.group(0), key_match.end()
                else:
                    raise ValueError("not a key")
                pos = _skip_space(text, pos)
                if text[pos] not in ":=":
                    raise ValueError("no colon")
                mapping[str(key)], pos = self.value(pos + 1)
            else:
                item, pos = self.value(pos)
                items.append(item)
            pos = _skip_space(text, pos)
            if text[pos] == ",":
                pos = _skip_space(text, pos + 1)
        return (mapping if closing == "}" else items), pos + 1
