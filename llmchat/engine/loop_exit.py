"""Steering a reply out of a loop under a grammar, instead of ending it there.

A small model at temperature 0 (or 0.5) can fall into a loop inside a structure the grammar
holds it to: `"genres": ["Horror", "Sci-Fi", "Horror", "Sci-Fi", ...` or a string that repeats one
sentence. Without a grammar the loop stop ends such a reply (finish_reason "loop"); under a
schema that leaves an unclosed, invalid record behind, although the schema was satisfiable.
Measured on Gemma 3 270M (issue 25): 2 of 12 records of a `--parallel 4` batch were cut that way.

So under a grammar the reply rules (engine.reply) do not end a detected loop; they ask `LoopExit`
to steer out. The grammar gate (engine.grammar_gate) then closes the structure that holds the whole
repeated span (the innermost list, string or object open through all of it), as soon as the
grammar allows that closing text, and the model goes on from there. The closing tokens are
picked in the sampler, like sampled ones, so the serial loop, `--parallel`, and drafted tokens
(`--lookup`, `--draft-model`) all take them the same way. A list the grammar does not let close
(minItems not reached) waits until it may; one the model never lets close runs to the token limit.
"""

from __future__ import annotations

from typing import Protocol

_CLOSERS = {ord("{"): "}", ord("["): "]", ord('"'): '"'}
_HEX = frozenset(b"0123456789abcdefABCDEF")
PATIENCE = 8  # tokens a list item may take to end before the steering closes it too


class JsonNesting:
    """Which JSON structures are open after the bytes fed so far, and how deep each token went.

    `depths[i]` is the fewest structures open at any point while token i was written (before,
    between and after its bytes): a span of tokens lies wholly inside the structures at the
    bottom of the stack up to the span's smallest depth."""

    def __init__(self) -> None:
        self.stack: list[int] = []  # the opening bytes: { [ "
        self.escape = 0  # bytes still to come of an escape inside a string (\" or \uXXXX)
        self.depths: list[int] = []

    def feed(self, data: bytes) -> None:
        stack = self.stack
        low = len(stack)
        for byte in data:
            self.escape = _step(stack, self.escape, byte)
            low = min(low, len(stack))
        self.depths.append(low)

    def reaches(self, data: bytes, depth: int) -> bool:
        """Whether writing `data` next would bring the open structures down to `depth` or fewer."""
        stack, escape = list(self.stack), self.escape
        for byte in data:
            escape = _step(stack, escape, byte)
            if len(stack) <= depth:
                return True
        return False

    def enclosing_depth(self, tokens: int) -> int:
        """How many structures stayed open through the last `tokens` tokens."""
        return min(self.depths[-tokens:]) if tokens > 0 and self.depths else len(self.stack)

    def closing_text(self, keep: int) -> str | None:
        """The text that closes every open structure above the first `keep`; None while an
        escape is half written (a quote there would be part of it)."""
        if self.escape:
            return None
        return "".join(_CLOSERS[opener] for opener in reversed(self.stack[keep:]))


def _step(stack: list[int], escape: int, byte: int) -> int:
    """Advance `stack` over one byte of JSON; returns the escape state after it."""
    if stack and stack[-1] == 0x22:  # inside a string
        if escape:
            if escape == 5 and byte == ord("u"):
                return 4
            if escape <= 4 and byte in _HEX:
                return escape - 1
            return 0
        if byte == 0x5C:  # a backslash
            return 5
        if byte == 0x22:
            stack.pop()
    elif byte in (0x7B, 0x5B, 0x22):
        stack.append(byte)
    elif byte in (0x7D, 0x5D) and stack:
        stack.pop()
    return 0


class GateForLoops(Protocol):
    """What `LoopExit` needs of the grammar gate it steers."""

    active: bool
    nesting: JsonNesting


class LoopExit:
    """Between the reply rules, which detect a loop, and the grammar gate, which closes it.

    The reply rules create it; the gate of the same sequence attaches itself (`gate`). Without a
    gate (no grammar, or the grammar not yet started: a thinking block) `request` says no and the
    loop ends the reply as before."""

    def __init__(self) -> None:
        self.gate: GateForLoops | None = None
        self.keep: int | None = None  # while steering: how many open structures stay open
        self.steered = 0  # loops closed by steering
        self.waited = 0  # tokens waited for the model to finish an item of the repeating list

    def request(self, period: int) -> bool:
        """A loop of `period` tokens was detected: steer out of it if a grammar can (True)."""
        gate = self.gate
        if gate is None or not gate.active:
            return False
        enclosing = gate.nesting.enclosing_depth(period)
        if enclosing == 0:
            return False  # nothing open to close: the loop is outside any structure
        self.keep = enclosing - 1
        self.waited = 0
        return True

    def closed(self) -> None:
        """The gate has taken the closing tokens."""
        self.keep = None
        self.steered += 1
