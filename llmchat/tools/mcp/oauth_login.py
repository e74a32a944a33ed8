"""`llmchat mcp login NAME`: the OAuth authorization code flow with PKCE, its redirect caught on a
loopback listener (http://127.0.0.1:PORT/callback, a free port, RFC 8252).

llmchat connects to the server; its 401 starts the SDK's flow (discovery, dynamic client
registration, the authorization URL). The URL is printed on stderr, and opened in the browser where
there is one to open (a display, not over SSH, no --no-browser). The browser comes back to the
listener with the code; the SDK checks the state and trades the code for tokens. Only then is the
login written (llmchat.tools.mcp.oauth_store), whole: a login that fails or is stopped leaves the
one before it. Each login registers anew, for the port it listens on (an authorization server
compares redirect URIs exactly), unless the server's table names a client (client_id, or
client_metadata_url). The scope asked for is the server's, and what a run was refused for since
the last login (a step-up, llmchat.tools.mcp.oauth).

Within one login the server may ask for another authorization right away: a 403 asking for more
scope than the first gave, or a 401 naming another authorization server. It gets one while it asks
for something new, up to AUTHORIZATIONS in all; asking again for what was just granted ends the
login (a server that refuses whatever it is given cannot make it loop).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

from llmchat.edges.safe_text import for_stream
from llmchat.errors import LlmchatError, UsageError
from llmchat.output import is_tty
from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.oauth import provider
from llmchat.tools.mcp.oauth_store import LoginStorage, read_login, registered_client, write_login

LOGIN_TIMEOUT_S = 300.0  # for the person in the browser
CALLBACK_PATH = "/callback"
REQUEST_TIMEOUT_S = 30.0  # each request to the servers
AUTHORIZATIONS = 3  # the most one login asks the person for (each one for something new)


class LoginFailed(LlmchatError):
    """The login did not complete: one line, exit 1."""


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the http.server API)
        parsed = urlsplit(self.path)
        if parsed.path != CALLBACK_PATH:
            self._reply(404, "Not found.")
            return
        query = {key: values[0] for key, values in parse_qs(parsed.query).items()}
        listener: LoopbackListener = self.server.listener  # type: ignore[attr-defined]
        if not listener.take(query):
            self._reply(409, "llmchat has its answer already; you can close this tab.")
        elif "error" in query:
            self._reply(400, "llmchat: the login was refused. You can close this tab.")
        else:
            self._reply(200, "llmchat: logged in. You can close this tab.")

    def _reply(self, status: int, text: str) -> None:
        body = text.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass  # the request line holds the code: never written anywhere


class LoopbackListener:
    """The redirect's destination: for each authorization (expect), takes the first answer that
    comes back, then waits for no other."""

    def __init__(self) -> None:
        self.httpd = HTTPServer(("127.0.0.1", 0), _Answer)
        self.httpd.listener = self  # type: ignore[attr-defined]
        self.redirect_uri = f"http://127.0.0.1:{self.httpd.server_address[1]}{CALLBACK_PATH}"
        self._answered = threading.Event()
        self._answer: dict[str, str] = {}
        self._expecting = True
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def expect(self) -> None:
        """Another authorization starts: its answer is still to come."""
        with self._lock:
            self._expecting = True
            self._answer = {}
            self._answered.clear()

    def take(self, query: dict[str, str]) -> bool:
        with self._lock:
            if not self._expecting or self._answered.is_set():
                return False
            self._answer = query
            self._expecting = False
            self._answered.set()
            return True

    def wait(self, timeout_s: float) -> dict[str, str] | None:
        return self._answer if self._answered.wait(timeout_s) else None

    def close(self) -> None:
        """Stop listening, and wake a `wait` still in progress: the thread it runs on (anyio's
        worker, abandoned when a Ctrl-C cancels the login) would otherwise hold the process's exit
        for the rest of the login's timeout."""
        with self._lock:
            self._expecting = False
            self._answered.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def can_open_browser() -> bool:
    """A browser that a person will see: not over SSH, and a desktop to show it on."""
    if os.environ.get("SSH_CONNECTION") or os.environ.get("SSH_TTY"):
        return False
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def login(server: McpServerConfig, stderr: IO[str], *, open_browser: bool, timeout_s: float = LOGIN_TIMEOUT_S) -> Path:
    """Log in to the server; the file the login is kept in."""
    if not server.url:
        raise UsageError(f"MCP server {server.name} is started by a command; only servers reached by url log in")
    if not server.logs_in:
        raise UsageError(
            f"MCP server {server.name} sends a token of its own (bearer_token_env or an Authorization header); "
            "remove it from its [mcp.NAME] table to log in with OAuth"
        )
    import anyio

    from llmchat.tools.mcp import sdk_logs

    sdk_logs.install()  # the SDK logs a failed flow with its traceback; the failure is one line here
    earlier = read_login(server)
    wanted_scope = LoginStorage(server, earlier, persist=False).wanted_scope if earlier else None
    listener = LoopbackListener()
    client = registered_client(server, listener.redirect_uri)
    storage = LoginStorage(server, {"url": server.url, "client": client} if client else None, persist=False)
    asked: list[tuple[str, frozenset[str]]] = []  # each authorization of this login: where, what scope

    async def show(url: str) -> None:
        _one_more_authorization(asked, url)
        listener.expect()
        # The address is built from the authorization server's metadata: shown, never run.
        stderr.write(
            for_stream(f"llmchat: log in to MCP server {server.name} in your browser: {url}\n", is_tty(stderr))
        )
        stderr.flush()
        if open_browser and can_open_browser():
            import webbrowser

            webbrowser.open(url)

    async def answer() -> Any:
        from mcp.shared.auth import AuthorizationCodeResult

        query = await anyio.to_thread.run_sync(listener.wait, timeout_s, abandon_on_cancel=True)
        if query is None:
            raise LoginFailed(f"no answer from the browser within {timeout_s:g} s; run llmchat mcp login again")
        if "error" in query:
            why = query.get("error_description") or query["error"]
            raise LoginFailed(f"the authorization server refused the login: {why}")
        return AuthorizationCodeResult(code=query.get("code", ""), state=query.get("state"), iss=query.get("iss"))

    auth = provider(server, storage, listener.redirect_uri, show, answer, wanted_scope=wanted_scope)
    # The event loop runs on this thread, so a Ctrl-C lands inside it: asyncio.run's shutdown would
    # then log the cancelled flow's traceback. The interruption is one line (llmchat.cli).
    asyncio_log = logging.getLogger("asyncio")
    asyncio_log.disabled = True
    refusals: list[int] = []  # the server's 401s and 403s during the login
    try:
        anyio.run(_connect, server, auth, refusals)
    except (KeyboardInterrupt, SystemExit, LlmchatError):
        raise
    except BaseException as err:
        raise LoginFailed(
            f"MCP server {server.name} ({server.url}): the login failed: {_reason(err, refusals)}"
        ) from None
    finally:
        asyncio_log.disabled = False
        listener.close()
    storage.keep_metadata(auth.context.protected_resource_metadata, auth.context.oauth_metadata)
    if not storage.record.get("tokens"):
        raise UsageError(f"MCP server {server.name} answered without asking for a login; nothing to store")
    return write_login(server.name, storage.record)


def _one_more_authorization(asked: list[tuple[str, frozenset[str]]], url: str) -> None:
    """Let this login ask for one more authorization (the address of it), or end it: another is
    asked for only for more scope, or at another authorization server, than one this login got."""
    parts = urlsplit(url)
    where = f"{parts.scheme}://{parts.netloc}{parts.path}"
    scope = frozenset(" ".join(parse_qs(parts.query).get("scope", [])).split())
    if any(where == before and scope <= granted for before, granted in asked):
        shown = " ".join(sorted(scope)) or "none named"
        raise LoginFailed(
            f"the server refuses the access its authorization server just granted (scope: {shown}); "
            "this account needs more rights there"
        )
    if len(asked) >= AUTHORIZATIONS:
        raise LoginFailed(f"the server asked for more than {AUTHORIZATIONS} authorizations in one login")
    asked.append((where, scope))


async def _connect(server: McpServerConfig, auth: Any, refusals: list[int]) -> None:
    """Open an MCP session through the auth and list the tools: the first request gets the 401 that
    starts the flow (the SDK's clock stops while the person is in the browser). Each 401 and 403
    the server answers with is added to refusals."""
    from contextlib import AsyncExitStack

    import httpx2
    from mcp import Client

    from llmchat.tools.mcp.transports import STREAM_READ_TIMEOUT_S, USER_AGENT

    async def heard(response: Any) -> None:
        if response.status_code in (401, 403):
            refusals.append(response.status_code)

    def http_client(headers: dict[str, str] | None = None, timeout: Any = None, auth: Any = None) -> Any:
        timeout = timeout or httpx2.Timeout(REQUEST_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, event_hooks={"response": [heard]})

    headers = {"User-Agent": USER_AGENT, **server.headers}
    async with AsyncExitStack() as stack:
        if server.transport == "sse":
            from mcp.client.sse import sse_client

            transport = sse_client(
                server.url,
                headers,
                timeout=REQUEST_TIMEOUT_S,
                sse_read_timeout=STREAM_READ_TIMEOUT_S,
                httpx_client_factory=http_client,
                auth=auth,
            )
        else:
            from mcp.client.streamable_http import streamable_http_client

            client_for_http = await stack.enter_async_context(http_client(headers, auth=auth))
            transport = streamable_http_client(server.url, http_client=client_for_http)
        client = Client(transport, read_timeout_seconds=server.timeout_s or REQUEST_TIMEOUT_S)
        await (await stack.enter_async_context(client)).list_tools()


def _reason(err: BaseException, refusals: list[int]) -> str:
    """Why the login failed: llmchat's own reason, else a 403 the server gave (in a login, only
    ever to the token just granted: the SDK's next step, an older server's handshake, would hide
    it), else what the SDK raised."""
    from llmchat.tools.mcp.failures import describe, root

    first = root(err)
    if isinstance(first, LlmchatError):
        return str(first)
    if 403 in refusals:
        return "the server refuses the access its authorization server just granted (HTTP 403)"
    return describe(first)
