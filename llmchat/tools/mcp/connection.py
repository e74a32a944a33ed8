"""One running MCP server: its tools, resources and prompts, called like functions.

The SDK is asynchronous; McpConnection keeps one event loop in a background thread (anyio's
blocking portal) so the rest of llmchat calls it like a function. Every request is bounded in time
(the server's `timeout`, or the caller's for a tool call), and every failure is one line: an
McpServerDown (a UsageError) when the server cannot start, a ToolFailure (text for the model) when a tool call
fails, an McpFailure for a resource or prompt request.

The client declares roots (llmchat.tools.mcp.roots: the --root folders and the server's own, if
any) and elicitation (llmchat.tools.mcp.elicitation: asked on the terminal, declined at once without one).
A question is asked on the thread that waits for the call (llmchat.tools.mcp.desk), and the call's
time limit stops while it is open; so is sampling, where the run has a model (llmchat.tools.mcp.sampling).
Ctrl-C during a call cancels that request (the SDK sends `notifications/cancelled`) before the
KeyboardInterrupt goes on to end the turn. Tools with `taskSupport` run as tasks (llmchat.tools.mcp.tasks).

This module owns the connection's lifecycle: its state, opening it (the transport, the handshake,
retries while a URL server starts, the first tool listing) and closing it. Its roles live by
module: how a request runs on the loop (llmchat.tools.mcp.loop), the tools
(llmchat.tools.mcp.server_tools), resources and prompts (llmchat.tools.mcp.resources_prompts),
tool calls run as tasks (llmchat.tools.mcp.tasks).
"""

from __future__ import annotations

import concurrent.futures
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from llmchat.errors import UsageError
from llmchat.tools.mcp import sdk_logs
from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.desk import PersonDesk
from llmchat.tools.mcp.failures import McpServerDown, root
from llmchat.tools.mcp.resources_prompts import ResourcesAndPrompts
from llmchat.tools.mcp.sampling import person_callbacks
from llmchat.tools.mcp.server_tools import ServerTools
from llmchat.tools.process_group import signal_group
from llmchat.tools.spec import DEFAULT_TIMEOUT_S, ToolSpec

INSTALL_HINT = "MCP servers need the mcp package: pip install 'llmchat[mcp]'"
CONNECT_RETRY_PAUSES_S = (0.5, 1.0, 2.0)  # a refused HTTP connection at the start: tried again after each


def require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UsageError(INSTALL_HINT) from None


class McpConnection(ServerTools, ResourcesAndPrompts):
    """One running server. open() starts it (or connects to it) and lists its tools; call() runs
    one; the resource and prompt methods read the rest; close() ends it.

        with McpConnection(server_named(config, "everything")) as server:
            server.list_prompts()
    """

    def __init__(
        self,
        server: McpServerConfig,
        startup_timeout_s: float | None = None,
        *,
        stderr: IO[str] | None = None,
        media_dir: Path | None = None,
        lists_tools: bool = True,
        saved_conversation: bool = True,
    ):
        self.server = server
        # False: opened for its resources and prompts only (llmchat.tools.mcp.sources), its tools not listed.
        self.lists_tools = lists_tools
        self.startup_timeout_s = startup_timeout_s or server.timeout_s or DEFAULT_TIMEOUT_S
        self.request_timeout_s = server.timeout_s or DEFAULT_TIMEOUT_S
        self.stderr = stderr or sys.stderr
        self.media_dir = media_dir
        # False: the conversation is not saved (--no-history), so neither are its images (results.media_folder).
        self.saved_conversation = saved_conversation
        self._stack = ExitStack()
        self._portal: Any = None
        self._client: Any = None
        self._errlog: Any = None
        self._output_schemas: dict[str, dict[str, Any] | None] = {}
        self._active_scope: Any = None
        self._protocol_error = ""
        self._tools_stale = False
        self._watcher: concurrent.futures.Future[None] | None = None  # the tools' listen stream, read
        self.tools: list[ToolSpec] = []
        self.left_out: dict[str, str] = {}  # the server's tools llmchat cannot call, and why
        self._task_tools: set[str] = set()  # the tools called as tasks
        self._http_status: int | None = None  # the last HTTP error status the server answered with
        self._desk = PersonDesk()  # elicitation's questions, asked on the thread that waits for a call
        self._server_pid: int | None = None  # a stdio server's, its process group's id

    def __enter__(self) -> McpConnection:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> list[ToolSpec]:
        require_mcp()
        from anyio.from_thread import start_blocking_portal
        from mcp import Client
        from mcp_types import Implementation

        from llmchat import __version__
        from llmchat.tools.mcp.roots import list_roots_callback
        from llmchat.tools.mcp.transports import client_transport

        self._errlog = self._stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))
        self._portal = self._stack.enter_context(start_blocking_portal())
        self._stack.enter_context(sdk_logs.told_as(self.label, self.stderr, self._portal))
        try:
            roots = list_roots_callback(self.server)  # a config root that is not a folder: exit 2
            for pause in (*CONNECT_RETRY_PAUSES_S, None):
                # read_timeout_seconds bounds the handshake (a server that never answers) and each request.
                client = Client(
                    client_transport(self.server, self._errlog, self._heard_http_error, self._heard_pid),
                    read_timeout_seconds=self.startup_timeout_s,
                    message_handler=self._on_message,
                    client_info=Implementation(name="llmchat", version=__version__),
                    list_roots_callback=roots,
                    **person_callbacks(self.label, self.server, self._desk, self.stderr),
                )
                try:
                    self._client = self._stack.enter_context(self._portal.wrap_async_context_manager(client))
                    break
                except Exception as err:  # a URL server still starting refuses: a few more tries, as --server's
                    if pause is None or not self.server.url or type(root(err)).__name__ != "ConnectError":
                        raise
                    time.sleep(pause)
            listed = self._run(self._bounded, self._list_tools, self.startup_timeout_s) if self.lists_tools else []
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM while it starts: not its failure
            self.close()
            raise
        except UsageError:
            self.close()
            raise
        except BaseException as err:  # a server that cannot start: one line, with its last stderr line
            detail = self._failure(err)
            if "timed out" in detail or detail == "no answer in time":
                detail = f"no answer within {self.startup_timeout_s:g} s"
            self.close()
            failed = "could not be reached" if self.server.url else "did not start"
            raise McpServerDown(f"{self.label} ({self.server.target}) {failed}: {detail}", self.server.name) from None
        self._set_tools(listed)
        if self.lists_tools:
            self._watch_tools()
        return self.tools

    def close(self) -> None:
        self._client = None
        if self._watcher is not None:
            self._watcher.cancel()  # before the stream's own exit, which it would otherwise wait on
            self._watcher = None
        try:
            self._stack.close()  # a stdio server is ended whole there (llmchat.tools.mcp.stdio)
        except BaseException:  # a server that already died may fail its own shutdown; it is gone either way
            if self._server_pid is not None:  # or its end was cut short (a second Ctrl-C): no grace left
                signal_group(self._server_pid, signal.SIGKILL)
