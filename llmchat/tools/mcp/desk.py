"""Questions for the person at the terminal, asked while a request to the server runs.

A server asks (elicitation) on the connection's event loop, in its own thread; the terminal belongs
to the thread that waits for the request (the main one), where Ctrl-C lands. So a question is
handed over: the loop puts it on the desk and waits, and the waiting thread, between two looks at
its request, asks it and hands the answer back (PersonDesk.wait). A question whose request ended
meanwhile (it timed out) is dropped, never asked.

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


class PersonDesk:
    def __init__(self) -> None:
        self._questions: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
            queue.SimpleQueue()
        )
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

    async def ask(self, question: Callable[[], _T], *, taken_within_s: float = math.inf) -> _T:
        """Have the waiting thread run question() (it reads the terminal), the request's clock stopped.
        TimeoutError when no waiting thread took it within `taken_within_s` (none is waiting: a
        server asked outside any request of llmchat's), so such a question never hangs."""
        import anyio

        answer: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._questions.put((question, answer))
        give_up = anyio.current_time() + taken_within_s
        with self._off_the_clock():
            try:
                while not answer.done():
                    await anyio.sleep(POLL_S)
                    if anyio.current_time() > give_up and answer.cancel():  # cancel(): False once it runs
                        raise TimeoutError
            except BaseException:  # cancelled: the question, if not yet asked, never is
                answer.cancel()
                raise
        return answer.result()

    @contextmanager
    def deadline(self, timeout_s: float) -> Iterator[None]:
        """Bound a request in time (TimeoutError), with a deadline questions can stop."""
        import anyio

        with anyio.fail_after(timeout_s) as scope:
            self._deadline_scope, self._pauses = scope, 0
            try:
                yield
            finally:
                self._deadline_scope = None

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
