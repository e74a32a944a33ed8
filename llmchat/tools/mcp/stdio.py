"""MCP servers over stdio: started in a session of their own, and ended whole, within a second.

The exchange is the SDK's `stdio_client`'s (one JSON-RPC message per line on the server's stdin
and stdout, its stderr into a file), with llmchat's own rules at the ends:
- the server's whole process group ends as soon as the server exits, whether by itself (a crash
  mid-call, the end of its stdin) or because it was stopped: a grandchild that holds the server's
  pipes (a shell's `sleep 1000 &`) no longer keeps a call waiting for an end of file, nor runs on
  after llmchat ended. The SDK (mcp 2.3) ends the group only when the server itself outlives its
  grace, and its graces (2 s after stdin closes, 2 s after SIGTERM) kept a Ctrl-C'd llmchat 4 s
  with a server that ignores both; here STDIN_GRACE_S, then llmchat.tools.process_group's
  SIGTERM, TERM_GRACE_S, SIGKILL;
- a line that is not a JSON-RPC message (not JSON, not UTF-8, longer than MAX_LINE_BYTES) reaches
  the session as the error it is, which the connection says in one line; the SDK also logged a
  traceback for it. Blank lines are skipped.
`on_started(pid)` hears the server's pid (its group's id), so that the connection can still kill
the group if this end was cut short (a second Ctrl-C while the loop thread stops it).
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.process_group import POLL_S, TERM_GRACE_S, group_alive, signal_group

STDIN_GRACE_S = 0.5  # after its stdin closes, for the server to exit by itself (the MCP lifecycle's first step)
REAP_LIMIT_S = 1.0  # for a killed server's exit to be collected
EXIT_POLL_S = 0.1  # how often the server's exit is looked for where the system has no pidfd
MAX_LINE_BYTES = 64 * 1024 * 1024  # one message: a server that never ends a line cannot fill memory
READ_CHUNK = 65536


@asynccontextmanager
async def stdio_server(
    server: McpServerConfig, errlog: TextIO, on_started: Callable[[int], None]
) -> AsyncIterator[tuple[Any, Any]]:
    """The (read, write) streams of a server started from `server.command`, for the SDK's Client."""
    import anyio
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(
        [server.command, *server.args],
        env=get_default_environment() | server.env,
        stderr=errlog,
        start_new_session=True,
    )
    on_started(process.pid)
    exit_fd = _exit_fd(process.pid)
    exited = anyio.Event()  # the server exited and its group was ended
    try:
        received_in, received = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        to_send, sending = anyio.create_memory_object_stream[SessionMessage](0)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(_read_messages, process.stdout, received_in)
            tasks.start_soon(_write_messages, process.stdin, sending)
            tasks.start_soon(_end_with_the_server, process, exit_fd, exited)
            try:
                yield received, to_send
            finally:
                with anyio.CancelScope(shield=True):
                    received.close()  # the reader reads on and drops: a server stuck writing could not exit
                    to_send.close()  # the writer sends what it holds, then closes the server's stdin
                    with anyio.move_on_after(STDIN_GRACE_S):
                        await exited.wait()
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if not exited.is_set():  # else the group is gone, and its id free for another to take
                await _end_group(process.pid)
            await _close_pipes(process)
            with anyio.move_on_after(REAP_LIMIT_S):
                while process.returncode is None:
                    await anyio.sleep(POLL_S)
            if exit_fd is not None:
                os.close(exit_fd)


def _exit_fd(pid: int) -> int | None:
    """A pidfd, readable once the process exits (Linux 5.3+); None elsewhere (polled)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


async def _end_with_the_server(process: Any, exit_fd: int | None, exited: Any) -> None:
    """When the server exits, its group ends with it (what it left behind holds its pipes)."""
    import anyio

    if exit_fd is not None:
        await anyio.wait_readable(exit_fd)
    else:
        while process.returncode is None:
            await anyio.sleep(EXIT_POLL_S)
    await _end_group(process.pid)
    exited.set()


async def _end_group(pgid: int) -> None:
    """llmchat.tools.process_group.end_group, waiting on the loop instead of blocking it."""
    import anyio

    if not signal_group(pgid, signal.SIGTERM):
        return
    with anyio.move_on_after(TERM_GRACE_S):
        while group_alive(pgid):
            await anyio.sleep(POLL_S)
        return
    signal_group(pgid, signal.SIGKILL)


async def _close_pipes(process: Any) -> None:
    import anyio

    for pipe in (process.stdin, process.stdout):
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await pipe.aclose()


async def _read_messages(stdout: Any, received_in: Any) -> None:
    """Each line of the server's stdout, as a message or as the error that it is not one. At the
    end of stdout the session's stream ends (pending requests fail at once)."""
    import anyio

    pending = bytearray()
    skipping = False  # the rest of a line over MAX_LINE_BYTES
    deliver = True  # False once the session is gone: read on, and drop
    async with received_in:
        while True:
            try:
                chunk = await stdout.receive(READ_CHUNK)
            except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                return
            pending += chunk
            lines = pending.split(b"\n")
            pending = bytearray(lines.pop())
            for line in lines:
                if skipping:
                    skipping = False
                elif line.strip() and deliver:
                    deliver = await _deliver(received_in, _message(bytes(line)))
            if len(pending) > MAX_LINE_BYTES and not skipping:
                pending.clear()
                skipping = True
                if deliver:
                    deliver = await _deliver(received_in, ValueError(f"a message over {MAX_LINE_BYTES} bytes"))
            elif skipping:
                pending.clear()


def _message(line: bytes) -> Any:
    """A JSON-RPC message, or the error saying why the line is not one (it is not raised)."""
    import mcp_types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as err:  # pydantic's ValidationError, for invalid JSON and invalid UTF-8 too
        return err


async def _deliver(received_in: Any, message: Any) -> bool:
    import anyio

    try:
        await received_in.send(message)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        return False
    return True


async def _write_messages(stdin: Any, sending: Any) -> None:
    """The session's messages, one line each, on the server's stdin; closed at the end."""
    import anyio

    try:
        async with sending:
            async for message in sending:
                line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await stdin.send(line.encode("utf-8"))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        pass  # the server closed its stdin (it exited, or stopped reading): the session's sends fail from now on
    finally:
        with anyio.CancelScope(shield=True), suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await stdin.aclose()
