"""Batch against servers: concurrent streams, retried when a server is busy or drops one, and moved
to another server when one is gone.

`batch --parallel N` with a local model decodes N sequences in one context (ParallelDecoder). With
a server, the same N items are N concurrent requests, and the server's continuous batching decodes
them together (llama-server with `-np N`, vLLM, Ollama with OLLAMA_NUM_PARALLEL). Each worker thread
owns one llama-server slot (`id_slot` = its number when the server has that many, else any idle
slot), so an item's prompt prefix is reused by the next item that worker takes.

Several servers (`--server` given more than once): each server gets its own workers (a `Share`),
and every worker takes the next item in input order as soon as it is free, so a server with more
free slots, or a faster one, takes more items. The records still come out in input order (the
caller's `InOrder`).

Retries: a 429/503, a refused or dropped connection, or a read timeout is retried with backoff
(`RETRY_DELAYS`), the whole item from the start, before anything is written: the caller writes
an item's record once, after it finished, so a retry can neither tear nor duplicate a record.
A connection failure first asks the server whether it is still there (`ServerClient.alive`): when
nothing answers, the server is gone for the rest of the batch, and the items it held go back to
the queue for the other servers (their partial replies are dropped). When every server is gone,
`run` raises `ServersGone` (exit 6); the records written so far are complete lines, and `--resume`
finishes the rest.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from llmchat.engine.driver import DecodedResult
from llmchat.engine.remote.group import ServersGone, short_reason
from llmchat.engine.remote.served import RemoteOutcome
from llmchat.errors import LlmchatError, ServerError

if TYPE_CHECKING:
    from llmchat.engine.interface import QueuedRequest
    from llmchat.engine.remote.served import RemoteEngine

# Seconds to wait before each retry; after the last, the item fails with the server's message.
RETRY_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)


def with_retries(
    attempt: Callable[[], Any],
    *,
    cancelled: threading.Event | None = None,
    delays=RETRY_DELAYS,
    give_up: Callable[[ServerError], bool] | None = None,
) -> Any:
    """Run `attempt` until it succeeds, retrying retriable ServerErrors after each delay in turn.
    `give_up(err)`: asked before each retry; True ends the retries with `err` (a server gone)."""
    for delay in (*delays, None):
        try:
            return attempt()
        except ServerError as err:
            if not err.retriable or delay is None or (give_up is not None and give_up(err)):
                raise
        if cancelled is not None:
            if cancelled.wait(delay):
                raise KeyboardInterrupt
        else:
            time.sleep(delay)
    raise AssertionError("unreachable")


@dataclass
class StreamResult(DecodedResult):
    """One finished item (its `outcome` a RemoteOutcome), with its retries. `lost`: its server went
    away before it finished; it goes to another server and no record is written for this try."""

    attempts: int = 0
    retried: list[str] = field(default_factory=list)
    lost: bool = False


@dataclass
class Share:
    """One server's part of a batch: its engine, how many streams it takes, and what it did."""

    engine: RemoteEngine
    streams: int
    done: int = 0
    gone: str | None = None  # why it was given up: nothing answered after a connection failed

    @property
    def url(self) -> str:
        return self.engine.spec.shown_url


@dataclass(frozen=True)
class _Worker:
    share: int  # index into ConcurrentStreams.shares
    slot: int  # the llama-server slot it pins, or -1 (the server picks an idle one)


class ConcurrentStreams:
    """Complete items with up to `n` requests in flight per server. Results come back in the calling
    thread. `engine` and `n`: one server; `shares`: several, each with its own stream count."""

    def __init__(
        self,
        engine: RemoteEngine | None = None,
        n: int = 1,
        *,
        shares: Sequence[Share] | None = None,
        say: Callable[[str], None] | None = None,
    ):
        if shares is None:
            assert engine is not None
            shares = [Share(engine, max(1, n))]
        self.shares = list(shares)
        self.n = sum(max(1, share.streams) for share in self.shares)
        self.generated_total = 0  # tokens streamed so far, all items (progress)
        self.retries = 0
        self.moved = 0  # items taken from a server that went away and queued again
        self._say = say
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        # Worker i of a server keeps slot i when the server has enough; otherwise the server picks.
        # The servers' workers are interleaved, so the first items go to every server.
        per_share = []
        for index, share in enumerate(self.shares):
            streams = max(1, share.streams)
            slots = share.engine.caps.slots
            per_share.append([_Worker(index, i if slots >= streams else -1) for i in range(streams)])
        longest = max(len(workers) for workers in per_share)
        self._free_workers = deque(
            w for i in range(longest) for workers in per_share if i < len(workers) for w in [workers[i]]
        )

    @property
    def engine(self) -> RemoteEngine:
        return self.shares[0].engine

    def summary(self) -> str:
        line = f"parallel: {self.n} concurrent streams, {self.retries} requests retried (server busy or connection dropped)"
        if len(self.shares) == 1 and not self.moved:
            return line
        parts = [f"{s.url} {s.done} items" + (f" (gone: {s.gone})" if s.gone else "") for s in self.shares]
        return f"{line}, {self.moved} moved to another server; " + ", ".join(parts)

    def _gone(self, share: Share, err: ServerError) -> bool:
        """After a failed request: is `share`'s server gone? A connection failure (no HTTP status)
        asks it; an answer with a status (busy, an error) means it is still there."""
        if share.gone is not None:
            return True
        if err.status is not None:
            return False
        if share.engine.client.alive():
            return False
        with self._lock:
            if share.gone is None:
                share.gone = short_reason(err, share.url)
                others = any(other.gone is None for other in self.shares)
                if self._say is not None and others:
                    self._say(
                        f"server: {share.url} stopped answering ({share.gone}); its items go to the other servers"
                    )
        return True

    def _complete(self, item: QueuedRequest, worker: _Worker) -> StreamResult:
        share = self.shares[worker.share]
        engine = share.engine
        result = StreamResult(item.key, RemoteOutcome(), t_submit=time.perf_counter())
        streamed = [0]  # this item's tokens in `generated_total`: a retry or a move starts them again

        def uncount() -> None:
            with self._lock:
                self.generated_total -= streamed[0]
            streamed[0] = 0

        def attempt() -> None:
            uncount()
            if self._cancel.is_set():
                raise KeyboardInterrupt
            if share.gone is not None:
                raise ServerError(f"{share.url} is gone ({share.gone})", retriable=True)
            result.attempts += 1
            if item.request.steering is not None:
                item.request.steering.restart()  # a retried item's thinking starts again
            request = replace(item.request, slot=worker.slot)
            # Nobody reads these events but this worker: the stream feeds the thinking budget itself.
            generation = engine.generate(request, feeds_steering=True)
            result.seed = generation.seed
            result.outcome = generation.outcome
            fragments: list[str] = []
            for event in generation:
                fragments.append(event.text)
                if self._cancel.is_set():
                    raise KeyboardInterrupt
                with self._lock:
                    self.generated_total += generation.outcome.generated_tokens - streamed[0]
                streamed[0] = generation.outcome.generated_tokens
            result.text = "".join(fragments)

        try:
            with_retries(attempt, cancelled=self._cancel, give_up=lambda err: self._gone(share, err))
        except ServerError as err:
            result.error = str(err)
            result.lost = share.gone is not None or (err.retriable and err.status is None and self._gone(share, err))
            if result.lost:
                uncount()
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
        every stream (their connections close) and re-raises here. Raises `ServersGone` when every
        server went away with items left."""
        # The queue, in input order: an item taken back from a server that went away goes first.
        order = {item.key: position for position, item in enumerate(work)}
        by_key = {item.key: item for item in work}
        pending = [(position, item.key) for position, item in enumerate(work)]
        running: dict[Future[StreamResult], _Worker] = {}
        with ThreadPoolExecutor(max_workers=self.n, thread_name_prefix="llmchat-stream") as pool:
            try:
                while pending or running:
                    while pending and self._free_workers:
                        worker = self._free_workers.popleft()
                        if self.shares[worker.share].gone is not None:
                            continue  # a gone server's worker retires
                        _, key = heapq.heappop(pending)
                        running[pool.submit(self._complete, by_key[key], worker)] = worker
                    if not running:
                        raise self._all_gone(len(pending))
                    done, _ = wait(list(running), timeout=0.1, return_when=FIRST_COMPLETED)
                    for future in done:
                        worker = running.pop(future)
                        share = self.shares[worker.share]
                        result = future.result()
                        if result.lost:
                            heapq.heappush(pending, (order[result.key], result.key))
                            self.moved += 1
                            continue
                        share.done += 1
                        if share.gone is None:
                            self._free_workers.append(worker)
                        on_done(result)
                    if on_step is not None:
                        on_step(self)
            except BaseException:
                # Ctrl-C or SIGTERM: every worker stops at its next chunk, closing its connection.
                self._cancel.set()
                raise

    def _all_gone(self, left: int) -> ServersGone:
        gone = ", ".join(f"{s.url} ({s.gone})" for s in self.shares)
        several = f"all {len(self.shares)} servers" if len(self.shares) > 1 else "the server"
        return ServersGone(f"{several} stopped answering with {left} items left: {gone}")
