"""The transport for one server: stdio (a child process: llmchat.tools.mcp.stdio), or the SDK's
Streamable HTTP or HTTP+SSE.

HTTP connects within CONNECT_TIMEOUT_S (as the remote engines' --connect-timeout default) and
waits at most STREAM_READ_TIMEOUT_S between two chunks of a response stream; each request is also
bounded as a whole by the connection (its timeout). A bearer token is read from its environment
variable here, when the transport is made, and never kept in the config object; so is an OAuth
login (llmchat.tools.mcp.oauth), sent and refreshed by the SDK's auth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TextIO

from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.oauth import run_auth

CONNECT_TIMEOUT_S = 10.0
STREAM_READ_TIMEOUT_S = 300.0
USER_AGENT = "llmchat-mcp"


def client_transport(
    server: McpServerConfig,
    errlog: TextIO,
    on_http_error: Callable[[int], None],
    on_started: Callable[[int], None],
) -> Any:
    """An async context manager that yields the (read, write) streams the SDK's Client drives.
    on_http_error(status) hears each HTTP error status (the SDK's own message does not name it);
    on_started(pid) hears a stdio server's pid (llmchat.tools.mcp.stdio, which starts and ends it)."""
    if server.transport == "stdio":
        from llmchat.tools.mcp.stdio import stdio_server

        return stdio_server(server, errlog, on_started)
    headers = {"User-Agent": USER_AGENT, **server.http_headers()}
    auth = run_auth(server)  # an OAuth login `llmchat mcp login` stored, or None
    if server.transport == "sse":
        from mcp.client.sse import sse_client

        return sse_client(
            server.url,
            headers=headers,
            timeout=CONNECT_TIMEOUT_S,
            sse_read_timeout=STREAM_READ_TIMEOUT_S,
            httpx_client_factory=_hearing_client_factory(on_http_error),
            auth=auth,
        )
    return _streamable_http(server.url, headers, on_http_error, auth)


def _hearing_client_factory(on_http_error: Callable[[int], None]) -> Callable[..., Any]:
    """The SSE transport's HTTP client (as the SDK's own, redirects left to the transport), with
    each error status heard."""
    import httpx2

    async def heard(response: Any) -> None:
        if response.status_code >= 400:
            on_http_error(response.status_code)

    def make(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None) -> Any:
        timeout = timeout or httpx2.Timeout(CONNECT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, event_hooks={"response": [heard]})

    return make


@asynccontextmanager
async def _streamable_http(
    url: str, headers: dict[str, str], on_http_error: Callable[[int], None], auth: Any
) -> AsyncIterator[Any]:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def heard(response: Any) -> None:
        if response.status_code >= 400:
            on_http_error(response.status_code)

    timeout = httpx2.Timeout(CONNECT_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
    hooks = {"response": [heard]}
    async with httpx2.AsyncClient(headers=headers, timeout=timeout, event_hooks=hooks, auth=auth) as http_client:
        async with streamable_http_client(url, http_client=http_client) as streams:
            yield streams
