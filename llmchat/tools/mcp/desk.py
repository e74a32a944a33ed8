"""Questions for the person at the terminal, asked while a request to the server runs.

A server asks (elicitation, sampling) on the connection's event loop, in its own thread; the
terminal belongs to the thread that waits for the request (the main one), where Ctrl-C lands. So a
question is handed over: the loop puts it on the desk and waits, and the waiting thread, between
two looks at its request, asks it and hands the answer back (PersonDesk.wait).

Every question is bounded. Each request runs in `deadline()`, on the loop, from before it is sent
to its answer; a question that comes while none runs (a server that asks after its call was
answered, or between turns) would find nobody to ask it: NobodyWaits at once, and its caller
declines it. So does one still on the desk when the last request ends (its request gave up),
instead of being asked later, about something else.

The time a person takes to answer is not the server's: the request's deadline stops while a
question is open (off_the_clock), as the SDK's own request clock does for an OAuth login.
"""

from __future__ import annotations

import concurrent.futures
import math
import queue
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

POLL_S = 0.05  # how often each side looks at the other: short against a person, long against a CPU

_T = TypeVar("_T")


class NobodyWaits(Exception):
    """A question came while no request of llmchat's ran on the server: nobody will ask it."""


class PersonDesk:
    def __init__(self) -> None:
        self._questions: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
        # The requests under way: changed and read on the loop only, where the server's questions
        # arrive too, so a question and the request it comes in are seen in their true order.
        self._requests = 0
        self._deadline_scope: Any = None  # the running request's anyio cancel scope, with its deadline
        self._pauses = 0
        self._left_s = 0.0

    # --- the waiting thread ---------------------------------------------------------------------

    def wait(self, request: concurrent.futures.Future[_T]) -> _T:
        """The request's result, asking each question handed over meanwhile."""
        while True:
            done, _ = concurrent.futures.wait([request], timeout=POLL_S)
            if done:
                return request.result()
            self._ask_waiting_questions()

    def _ask_waiting_questions(self) -> None:
        while True:
            try:
                question, answer = self._questions.get_nowait()
            except queue.Empty:
                return
            if not answer.set_running_or_notify_cancel():  # its request is over: nobody waits for it
                continue
            try:
                answer.set_result(question())
            except BaseException as err:  # a Ctrl-C a question did not take goes on to end the turn
                answer.set_exception(err)
                if not isinstance(err, Exception):
                    raise

    # --- the event loop --------------------------------------------------------------------------

    async def ask(self, question: Callable[[], _T]) -> _T:
        """Have the waiting thread run question() (it reads the terminal), the request's clock
        stopped. NobodyWaits where no request of llmchat's runs, or none is left before it is asked."""
        import anyio

        if not self._requests:
            raise NobodyWaits
        answer: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._questions.put((question, answer))
        with self._off_the_clock():
            try:
                while not answer.done():
                    if not self._requests and answer.cancel():  # cancel(): False once it is asked
                        raise NobodyWaits
                    await anyio.sleep(POLL_S)
            except BaseException:  # cancelled: the question, if not yet asked, never is
                answer.cancel()
                raise
        return answer.result()

    @contextmanager
    def deadline(self, timeout_s: float) -> Iterator[None]:
        """One request under way, bounded in time (TimeoutError), with a deadline questions can stop."""
        import anyio

        self._requests += 1
        try:
            with anyio.fail_after(timeout_s) as scope:
                self._deadline_scope, self._pauses = scope, 0
                try:
                    yield
                finally:
                    self._deadline_scope = None
        finally:
            self._requests -= 1

    @contextmanager
    def _off_the_clock(self) -> Iterator[None]:
        import anyio

        scope = self._deadline_scope
        if scope is None:
            yield
            return
        if self._pauses == 0:
            self._left_s = scope.deadline - anyio.current_time()
            scope.deadline = math.inf
        self._pauses += 1
        try:
            yield
        finally:
            self._pauses -= 1
            if self._pauses == 0 and self._deadline_scope is scope:
                scope.deadline = anyio.current_time() + self._left_s
