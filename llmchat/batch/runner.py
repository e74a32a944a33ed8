"""`llmchat batch`'s run: many independent prompts through one loaded model, one JSONL record each
(llmchat.batch.command reads the input and starts the model).

Input: JSONL or plain text, one item per line (a line starting with `{` is JSON). A JSON item holds
`id?`, `prompt` or `messages`, `system?` and optional sampling (`temperature`, `top_p`, `top_k`,
`min_p`, `repeat_penalty`, `max_tokens`, `seed`, `stop`). Items without an id get their 1-based line
number. A bad line becomes an error record for that item; the run goes on.

Output: one JSON line per item, in input order: the turn record every mode prints
(`TurnResult.to_record`, or `error_record` for an item that got no reply). Each record is written with one write call of the whole line and flushed, so an
interrupted run leaves complete lines only and `--resume` can pick up where it stopped (a trailing
partial line from a crash is truncated away first).

One road, whatever N (`--parallel`) and the engine: every item is its own conversation, passed to
`ChatSession.prepare` (the session is never changed); each prepared turn becomes the request a
serial turn would decode (`ChatSession.request_for`), and each decoded sequence is finished by
`ChatSession.finish`, exactly as a serial turn. Only the scheduler's backend differs with N: one
sequence at a time through `engine.generate` (N = 1: the engine keeps its KV cache from item to
item, so a system prompt shared by consecutive items is prefilled once, and the KV cache on disk
restores it), N sequences in one local context (`engine.parallel.ParallelDecoder`), or N concurrent
streams to a server, retried when it is busy (`engine.remote.streams.ConcurrentStreams`). Every
backend runs the same reply rules and steering per sequence (`engine.driver.SequenceState`).
Records are emitted in input order.

An item with tools (llmchat.batch.tools) is a turn through the tool loop (llmchat.turn.tool_loop),
as `ask` runs it, on the session's own engine, one at a time: with N = 1 in its place in the input;
with N sequences or several servers after the plain items, which decode together first. The
records still go out in input order (InOrder), so `--resume` stays exact.

Every item's reply is bounded: its `max_tokens`, else `--max-tokens`, else the default reply cap
every mode uses (llmchat.turn.policy); a runaway item cannot hold the batch for the whole window.

A batch is not a conversation: nothing is written to the history store.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, cast

from llmchat.batch.items import BatchItem
from llmchat.batch.progress import Progress
from llmchat.batch.sink import InOrder, RecordSink
from llmchat.engine.driver import DecodedResult, SerialDecoder
from llmchat.engine.interface import QueuedRequest, prompt_ids
from llmchat.errors import LlmchatError, ServerError
from llmchat.output import notice
from llmchat.turn.conversation import Conversation
from llmchat.turn.plan import TurnScope
from llmchat.turn.policy import reply_cap
from llmchat.turn.record import error_record

if TYPE_CHECKING:
    from llmchat.batch.tools import BatchTools
    from llmchat.engine.core import Engine
    from llmchat.engine.parallel import ParallelDecoder
    from llmchat.engine.remote.llama_server import LlamaServerEngine
    from llmchat.engine.remote.openai_compat import OpenAICompatEngine
    from llmchat.engine.remote.streams import ConcurrentStreams

    Decoder = SerialDecoder | ParallelDecoder | ConcurrentStreams
    from llmchat.engine.sampling import SamplingParams
    from llmchat.turn.plan import PreparedTurn
    from llmchat.turn.session import ChatSession


PROGRESS_MODES = ("auto", "bar", "lines", "json", "off")
MAX_PARALLEL = 64


# --- the run ----------------------------------------------------------------------------------------
class BatchRunner:
    def __init__(
        self,
        session: ChatSession,
        *,
        parallel: int,
        progress_mode: str,
        sink: RecordSink,
        verbose: bool = False,
        per_server: int | None = None,
        tools: BatchTools | None = None,
        skipped: int = 0,
    ):
        self.session = session
        self.tools = tools  # the items' tools (llmchat.batch.tools); None: no item offers any
        self.verbose = verbose
        self.engine = session.engine
        self.parallel = parallel
        self.per_server = per_server  # --parallel as given, for several servers (None: each one's slots)
        self.progress_mode = progress_mode
        self.sink = sink
        self.base_sampling = session.sampling
        self.system = session.conversation.system
        self.structured = session.structured  # the run's --schema; an item's own schema replaces it
        self.skipped = skipped  # items already in the output (--resume), for the summary
        self._saves_kv = False  # items decode in the engine's own context: the disk cache follows them

    def sampling_for(self, item: BatchItem) -> SamplingParams:
        sampling = replace(self.base_sampling, **item.overrides) if item.overrides else self.base_sampling
        if item.stop is not None:
            sampling = replace(sampling, stop=item.stop)
        return sampling

    def scope_for(self, item: BatchItem) -> TurnScope:
        """The item as a turn of its own conversation, with its sampling, schema and tools: the
        session's own stay as they are. A batch never trims an item's messages."""
        system = item.system if item.has_system else self.system
        return TurnScope(
            conversation=Conversation(system=system, messages=[dict(m) for m in item.history]),
            sampling=self.sampling_for(item),
            overflow="error",
            structured=item.structured,
            tools=self.tools.offer_for(item) if self.tools is not None and self.tools.for_item(item) else None,
        )

    def prepare(self, item: BatchItem) -> PreparedTurn:
        """The item as a turn of its own (`ChatSession.prepare`, as for ask and chat). Raises
        LlmchatError when it cannot fit, or when the engine cannot take the item's own schema."""
        assert item.user is not None
        if item.structured is not None:
            self.engine.check_grammar(item.structured.grammar)
        if any(attachment.media for attachment in item.attachments):
            from llmchat.media.use import give_media

            give_media(self.engine, item.attachments, (), None)  # an engine that cannot take them: this item fails
        return self.session.prepare(item.user, self.scope_for(item))

    def alone(self, item: BatchItem) -> bool:
        """Whether the item is a turn of its own (`_tool_item`): one with tools, or on a local engine
        one with images or audio, which libmtmd evaluates on the engine's own sequence (not in
        ParallelDecoder's shared context)."""
        if self.tools is not None and self.tools.for_item(item) is not None:
            return True
        return not self.engine.caps.remote and any(attachment.media for attachment in item.attachments)

    @property
    def servers(self) -> int:
        engine = self.engine
        return 1 + len(cast("LlamaServerEngine | OpenAICompatEngine", engine).peers) if engine.caps.remote else 1

    def run(self, items: list[BatchItem]) -> int:
        """Answer every item; returns how many failed."""
        servers = self.servers
        label = f" ({servers} servers)" if servers > 1 else f" (parallel {self.parallel})" if self.parallel > 1 else ""
        progress = Progress(len(items), self.progress_mode, label=label)
        writer = InOrder((item.index for item in items), self.sink.write)
        interrupted = False
        progress.start()
        try:
            self._run(items, writer, progress)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C, or SIGTERM raised as SystemExit by cli
            interrupted = True
            raise
        finally:
            progress.close()
            if progress.mode == "json":
                progress.final_json(self.skipped, interrupted=interrupted)
            elif progress.mode != "off" or interrupted:
                notice(progress.summary(self.skipped, interrupted=interrupted))
        return progress.failed

    def _fail(self, item: BatchItem, message: str, writer: InOrder, progress: Progress) -> None:
        session = self.session
        writer.put(
            item.index, error_record(item.id, message, model=session.model_label, template=session.template.name)
        )
        progress.item_done(False)

    def _run(self, items: list[BatchItem], writer: InOrder, progress: Progress) -> None:
        runnable = []
        for item in items:
            if item.error:
                self._fail(item, item.error, writer, progress)
            else:
                runnable.append(item)
        try:
            for phase in self._phases(runnable):
                if isinstance(phase, list):
                    self._decode(phase, writer, progress)
                else:
                    self._tool_item(phase, writer, progress)
        except ServerError as err:  # every server gone (ServersGone), or one failing the finish of an item
            path = self.sink.path
            if path is None:
                then = "the records so far went to stdout; run it with -o OUTPUT, then --resume finishes it"
            else:
                kept = self.skipped + writer.written
                then = f"{kept} records are in {path}: start a server and rerun with --resume -o {path}"
            raise ServerError(f"{err}; {then}") from None

    def _phases(self, items: list[BatchItem]) -> list[list[BatchItem] | BatchItem]:
        """The order of the work: runs of plain items (decoded N at a time) and items with tools
        (each alone, through the tool loop, which needs the session's own engine). One sequence at
        a time, the input order; with N sequences or several servers, every plain item first, so
        they decode together, then the tool items. The records come out in input order either way."""
        if not any(self.alone(item) for item in items):
            return [items] if items else []
        if self.parallel > 1 or self.servers > 1:
            plain = [item for item in items if not self.alone(item)]
            return [*([plain] if plain else []), *(item for item in items if self.alone(item))]
        phases: list[list[BatchItem] | BatchItem] = []
        for item in items:
            if self.alone(item):
                phases.append(item)
            elif phases and isinstance(phases[-1], list):
                phases[-1].append(item)
            else:
                phases.append([item])
        return phases

    def _tool_item(self, item: BatchItem, writer: InOrder, progress: Progress) -> None:
        """An item with tools (or media, on a local engine: `alone`): a turn of its own, through the
        tool loop (llmchat.turn.tool_loop) where it has tools, as `ask` runs it: `ChatSession.turn`
        in the item's scope, which leaves the session as it was."""
        assert item.user is not None
        try:
            scope = self.scope_for(item)
            result = self.session.turn(item.user, record=False, scope=scope, attachments=item.attachments)
        except ServerError:
            raise
        except LlmchatError as err:  # it cannot fit, the engine refused it: this item fails
            self._fail(item, str(err), writer, progress)
            return
        if result.interrupted:  # Ctrl-C ends the reply (as in ask): the batch stops, this item is not written
            raise KeyboardInterrupt
        writer.put(item.index, result.to_record(item.id))
        progress.item_done(result.error is None, result.stats.generated_tokens)

    # --- one road: prepare every item, decode N at a time, finish each as a serial turn ------------
    def _decode(self, items: list[BatchItem], writer: InOrder, progress: Progress) -> None:
        ready: dict[int, tuple[BatchItem, PreparedTurn]] = {}
        for item in items:
            try:
                ready[item.index] = (item, self.prepare(item))
            except LlmchatError as err:
                self._fail(item, str(err), writer, progress)
        if not ready:
            return
        decoder = self._decoder(ready)
        tokens_before = progress.tokens

        def on_step(running: Decoder) -> None:
            progress.set_tokens(tokens_before + running.generated_total)

        work = [QueuedRequest(index, self.session.request_for(p)) for index, (_, p) in ready.items()]
        try:
            decoder.run(work, self._finisher(ready, writer, progress), on_step)
        finally:
            if self.verbose:
                notice(decoder.summary())

    def _decoder(self, ready: dict[int, tuple[BatchItem, PreparedTurn]]) -> Decoder:
        """The scheduler's backend for N = --parallel sequences at once: a server's concurrent
        streams (retried when busy), several sequences in one local context, or one at a time."""
        engine = self.engine
        n = min(self.parallel, len(ready))
        if engine.caps.remote:
            from llmchat.engine.remote.streams import ConcurrentStreams, Share

            remote = cast("LlamaServerEngine | OpenAICompatEngine", engine)
            if not remote.peers:
                streams = ConcurrentStreams(remote, n)
                if self.verbose:
                    notice(f"parallel: {streams.n} concurrent streams to the server")
                return streams
            # Several servers: each takes as many streams as it has slots (or --parallel), and every
            # free stream takes the next item, so the items spread by free slots.
            shares = [Share(server, self.per_server or max(1, server.caps.slots)) for server in (remote, *remote.peers)]
            streams = ConcurrentStreams(shares=shares, say=notice)
            if self.verbose:
                notice(
                    "parallel: "
                    + ", ".join(f"{share.streams} streams to {share.url}" for share in shares)
                    + " (items go to whichever is free)"
                )
            return streams
        if n == 1:
            self._saves_kv = self.session.kv_store is not None
            return SerialDecoder(engine, on_start=lambda item: self._restore(ready[item.key][1]))
        from llmchat.engine.parallel import ParallelDecoder, context_per_sequence

        needed = max(len(p.prompt) + reply_cap(p.sampling) for _, p in ready.values())
        per_seq = context_per_sequence(needed, engine.n_ctx)
        # Not remote and N > 1: the local engine, whose context ParallelDecoder shares.
        decoder = ParallelDecoder(cast("Engine", engine), n, per_seq, n_batch=engine.batch_size)
        if self.verbose:
            notice(
                f"parallel: {decoder.n_seq} sequences x {per_seq} tokens in one context, batches of {decoder.n_batch}"
            )
        return decoder

    def _restore(self, prepared: PreparedTurn) -> None:
        """One item at a time: the KV cache on disk may hold its prefix (a shared system prompt)."""
        store = self.session.kv_store
        if store is not None:
            prepared.restored = store.restore(prompt_ids(prepared.prompt))

    def _finisher(
        self, ready: dict[int, tuple[BatchItem, PreparedTurn]], writer: InOrder, progress: Progress
    ) -> Callable[[DecodedResult], None]:
        """What happens to each decoded sequence: finished by `ChatSession.finish`, as a serial
        turn, then written (in input order)."""

        def on_done(done: DecodedResult) -> None:
            item, prepared = ready.pop(done.key)
            if done.error:
                self._fail(item, done.error, writer, progress)
                return
            result = self.session.finish(prepared, done.outcome, done.text, done.seed, t_submit=done.t_submit)
            if self._saves_kv:
                self.session.sink.save_kv(result)  # the next process restores what this item prefilled
            writer.put(item.index, result.to_record(item.id))
            # A reply that fails its schema (cut off, invalid) is a failed item: its record says why.
            progress.item_done(result.error is None, result.stats.generated_tokens, count_tokens=False)

        return on_done
