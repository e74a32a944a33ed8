"""Batch against a server: N concurrent streams, retried when the server is busy or drops one.

`batch --parallel N` with a local model decodes N sequences in one context (ParallelDecoder). With
a server, the same N items are N concurrent requests, and the server's continuous batching decodes
them together (llama-server with `-np N`, vLLM, Ollama with OLLAMA_NUM_PARALLEL). Each worker thread
owns one llama-server slot (`id_slot` = its number when the server has that many, else any idle
slot), so an item's prompt prefix is reused by the next item that worker takes.

Retries: a 429/503, a refused or dropped connection, or a read timeout is retried with backoff
(`RETRY_DELAYS`), the whole item from the start, before anything is written: the caller writes
an item's record once, after it finished, so a retry can neither tear nor duplicate a record.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from llmchat.engine.remote.llama_server import RemoteOutcome
from llmchat.errors import LlmchatError, ServerError

if TYPE_CHECKING:
    from llmchat.engine.interface import QueuedRequest
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine

# Seconds to wait before each retry; after the last, the item fails with the server's message.
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)


def with_retries(attempt: Callable[[], Any], *, cancelled: threading.Event | None = None, delays=RETRY_DELAYS) -> Any:
    """Run `attempt` until it succeeds, retrying retriable ServerErrors after each delay in turn."""
    for delay in (*delays, None):
        try:
            return attempt()
        except ServerError as err:
            if not err.retriable or delay is None:
                raise
        if cancelled is not None:
            if cancelled.wait(delay):
                raise KeyboardInterrupt
        else:
            time.sleep(delay)
    raise AssertionError("unreachable")


@dataclass
class StreamResult:
    """One finished item, shaped like `engine.parallel.ParallelResult`."""

    key: Any
    outcome: RemoteOutcome
    seed: int = 0
    text: str = ""
    error: str | None = None
    t_submit: float = 0.0
    attempts: int = 0
    retried: list[str] = field(default_factory=list)


class ConcurrentStreams:
    """Complete items with up to `n` requests in flight. Results come back in the calling thread."""

    def __init__(self, engine: LlamaServerEngine | OpenAICompatEngine, n: int):
        self.engine = engine
        self.n = max(1, n)
        self.generated_total = 0  # tokens streamed so far, all items (progress)
        self.retries = 0
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        slots = engine.caps.slots
        # Worker i keeps slot i when the server has enough; otherwise the server picks an idle one.
        self._slots = list(range(self.n)) if slots >= self.n else [-1] * self.n
        self._free_workers = list(range(self.n))

    def summary(self) -> str:
        return f"parallel: {self.n} concurrent streams, {self.retries} requests retried (server busy or connection dropped)"

    def _complete(self, item: QueuedRequest, worker: int) -> StreamResult:
        result = StreamResult(item.key, RemoteOutcome(), t_submit=time.perf_counter())

        def attempt() -> None:
            if self._cancel.is_set():
                raise KeyboardInterrupt
            result.attempts += 1
            if item.request.steering is not None:
                item.request.steering.restart()  # a retried item's thinking starts again
            request = replace(item.request, slot=self._slots[worker])
            # Nobody reads these events but this worker: the stream feeds the thinking budget itself.
            generation = self.engine.generate(request, feeds_steering=True)
            result.seed = generation.seed
            result.outcome = generation.outcome
            fragments: list[str] = []
            counted = 0
            for event in generation:
                fragments.append(event.text)
                if self._cancel.is_set():
                    raise KeyboardInterrupt
                with self._lock:
                    self.generated_total += generation.outcome.generated_tokens - counted
                counted = generation.outcome.generated_tokens
            result.text = "".join(fragments)

        try:
            with_retries(attempt, cancelled=self._cancel)
        except LlmchatError as err:
            result.error = str(err)
        with self._lock:
            self.retries += max(0, result.attempts - 1)
        return result

    def run(
        self,
        work: list[QueuedRequest],
        on_done: Callable[[StreamResult], None],
        on_step: Callable[[ConcurrentStreams], None] | None = None,
    ) -> None:
        """Complete every item; `on_done` is called in this thread as each finishes. Ctrl-C stops
        every stream (their connections close) and re-raises here."""
        pending = list(reversed(work))
        running: dict[Future[StreamResult], int] = {}
        with ThreadPoolExecutor(max_workers=self.n, thread_name_prefix="llmchat-stream") as pool:
            try:
                while pending or running:
                    while pending and self._free_workers:
                        worker = self._free_workers.pop()
                        running[pool.submit(self._complete, pending.pop(), worker)] = worker
                    done, _ = wait(list(running), timeout=0.1, return_when=FIRST_COMPLETED)
                    for future in done:
                        self._free_workers.append(running.pop(future))
                        on_done(future.result())
                    if on_step is not None:
                        on_step(self)
            except BaseException:
                # Ctrl-C or SIGTERM: every worker stops at its next chunk, closing its connection.
                self._cancel.set()
                raise
