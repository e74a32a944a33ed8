"""What a display hears during a turn, and the thinking display that stands in front of it.

The session streams text to a `TurnObserver`. A reasoning model's text goes through a
`ThinkingDisplay` first, itself an observer of the turn's segments: it puts the thinking where the
user asked (auto: the observer's `thinking`, dimmed on a terminal; stdout: marked in the answer
stream; hide: nowhere) and the answer in `text`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from llmchat.reasoning.formats import THINKING

if TYPE_CHECKING:
    from llmchat.reasoning.thinking import Segment
    from llmchat.turn.record import TurnResult


class TurnObserver(Protocol):
    """What a display needs to know during a turn. NullObserver implements each as a no-op."""

    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None: ...
    def text(self, fragment: str) -> None: ...
    def thinking(self, fragment: str) -> None: ...  # a reasoning model's thinking (may show nothing)
    def token(self, generated: int, t_first: float, now: float) -> None: ...
    def finished(self, result: TurnResult) -> None: ...
    # A tool turn's round ended (llmchat.turn.tool_loop): the live readout stops before the calls
    # are shown and approved; the next round's prefill_started starts it again.
    def round_ended(self) -> None: ...


class NullObserver:
    def prefill_started(self, prompt_tokens: int, cached_tokens: int, context_limit: int) -> None:
        pass

    def text(self, fragment: str) -> None:
        pass

    def thinking(self, fragment: str) -> None:
        pass

    def token(self, generated: int, t_first: float, now: float) -> None:
        pass

    def finished(self, result: TurnResult) -> None:
        pass

    def round_ended(self) -> None:
        pass


class ThinkingDisplay:
    """Shows a reasoning model's segments on `observer` as `display` says (auto | stdout | hide)."""

    def __init__(self, observer: TurnObserver, display: str):
        self.observer = observer
        self.display = display
        self._open = False  # a "<thinking>" marker was written to the answer stream (stdout)

    def show(self, segments: list[Segment]) -> None:
        observer = self.observer
        for segment in segments:
            if segment.kind == THINKING:
                if self.display == "stdout":
                    if not self._open:
                        observer.text("<thinking>\n")
                        self._open = True
                    observer.text(segment.text)
                elif self.display == "auto":
                    observer.thinking(segment.text)
                continue
            self.close()
            observer.text(segment.text)

    def close(self) -> None:
        """End a thinking block marked in the answer stream."""
        if self._open:
            self._open = False
            self.observer.text("\n</thinking>\n\n")
