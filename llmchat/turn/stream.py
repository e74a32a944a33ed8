"""Reading one generation into the observer: the answer or the thinking as it arrives, the time
the first token was written, and the ways a reply ends early.

Ctrl-C ends the reply as interrupted. SIGTERM, a closed stdout, a remote stream cut mid-reply or
the engine failing mid-reply (ModelError) end it too, and come back as the exception to raise once
the reply is saved (`Read.stopped`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from llmchat import interrupts
from llmchat.errors import ModelError, ServerError
from llmchat.reasoning.formats import ANSWER
from llmchat.reasoning.thinking import Segment
from llmchat.turn.markers import MarkerFilter
from llmchat.turn.observer import ThinkingDisplay

if TYPE_CHECKING:
    from llmchat.engine.interface import GenerationLike
    from llmchat.reasoning.thinking import ThinkingTracker
    from llmchat.turn.observer import TurnObserver


@dataclass
class Read:
    answer: str  # the reply's answer (the thinking split off where a tracker ran)
    raw: str  # everything decoded, thinking and markup included (a tool round's parser reads it)
    t_first_written: float | None
    stopped: BaseException | None  # to raise once the reply is saved


def read_reply(
    generation: GenerationLike,
    tracker: ThinkingTracker | None,
    observer: TurnObserver,
    display: str,
    template_source: str,
) -> Read:
    """Stream `generation` to `observer` (its thinking through a ThinkingDisplay in `display` mode),
    its answer without the content markers `template_source` wraps a reply in (llmchat.turn.markers;
    `Read.answer` keeps them: the turn's result, or a tool round's reader, takes them off)."""
    outcome = generation.outcome
    fragments: list[str] = []
    raw: list[str] = []
    t_first_written: float | None = None
    stopped: BaseException | None = None
    shown = ThinkingDisplay(observer, display)
    markers = MarkerFilter.of_template(template_source)
    try:
        for event in generation:
            raw.append(event.text)
            if event.text and tracker is not None:
                segments = tracker.feed(event.text, outcome.generated_tokens, time.perf_counter())
                shown.show(_unwrapped(segments, markers))
            elif event.text:
                fragments.append(event.text)
                _show_answer(observer, markers.feed(event.text))
            now = time.perf_counter()
            if t_first_written is None:
                t_first_written = now
            observer.token(outcome.generated_tokens, t_first_written, now)
    except KeyboardInterrupt:
        interrupts.consume()  # the Ctrl-C ends this reply (and, in chat, only this reply)
        outcome.finish_reason = "interrupted"
    except (SystemExit, BrokenPipeError) as err:
        # SIGTERM (raised as SystemExit by cli) or the reader closing stdout: the process ends, but
        # the partial reply is saved first, marked interrupted, as for Ctrl-C.
        outcome.finish_reason = "interrupted"
        stopped = err
    except ServerError as err:
        # A remote stream cut mid-reply: what arrived is kept (saved, marked as an error), then the
        # error is reported with its exit code.
        outcome.finish_reason = "error"
        stopped = err
    except ModelError as err:
        # The engine failed mid-reply (llama.cpp returned an error): the reply so far is shown and
        # saved, marked interrupted as a Ctrl-C's is, then the error is reported with its exit code.
        outcome.finish_reason = "interrupted"
        stopped = err
    showable = stopped is None or isinstance(stopped, ModelError)  # stdout closed: showing more would raise
    if tracker is not None:
        held = tracker.flush(outcome.generated_tokens, time.perf_counter())
        if showable:
            shown.show(_unwrapped(held, markers) + _answer(markers.flush()))
            shown.close()
        fragments = [tracker.splitter.answer]
    elif showable:
        _show_answer(observer, markers.flush())
    return Read("".join(fragments), "".join(raw), t_first_written, stopped)


def _unwrapped(segments: list[Segment], markers: MarkerFilter) -> list[Segment]:
    """The segments as shown: the answer's through `markers`, and none left empty by them."""
    if markers.passes_through:
        return segments
    out = [Segment(ANSWER, markers.feed(s.text)) if s.kind == ANSWER else s for s in segments]
    return [segment for segment in out if segment.text]


def _answer(text: str) -> list[Segment]:
    return [Segment(ANSWER, text)] if text else []


def _show_answer(observer: TurnObserver, text: str) -> None:
    if text:
        observer.text(text)
