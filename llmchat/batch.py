"""`llmchat batch`: many independent prompts through one loaded model, one JSONL record each.

Input: JSONL or plain text, one item per line (a line starting with `{` is JSON). A JSON item holds
`id?`, `prompt` or `messages`, `system?` and optional sampling (`temperature`, `top_p`, `top_k`,
`min_p`, `repeat_penalty`, `max_tokens`, `seed`, `stop`). Items without an id get their 1-based line
number. A bad line becomes an error record for that item; the run goes on.

Output: one JSON line per item, in input order: `id`, `reply`, `finish_reason`, `seed`, `stats`,
`error`. Each record is written with one write call of the whole line and flushed, so an
interrupted run leaves complete lines only and `--resume` can pick up where it stopped (a trailing
partial line from a crash is truncated away first).

Two paths, the same prompts and sampling rules:
- serial (`--parallel 1`): every item is a fresh conversation run through `ChatSession.turn`, the
  one generation path of `ask` and `chat`. The engine keeps its KV cache from item to item, so a
  system prompt shared by consecutive items is prefilled once (llama.cpp prefix reuse).
- parallel (`--parallel N`): `engine.parallel.ParallelDecoder` decodes N items at once in one
  context; the same prompt tokens, sampler chain and stop rules, records emitted in input order.

Every item's reply is bounded: its `max_tokens`, else `--max-tokens`, else the reply reserve
`ask` keeps (min(1024, ctx/4)); a runaway item cannot hold the batch for the whole window.

A batch is not a conversation: nothing is written to the history store.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Callable, Iterable

from llmchat.conversation import Budget, Conversation, default_reply_reserve, fit_to_context
from llmchat.errors import LlmchatError, UsageError
from llmchat.metrics import TurnStats
from llmchat.options import RunOptions
from llmchat.render import is_tty, notice
from llmchat.sampling import SamplingParams, parse_value

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")
INTEGER_KEYS = ("top_k", "max_tokens", "seed")
ROLES = ("system", "user", "assistant")
PROGRESS_MODES = ("auto", "bar", "lines", "json", "off")
MAX_PARALLEL = 64


# --- input ------------------------------------------------------------------------------------------
@dataclass
class BatchItem:
    index: int  # position among the items (0-based), the output order
    line: int  # 1-based line number in the input
    id: Any
    user: str | None = None  # the message to answer
    history: list[dict] = field(default_factory=list)  # earlier user/assistant messages
    system: str | None = None
    has_system: bool = False  # the item chose its system prompt (even "none")
    overrides: dict = field(default_factory=dict)  # validated sampling values
    stop: tuple[str, ...] | None = None
    error: str | None = None  # the line could not be used


def id_key(value: Any) -> str:
    """Ids compare by their JSON text: 7 and "7" are different ids."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def parse_input(data: bytes) -> list[BatchItem]:
    """Every non-blank line becomes an item (possibly an error item). Duplicate ids are errors."""
    items: list[BatchItem] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        item = parse_line(raw, number, len(items))
        key = id_key(item.id)
        if key in first_line:
            previous = first_line[key]
            item = BatchItem(index=len(items), line=number, id=item.id, error=f"duplicate id {item.id!r} (first used on line {previous})")
            # The duplicate's record would make its id ambiguous; answer it under its line number instead.
            if id_key(number) not in first_line:
                item.id = number
        first_line.setdefault(id_key(item.id), number)
        items.append(item)
    return items


def parse_line(raw: bytes, number: int, index: int) -> BatchItem:
    item = BatchItem(index=index, line=number, id=number)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        item.error = f"line {number} is not UTF-8 (bad byte at offset {err.start})"
        return item
    if "\x00" in text:
        item.error = f"line {number} contains NUL bytes"
        return item
    if not text.lstrip().startswith("{"):
        item.user = text
        return item
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        item.error = f"line {number}: bad JSON ({err.msg} at column {err.colno})"
        return item
    if not isinstance(obj, dict):
        item.error = f"line {number}: expected a JSON object"
        return item
    try:
        _fill_from_json(item, obj)
    except (UsageError, ValueError, TypeError) as err:
        item.error = f"line {number}: {err}"
    return item


def _fill_from_json(item: BatchItem, obj: dict) -> None:
    if "id" in obj:
        value = obj["id"]
        if isinstance(value, bool) or not isinstance(value, (str, int)) or (isinstance(value, str) and not value):
            raise ValueError("id must be a non-empty string or an integer")
        item.id = value
    has_prompt, has_messages = "prompt" in obj, "messages" in obj
    if has_prompt == has_messages:
        raise ValueError("give either 'prompt' (a string) or 'messages' (a list of {role, content})")
    if has_prompt:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("'prompt' must be a non-empty string")
        item.user = prompt
    else:
        _fill_messages(item, obj["messages"])
    if "system" in obj:
        if item.has_system:
            raise ValueError("the system prompt is given twice ('system' and a system message); keep one")
        system = obj["system"]
        if system is not None and not isinstance(system, str):
            raise ValueError("'system' must be a string or null")
        item.system, item.has_system = (system or None), True
    for name in SAMPLING_KEYS:
        if name in obj:
            item.overrides[name] = _sampling_value(name, obj[name])
    if "stop" in obj:
        stop = obj["stop"]
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise ValueError("'stop' must be a string or a list of strings")
        item.stop = tuple(s for s in stop if s)


def _fill_messages(item: BatchItem, messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content}")
    for position, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES or not isinstance(message.get("content"), str):
            raise ValueError(f"messages[{position}] must be {{role: system|user|assistant, content: string}}")
        if message["role"] == "system" and position != 0:
            raise ValueError(f"messages[{position}]: a system message may only come first")
    if messages[0]["role"] == "system":
        item.system, item.has_system = (messages[0]["content"] or None), True
        messages = messages[1:]
    if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
        raise ValueError("the last message must be a non-empty user message")
    for position, message in enumerate(messages[:-1]):
        expected = "user" if position % 2 == 0 else "assistant"
        if message["role"] != expected:
            raise ValueError("messages must alternate user and assistant, starting with user")
    item.history = [{"role": m["role"], "content": m["content"]} for m in messages[:-1]]
    item.user = messages[-1]["content"]


def _sampling_value(name: str, value: Any) -> Any:
    if value is None and name in ("max_tokens", "seed"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a whole number" if name in INTEGER_KEYS else "a number"
        raise ValueError(f"{name} must be {kind}, got {json.dumps(value)}")
    if name in INTEGER_KEYS and isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{name} must be a whole number, got {value:g}")
        value = int(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be finite")
    return parse_value(name, repr(value))


# --- output -----------------------------------------------------------------------------------------
def read_done_ids(path: Path) -> tuple[set[str], int]:
    """Ids already answered in `path`; a trailing partial line (a crash mid-write) is cut off.

    Returns (id keys, bytes truncated)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set(), 0
    end = data.rfind(b"\n") + 1  # everything after the last newline is a partial record
    cut = len(data) - end
    if cut:
        with open(path, "r+b") as handle:
            handle.truncate(end)
    done: set[str] = set()
    for raw in data[:end].split(b"\n"):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(record, dict) and "id" in record:
            done.add(id_key(record["id"]))
    return done, cut


class RecordSink:
    """Writes whole lines: one write call per record, then a flush (and fsync when asked)."""

    def __init__(self, path: Path | None, *, append: bool, fsync: bool):
        self.path = path
        self.fsync = fsync and path is not None
        if path is None:
            self._fd = None
            self._stream: IO[bytes] = sys.stdout.buffer
        else:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
            self._fd = os.open(path, flags, 0o644)

    def write(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        if self._fd is None:
            self._stream.write(line)
            self._stream.flush()
            return
        # A full disk or a signal mid-write must not leave half a record: cut back to where this
        # line began, so the file holds complete lines only and --resume can pick up from it.
        start = os.fstat(self._fd).st_size
        try:
            view = memoryview(line)
            while view:  # os.write may write less than asked (rare for regular files)
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync:
                os.fsync(self._fd)
        except BaseException:
            os.ftruncate(self._fd, start)
            raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class InOrder:
    """Emits records in input order while items finish in any order."""

    def __init__(self, indices: Iterable[int], emit: Callable[[dict], None]):
        self._order = list(indices)
        self._next = 0
        self._waiting: dict[int, dict] = {}
        self._emit = emit

    def put(self, index: int, record: dict) -> None:
        self._waiting[index] = record
        while self._next < len(self._order) and self._order[self._next] in self._waiting:
            self._emit(self._waiting.pop(self._order[self._next]))
            self._next += 1

    @property
    def buffered(self) -> int:
        return len(self._waiting)


def error_record(item_id: Any, message: str) -> dict:
    return {"id": item_id, "reply": None, "finish_reason": "error", "seed": None, "stats": None, "error": message}


def reply_record(item_id: Any, reply: str, finish_reason: str, seed: int, stats: TurnStats) -> dict:
    return {"id": item_id, "reply": reply, "finish_reason": finish_reason, "seed": seed, "stats": stats.to_dict(), "error": None}


# --- progress ---------------------------------------------------------------------------------------
class Progress:
    """Items done / total, items/s, aggregate tok/s and ETA on stderr; a summary line at the end.

    On a terminal a rich progress bar; otherwise a plain line every 10 s or every 10% of the items."""

    LINE_EVERY_S = 10.0

    def __init__(self, total: int, mode: str = "auto", stream: IO[str] | None = None, *, label: str = ""):
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if is_tty(self.stream) else "lines"
        self.mode = mode
        self.total = total
        self.label = label
        self.done = self.ok = self.failed = 0
        self.tokens = 0
        self.t_start = time.perf_counter()
        self._last_line_t = self.t_start
        self._last_line_done = 0
        self._bar = None
        self._task = None

    def start(self) -> None:
        self.t_start = self._last_line_t = time.perf_counter()
        if self.mode == "bar" and self.total:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("batch"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rates]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
                refresh_per_second=4,
            )
            self._bar.start()
            self._task = self._bar.add_task("batch", total=self.total, rates="")

    def rates(self) -> tuple[float, float, float]:
        elapsed = max(time.perf_counter() - self.t_start, 1e-9)
        return elapsed, self.done / elapsed, self.tokens / elapsed

    def set_tokens(self, tokens: int) -> None:
        """Live token count (parallel decoding reports it every step)."""
        self.tokens = tokens
        if self._bar is not None:
            _, items_s, tok_s = self.rates()
            self._bar.update(self._task, rates=f"{items_s:.2f} items/s · {tok_s:.0f} tok/s")

    def item_done(self, ok: bool, generated: int = 0, *, count_tokens: bool = True) -> None:
        self.done += 1
        if ok:
            self.ok += 1
        else:
            self.failed += 1
        if count_tokens:
            self.tokens += generated
        elapsed, items_s, tok_s = self.rates()
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, rates=f"{items_s:.2f} items/s · {tok_s:.0f} tok/s")
            return
        now = time.perf_counter()
        due = now - self._last_line_t >= self.LINE_EVERY_S or (self.done - self._last_line_done) >= max(1, self.total / 10)
        if self.done < self.total and due and self.mode in ("lines", "json"):
            self._last_line_t, self._last_line_done = now, self.done
            self._line(elapsed, items_s, tok_s)

    def _state(self, elapsed: float, items_s: float, tok_s: float) -> dict:
        return {
            "done": self.done, "total": self.total, "ok": self.ok, "failed": self.failed,
            "elapsed_s": round(elapsed, 2), "items_s": round(items_s, 3), "tok_s": round(tok_s, 1),
        }

    def final_json(self, skipped: int = 0, interrupted: bool = False) -> None:
        state = self._state(*self.rates()) | {"skipped": skipped, "final": True, "interrupted": interrupted}
        self.stream.write(json.dumps(state) + "\n")
        self.stream.flush()

    def _line(self, elapsed: float, items_s: float, tok_s: float) -> None:
        if self.mode == "json":
            self.stream.write(json.dumps(self._state(elapsed, items_s, tok_s)) + "\n")
        else:
            remaining = (self.total - self.done) / items_s if items_s > 0 else 0.0
            self.stream.write(f"batch: {self.done}/{self.total} items, {items_s:.2f} items/s, {tok_s:.0f} tok/s, ETA {remaining:.0f} s\n")
        self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def summary(self, skipped: int = 0, interrupted: bool = False) -> str:
        elapsed, items_s, tok_s = self.rates()
        head = "interrupted after" if interrupted else "done:"
        text = (
            f"batch: {head} {self.done}/{self.total} items ({self.ok} ok, {self.failed} failed"
            + (f", {skipped} already in the output" if skipped else "")
            + f") in {elapsed:.1f} s, {items_s:.2f} items/s, {tok_s:.0f} tok/s{self.label}"
        )
        return text


# --- the run ----------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """An item ready to generate: its conversation, sampling and (parallel path) prompt tokens."""

    item: BatchItem
    conversation: Conversation
    sampling: SamplingParams
    tokens: list[int] | None = None


class BatchRunner:
    def __init__(
        self,
        session: Any,
        *,
        parallel: int,
        progress_mode: str,
        sink: RecordSink | None,
        base_sampling: SamplingParams,
        system: str | None,
        verbose: bool = False,
    ):
        self.session = session
        self.verbose = verbose
        self.engine = session.engine
        self.parallel = parallel
        self.progress_mode = progress_mode
        self.sink = sink
        self.base_sampling = base_sampling
        self.system = system
        self.skipped = 0  # items already in the output (--resume), for the summary

    # --- shared -----------------------------------------------------------------------------------
    def sampling_for(self, item: BatchItem) -> SamplingParams:
        sampling = replace(self.base_sampling, **item.overrides) if item.overrides else self.base_sampling
        if item.stop is not None:
            sampling = replace(sampling, stop=item.stop)
        if sampling.max_tokens is None:
            sampling = replace(sampling, max_tokens=default_reply_reserve(self.engine.n_ctx, None))
        return sampling

    def conversation_for(self, item: BatchItem) -> Conversation:
        system = item.system if item.has_system else self.system
        return Conversation(system=system, messages=[dict(m) for m in item.history])

    def run(self, items: list[BatchItem]) -> int:
        """Answer every item; returns how many failed."""
        progress = Progress(len(items), self.progress_mode, label=f" (parallel {self.parallel})" if self.parallel > 1 else "")
        writer = InOrder((item.index for item in items), self._emit)
        interrupted = False
        progress.start()
        try:
            if self.parallel > 1:
                self._run_parallel(items, writer, progress)
            else:
                self._run_serial(items, writer, progress)
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

    def _emit(self, record: dict) -> None:
        self.sink.write(record)

    def _fail(self, item: BatchItem, message: str, writer: InOrder, progress: Progress) -> None:
        writer.put(item.index, error_record(item.id, message.replace("\n", " ")))
        progress.item_done(False)

    # --- serial -----------------------------------------------------------------------------------
    def _run_serial(self, items: list[BatchItem], writer: InOrder, progress: Progress) -> None:
        session = self.session
        for item in items:
            if item.error:
                self._fail(item, item.error, writer, progress)
                continue
            session.conversation = self.conversation_for(item)
            session.conversation_id = None
            session.set_sampling(self.sampling_for(item))
            try:
                result = session.turn(item.user, record=False)
            except LlmchatError as err:
                self._fail(item, str(err), writer, progress)
                continue
            except (ValueError, RuntimeError) as err:  # llama.cpp refusing a prompt
                self._fail(item, f"generation failed: {err}", writer, progress)
                continue
            if result.interrupted:
                # Not written: a partial reply is not an answer, and --resume will redo this item.
                raise KeyboardInterrupt
            writer.put(item.index, reply_record(item.id, result.reply, result.finish_reason, result.seed, result.stats))
            progress.item_done(True, result.stats.generated_tokens)

    # --- parallel ---------------------------------------------------------------------------------
    def prepare(self, item: BatchItem) -> Prepared:
        """Render and tokenize an item as `ChatSession.turn` would; raises LlmchatError when it cannot fit."""
        session = self.session
        conversation = self.conversation_for(item)
        sampling = self.sampling_for(item)
        budget = Budget(self.engine.n_ctx, default_reply_reserve(self.engine.n_ctx, sampling.max_tokens))
        session.check_message_size(item.user, budget)  # a huge item fails fast, with the context's words
        fit = fit_to_context(conversation, item.user, budget, session.tokenize_messages, overflow="error")
        return Prepared(item, conversation, sampling, fit.prompt_tokens)

    def _run_parallel(self, items: list[BatchItem], writer: InOrder, progress: Progress) -> None:
        from llmchat.engine.parallel import ParallelDecoder, ParallelItem, context_per_sequence

        ready: list[Prepared] = []
        for item in items:
            if item.error:
                self._fail(item, item.error, writer, progress)
                continue
            try:
                ready.append(self.prepare(item))
            except LlmchatError as err:
                self._fail(item, str(err), writer, progress)
        if not ready:
            return
        needed = max(len(p.tokens) + p.sampling.max_tokens for p in ready)
        per_seq = context_per_sequence(needed, self.engine.n_ctx)
        by_index = {p.item.index: p for p in ready}
        stop_strings = tuple(self.session.template.stop_strings)
        tokens_before = progress.tokens

        def on_done(result) -> None:
            prepared = by_index.pop(result.key)
            item = prepared.item
            if result.error:
                self._fail(item, result.error, writer, progress)
                return
            stats = parallel_stats(result, self.engine.n_ctx)
            writer.put(item.index, reply_record(item.id, result.text, result.finish_reason, result.seed, stats))
            progress.item_done(True, result.generated_tokens, count_tokens=False)

        def on_step(decoder) -> None:
            progress.set_tokens(tokens_before + decoder.generated_total)

        decoder = ParallelDecoder(self.engine, min(self.parallel, len(ready)), per_seq, n_batch=self.engine.settings.batch_size)
        work = (
            ParallelItem(key=p.item.index, prompt=p.tokens, sampling=p.sampling, max_tokens=p.sampling.max_tokens, stop_strings=stop_strings)
            for p in ready
        )
        if self.verbose:
            notice(f"parallel: {decoder.n_seq} sequences x {per_seq} tokens in one context, batches of {decoder.n_batch}")
        decoder.run(work, on_done, on_step)
        if self.verbose:
            notice(
                f"parallel: {decoder.steps} decode steps; prompt tokens: {decoder.prompt_evaluated} evaluated, "
                f"{decoder.prompt_reused} reused from the KV cache (shared prefixes)"
            )


def parallel_stats(result: Any, context_limit: int) -> TurnStats:
    """TurnStats for one sequence of a parallel run, timed from when it took its slot."""
    first = result.t_first_token
    end = result.t_last_token or first or result.t_done
    return TurnStats(
        ttft_s=(result.t_first_shown - result.t_submit) if result.t_first_shown else 0.0,
        prefill_s=(first - result.t_submit) if first else 0.0,
        decode_s=(end - first) if first else 0.0,
        total_s=result.t_done - result.t_submit,
        prompt_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        generated_tokens=result.generated_tokens,
        context_used=result.prompt_tokens + result.generated_tokens,
        context_limit=context_limit,
        finish_reason=result.finish_reason,
    )


# --- entry ------------------------------------------------------------------------------------------
def check_arguments(input_path: str, output: Path | None, *, parallel: int, resume: bool, progress: str, opts: RunOptions) -> None:
    """Usage errors (exit 2), before the model loads."""
    if parallel < 1 or parallel > MAX_PARALLEL:
        raise UsageError(f"--parallel must be between 1 and {MAX_PARALLEL}, got {parallel}")
    if progress not in PROGRESS_MODES:
        raise UsageError(f"--progress must be one of {', '.join(PROGRESS_MODES)}, got {progress!r}")
    if resume and output is None:
        raise UsageError("--resume needs -o OUTPUT: the records already written are read from that file")
    if parallel > 1 and (opts.lookup or opts.draft_model):
        raise UsageError("--parallel does not combine with --lookup or --draft-model; use --parallel 1 for speculative decoding")
    if input_path == "-":
        if sys.stdin.isatty():
            raise UsageError("INPUT is '-' but stdin is a terminal; pipe the items in (cat items.jsonl | llmchat batch -)")
        return
    path = Path(input_path).expanduser()
    if not path.is_file():
        raise UsageError(f"input {input_path} is not a file; pass a JSONL or text file, or - for stdin")
    if output is not None and output.expanduser().exists() and output.expanduser().resolve() == path.resolve():
        raise UsageError("OUTPUT is the same file as INPUT; write the results elsewhere")
    if output is not None and output.expanduser().is_dir():
        raise UsageError(f"output {output} is a folder; pass a file path")


def read_input(input_path: str) -> bytes:
    if input_path == "-":
        return sys.stdin.buffer.read()
    return Path(input_path).expanduser().read_bytes()


def start_session(opts: RunOptions) -> Any:
    """Load the model once and resolve the template; batch items are not saved to the history."""
    from llmchat.loading import start_session as load_session

    return load_session(opts, overflow="error", with_history=False)


def run_batch(input_path: str, output: Path | None, *, parallel: int, resume: bool, progress: str, fsync: bool, opts: RunOptions) -> tuple[int, int]:
    """The whole command; returns (items failed, items run)."""
    check_arguments(input_path, output, parallel=parallel, resume=resume, progress=progress, opts=opts)
    items = parse_input(read_input(input_path))
    output = output.expanduser() if output is not None else None

    skipped = 0
    if resume:
        done, cut = read_done_ids(output)
        if cut:
            notice(f"batch: removed a partial last line ({cut} bytes) from {output}")
        todo = [item for item in items if id_key(item.id) not in done]
        skipped = len(items) - len(todo)
        items = todo
    if not items:
        notice("batch: nothing to do" + (f" (all {skipped} items are already in {output})" if skipped else " (the input has no items)"))
        if output is not None and not resume:
            RecordSink(output, append=False, fsync=False).close()
        return 0, 0

    if output is not None and not output.parent.is_dir():
        raise UsageError(f"the folder of {output} does not exist")
    session = start_session(opts)  # before the output is opened: a model that fails to load clobbers nothing
    sink = None
    try:
        sink = RecordSink(output, append=resume, fsync=fsync)
        runner = BatchRunner(
            session,
            parallel=parallel,
            progress_mode=progress,
            sink=sink,
            base_sampling=session.sampling,
            system=session.conversation.system,
            verbose=opts.verbose,
        )
        runner.skipped = skipped
        failed = runner.run(items)
    finally:
        if sink is not None:
            sink.close()
        session.engine.close()
    return failed, len(items)
