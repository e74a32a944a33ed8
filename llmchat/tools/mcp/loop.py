"""The event loop an MCP connection talks through, and how one request runs on it.

The SDK is asynchronous; a connection keeps one event loop in a background thread (anyio's
blocking portal) so the rest of llmchat calls it like a function. McpLoop owns how a request runs
there: bounded in time (the question a person is answering stops the clock: llmchat.tools.mcp.desk),
cut short when the server sends something that is not MCP, cancelled on the server when Ctrl-C
comes (the SDK sends `notifications/cancelled`), and its failure told in one line with the
server's last stderr line. The roles built on it: llmchat.tools.mcp.server_tools,
llmchat.tools.mcp.resources_prompts; the connection's lifecycle: llmchat.tools.mcp.connection.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, TypeVar

from llmchat.output import notice
from llmchat.tools.mcp import failures
from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.desk import PersonDesk
from llmchat.tools.mcp.failures import McpFailure, ProtocolBroken, answered, describe, malformed
from llmchat.tools.mcp.results import media_folder

PAGE_LIMIT = 100  # pages of one listing: a server whose cursor never ends cannot hang a listing
CANCEL_GRACE_S = 2.0  # how long Ctrl-C waits for the cancellation to reach the server

_T = TypeVar("_T")


class McpLoop:
    """The requests of one server's connection. Its state is set by McpConnection.__init__ (the
    one owner); declared here for the roles that use it."""

    server: McpServerConfig
    request_timeout_s: float
    stderr: IO[str]
    media_dir: Path | None
    saved_conversation: bool
    _stack: ExitStack
    _portal: Any
    _client: Any
    _errlog: Any
    _active_scope: Any
    _protocol_error: str
    _tools_stale: bool
    _http_status: int | None
    _desk: PersonDesk
    _server_pid: int | None

    @property
    def label(self) -> str:
        return f"MCP server {self.server.name}"

    def notify(self, line: str) -> None:
        notice(line, self.stderr)

    def _capable(self, feature: str) -> bool:
        capabilities = self._client.server_capabilities if self._client is not None else None
        return capabilities is not None and getattr(capabilities, feature, None) is not None

    def _require(self, feature: str, why: str) -> None:
        if self._client is None:
            raise McpFailure(f"{self.label} is not running")
        if not self._capable(feature):
            raise McpFailure(f"{self.label}: {why}")

    def _request(self, what: str, send: Callable[[], Awaitable[_T]]) -> _T:
        if self._client is None:
            raise McpFailure(f"{self.label} is not running")
        try:
            return self._run(self._bounded, send, self.request_timeout_s)
        except TimeoutError:
            raise McpFailure(f"{self.label}: {what}: no answer within {self.request_timeout_s:g} s") from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            raise McpFailure(f"{self.label}: {what} failed: {self._failure(err)}") from None

    def _run(self, function: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """Run a coroutine on the connection's loop and wait for it. Ctrl-C cancels it there (so the
        SDK tells the server), waits a moment for that, and goes on as KeyboardInterrupt."""
        future: concurrent.futures.Future[_T] = self._portal.start_task_soon(function, *args)
        try:
            return self._desk.wait(future)
        except KeyboardInterrupt:
            future.cancel()
            concurrent.futures.wait([future], timeout=CANCEL_GRACE_S)
            raise

    async def _bounded(self, send: Callable[[], Awaitable[_T]], timeout_s: float) -> _T:
        """One request under a time limit; cut short, as ProtocolBroken, when the server sends
        something that is not MCP meanwhile (nothing would ever answer it)."""
        import anyio

        self._http_status = None  # a status heard before this request (the version probe's) is not its reason
        with anyio.CancelScope() as scope:
            self._active_scope = scope
            try:
                with self._desk.deadline(timeout_s):
                    return await send()
            finally:
                self._active_scope = None
        raise ProtocolBroken(self._protocol_error or "the request was cut short")

    async def _on_message(self, message: Any) -> None:
        """Server notifications and transport errors, on the connection's loop."""
        if isinstance(message, Exception):
            self._protocol_error = f"it sent a message that is not MCP ({malformed(message)})"
            if self._active_scope is not None:
                self._active_scope.cancel()
            return
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            self._tools_stale = True  # an older revision's way to say so (ServerTools._watch_tools)

    def _media_dir(self) -> Path:
        if self.media_dir is None:
            self.media_dir = media_folder(self.saved_conversation)
        return self.media_dir

    def _heard_http_error(self, status: int) -> None:
        self._http_status = status

    def _heard_pid(self, pid: int) -> None:
        self._server_pid = pid

    def _failure(self, err: BaseException) -> str:
        message = describe(err)
        if self._http_status is not None:
            hint = self.server.status_hint(self._http_status)
            message = f"{message} (HTTP {self._http_status}{hint})"
            self._http_status = None
        if answered(err):  # the server answered with an error: its stderr adds nothing
            return message
        last = failures.last_line(self._errlog)
        return f"{message}; its stderr ends: {last}" if last else message
