"""Stop strings over a token stream, without showing a partial stop string to the user.

Tokens arrive as text fragments. A stop string may span several fragments, so text that could be
the start of a stop string is held back until it either completes the stop (and is dropped) or
cannot anymore (and is released).
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stop_strings: tuple[str, ...] | list[str]):
        self.stop_strings = tuple(s for s in stop_strings if s)
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add decoded text; return what is safe to show now. Sets `stopped` when a stop string completes."""
        if self.stopped:
            return ""
        if not self.stop_strings:
            return text
        self._pending += text
        cut = min((i for i in (self._pending.find(s) for s in self.stop_strings) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            released, self._pending = self._pending[:cut], ""
            return released
        hold = self._longest_stop_prefix_at_end()
        released = self._pending[: len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold :]
        return released

    def flush(self) -> str:
        """The held-back text once generation ended without completing a stop string."""
        released, self._pending = self._pending, ""
        return "" if self.stopped else released

    def _longest_stop_prefix_at_end(self) -> int:
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest


class LoopDetector:
    """Notices a degenerate loop: the same span of up to `max_period` tokens repeated back to back.

    Small models at temperature 0 fall into such loops ("Tell me a long story about a dragon." with
    SmolLM2 repeats one 80-token paragraph until the cap), and nothing else ends them before the
    context is full. The longest period is a paragraph's worth (256 tokens). A loop counts once the
    repeated region covers `repeats` whole periods and at least `min_span` tokens, so a short
    legitimate run (a row of dashes, "no, no, no") passes.

    Per token it does one comparison per period: `matched[p]` is how many consecutive tokens have
    equalled the token p places earlier, so a span of period p repeats while it keeps growing.
    """

    def __init__(self, *, max_period: int = 256, repeats: int = 3, min_span: int = 48):
        self.max_period = max_period
        self.repeats = repeats
        self.min_span = min_span
        self._tokens: list[int] = []
        self._matched = [0] * (max_period + 1)
        self.period = 0  # the period of the loop found (0: none)

    def feed(self, token: int) -> bool:
        """Add one generated token; True once the reply is looping."""
        tokens = self._tokens
        tokens.append(token)
        n = len(tokens)
        for period in range(1, min(self.max_period, n - 1) + 1):
            if tokens[n - 1] == tokens[n - 1 - period]:
                self._matched[period] += 1
                span = self._matched[period] + period
                if span >= self.repeats * period and span >= self.min_span:
                    self.period = period
                    return True
            else:
                self._matched[period] = 0
        if n > 4 * self.max_period * self.repeats:  # only the recent past can be part of a loop
            del tokens[: self.max_period]
        return False
