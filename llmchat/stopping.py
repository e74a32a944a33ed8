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
