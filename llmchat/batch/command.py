"""`llmchat batch` as a command: its arguments checked before the model loads, the input read
line by line within what the context could hold, `--resume` against the records already written,
MCP prompts and resources given to every item, then one start-up and the run (llmchat.batch.runner
schedules the items). A batch is not a conversation: nothing is written to the history store.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Iterator

from llmchat.batch.items import attach_files, id_key, parse_input
from llmchat.batch.runner import MAX_PARALLEL, PROGRESS_MODES, BatchRunner
from llmchat.batch.sink import RecordSink, read_done_ids
from llmchat.errors import ExitCode, UsageError
from llmchat.options import RunOptions
from llmchat.output import notice

if TYPE_CHECKING:
    from llmchat.config import Config
    from llmchat.edges.bounded_input import Bound
    from llmchat.tools.options import ToolRequest


def check_arguments(
    input_path: str, output: Path | None, *, parallel: int, resume: bool, progress: str, opts: RunOptions
) -> None:
    """Usage errors (exit 2), before the model loads."""
    if parallel < 1 or parallel > MAX_PARALLEL:
        raise UsageError(f"--parallel must be between 1 and {MAX_PARALLEL}, got {parallel}")
    if progress not in PROGRESS_MODES:
        raise UsageError(f"--progress must be one of {', '.join(PROGRESS_MODES)}, got {progress!r}")
    if resume and output is None:
        raise UsageError("--resume needs -o OUTPUT: the records already written are read from that file")
    if parallel > 1 and (opts.lookup or opts.draft_model):
        raise UsageError(
            "--parallel does not combine with --lookup or --draft-model; use --parallel 1 for speculative decoding"
        )
    if input_path == "-":
        if sys.stdin.isatty():
            raise UsageError(
                "INPUT is '-' but stdin is a terminal; pipe the items in (cat items.jsonl | llmchat batch -)"
            )
        return
    path = Path(input_path).expanduser()
    if not path.is_file():
        raise UsageError(f"input {input_path} is not a file; pass a JSONL or text file, or - for stdin")
    if output is not None and output.expanduser().exists() and output.expanduser().resolve() == path.resolve():
        raise UsageError("OUTPUT is the same file as INPUT; write the results elsewhere")
    if output is not None and output.expanduser().is_dir():
        raise UsageError(f"output {output} is a folder; pass a file path")


def input_lines(input_path: str, bound: Bound) -> Iterator[bytes]:
    """The input's lines (stdin's for `-`), each at most `bound`: a longer one (a stream with no
    newline) ends the run before the model loads, exit 4."""
    from llmchat.edges.bounded_input import open_regular, read_line

    if input_path == "-":
        stream: BinaryIO = sys.stdin.buffer
    else:
        where = Path(input_path).expanduser()
        fd, _ = open_regular(where, f"input {input_path}", advice="pass a JSONL or text file, or - for stdin")
        stream = os.fdopen(fd, "rb")
    shown = "stdin" if input_path == "-" else input_path
    try:
        number = 1
        while line := read_line(stream, f"line {number} of {shown}", bound, exit_code=ExitCode.CONTEXT):
            yield line
            number += 1
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def run_batch(
    input_path: str,
    output: Path | None,
    *,
    parallel: int | None,
    resume: bool,
    progress: str,
    fsync: bool,
    opts: RunOptions,
    config: Config,
    tools: ToolRequest | None = None,
    prompt_args: tuple[str, ...] = (),
) -> tuple[int, int]:
    """The whole command; returns (items failed, items run). `parallel`: None when not given (1, or
    over several servers each server's slots). `tools`: the tool options (llmchat.batch.tools).
    `-p mcp:SERVER/NAME` (with `prompt_args`): the MCP prompt's text opens every item's message."""
    per_server, parallel = parallel, 1 if parallel is None else parallel
    check_arguments(input_path, output, parallel=parallel, resume=resume, progress=progress, opts=opts)
    from llmchat.turn.structured import from_options

    structured = from_options(opts, config)  # a bad --schema is a usage error before the model loads
    from llmchat.edges.bounded_input import text_bound
    from llmchat.startup.before_load import context_ahead

    bound = text_bound(context_ahead(opts, config))  # no line or file takes more than the context could hold
    items = parse_input(input_lines(input_path, bound))
    from llmchat.tools.mcp.sources import McpSources, joined

    # files: ["mcp:SERVER/URI"], and -p mcp:SERVER/NAME (nobody to ask for a missing argument).
    with McpSources(config, tools.mcp if tools is not None else ()) as sources:
        opening = sources.opening(opts.saved_prompt, prompt_args, None)
        for item in items:
            if item.user is not None and not item.error:
                item.user = joined(opening, item.user)
        base = Path.cwd() if input_path == "-" else Path(input_path).expanduser().resolve().parent
        attach_files(items, base, resources=sources.resource_bytes, bound=bound)
    output = output.expanduser() if output is not None else None

    skipped = 0
    if resume:
        assert output is not None  # check_arguments: --resume needs -o
        done, cut = read_done_ids(output)
        if cut:
            notice(f"batch: removed a partial last line ({cut} bytes) from {output}")
        todo = [item for item in items if id_key(item.id) not in done]
        skipped = len(items) - len(todo)
        items = todo
    if not items:
        notice(
            "batch: nothing to do"
            + (f" (all {skipped} items are already in {output})" if skipped else " (the input has no items)")
        )
        if output is not None and not resume:
            RecordSink(output, append=False, fsync=False).close()
        return 0, 0

    if output is not None and not output.parent.is_dir():
        raise UsageError(f"the folder of {output} does not exist")
    from llmchat.batch.tools import plan_tools
    from llmchat.startup.loading import start_session

    # Every tool name and choice, and the approval, before the load (MCP servers start here).
    batch_tools = plan_tools(tools, items, structured, config) if tools is not None else None
    sink = None
    try:
        # Before the output is opened: a model that fails to load clobbers nothing. A batch is not a
        # conversation, so nothing goes to the history store.
        session = start_session(
            replace(opts, parallel=parallel, every_server=True),
            config=config,
            overflow="error",
            with_history=False,
            disk_cache=True,
        )
        try:
            session.hold_to(structured)
            if batch_tools is not None:
                batch_tools.make_offers(session)  # a template or server that cannot take tools: nothing written
            sink = RecordSink(output, append=resume, fsync=fsync)
            runner = BatchRunner(
                session,
                parallel=parallel,
                progress_mode=progress,
                sink=sink,
                verbose=opts.verbose,
                per_server=per_server,
                tools=batch_tools,
                skipped=skipped,
            )
            failed = runner.run(items)
        finally:
            if sink is not None:
                sink.close()
            session.engine.close()
    finally:
        if batch_tools is not None:
            batch_tools.close()
    return failed, len(items)
