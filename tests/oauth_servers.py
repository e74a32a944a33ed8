"""An OAuth authorization server and an MCP resource server that requires its tokens, built with the
MCP SDK's own server-side auth pieces, each served by uvicorn in a thread on a free loopback port.

- The authorization server (`create_auth_routes` over `Authority`, an in-memory provider): metadata
  (RFC 8414), dynamic client registration (RFC 7591), `/authorize` (the user consents at once: it
  redirects to the client's loopback redirect URI with a code), `/token` (authorization code with
  PKCE, refresh token; both rotate). `Authority.grants` records each grant it served.
- The resource server (`MCPServer` with `AuthSettings` and a token verifier that asks the
  `Authority`): protected resource metadata (RFC 9728) and Streamable HTTP at `/mcp`, 401 with
  `WWW-Authenticate` without a valid token. Tools: `add` and `whoami`.
- Variants: `step_up_scope` makes `tools/call` need one scope more than the rest (a 403
  `insufficient_scope` naming it, SEP-835's step-up); `preregistered` is a client registered
  beforehand, with a secret, and no dynamic registration.
"""

from __future__ import annotations

import json
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server import MCPServer
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, AnyUrl
from starlette.applications import Starlette

SCOPE = "mcp"
LIFETIME_S = 3600
STOP_WAIT_S = 10  # how long stopping a server waits for its thread


@dataclass
class Authority:
    """The authorization server's state, shared with the resource server's token verifier."""

    clients: dict[str, OAuthClientInformationFull] = field(default_factory=dict)
    codes: dict[str, AuthorizationCode] = field(default_factory=dict)
    access: dict[str, AccessToken] = field(default_factory=dict)
    refresh: dict[str, RefreshToken] = field(default_factory=dict)
    grants: list[str] = field(default_factory=list)

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        assert client_info.client_id is not None
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(32)
        assert client.client_id is not None
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        found = self.codes.get(code)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[code.code]
        self.grants.append("authorization_code")
        return self._issue(code.client_id, code.scopes, code.resource)

    async def load_refresh_token(self, client: OAuthClientInformationFull, token: str) -> RefreshToken | None:
        found = self.refresh.get(token)
        return found if found is not None and found.client_id == client.client_id else None

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        del self.refresh[refresh_token.token]
        self.grants.append("refresh_token")
        return self._issue(refresh_token.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        return self.access.get(token)

    async def revoke_token(self, token: Any) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        expires_at = int(time.time()) + LIFETIME_S
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires_at, resource=resource
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=LIFETIME_S,
            refresh_token=refresh,
            scope=" ".join(scopes),
        )

    def expire_access_tokens(self) -> None:
        """As if their lifetime had passed: the resource server refuses them from now on."""
        for token in self.access.values():
            token.expires_at = int(time.time()) - 60

    def issued_access_tokens(self) -> list[str]:
        return list(self.access)


class LoopbackClient(OAuthClientInformationFull):
    """A client registered beforehand for a native app's loopback redirect, on whatever port the
    app listens on (RFC 8252 7.3: the authorization server allows any port there)."""

    def validate_redirect_uri(self, redirect_uri: AnyUrl | None) -> AnyUrl:
        if redirect_uri is not None and redirect_uri.host == "127.0.0.1" and redirect_uri.path == "/callback":
            return redirect_uri
        return super().validate_redirect_uri(redirect_uri)


def preregistered_client(client_id: str, secret: str, scopes: str = SCOPE) -> LoopbackClient:
    return LoopbackClient(
        client_id=client_id,
        client_secret=secret,
        redirect_uris=[AnyUrl("http://127.0.0.1/callback")],
        token_endpoint_auth_method="client_secret_basic",
        grant_types=["authorization_code", "refresh_token"],
        scope=scopes,
    )


class StepUp:
    """ASGI middleware before the resource server: `tools/call` with a token that lacks `needed`
    gets a 403 whose challenge names only that scope (as a server asking for more does)."""

    def __init__(self, app: Any, authority: Authority, needed: str, metadata_url: str):
        self.app, self.authority, self.needed, self.metadata_url = app, authority, needed, metadata_url

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        headers = {key.decode().lower(): value.decode() for key, value in scope["headers"]}
        token = headers.get("authorization", "").removeprefix("Bearer ")
        access = self.authority.access.get(token)
        try:
            method = json.loads(body).get("method")
        except (ValueError, AttributeError):
            method = None
        if method == "tools/call" and access is not None and self.needed not in access.scopes:
            challenge = (
                f'Bearer error="insufficient_scope", scope="{self.needed}", resource_metadata="{self.metadata_url}"'
            )
            await send(
                {
                    "type": "http.response.start",
                    "status": 403,
                    "headers": [(b"www-authenticate", challenge.encode()), (b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": b'{"error": "insufficient_scope"}'})
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class _Verifier:
    def __init__(self, authority: Authority):
        self.authority = authority

    async def verify_token(self, token: str) -> AccessToken | None:
        return await self.authority.load_access_token(token)


def _listening_socket() -> socket.socket:
    """Bound and listening before the server runs: a client that connects early waits in the backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@contextmanager
def _serving(app: Any, sock: socket.socket) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(STOP_WAIT_S)
        sock.close()


@dataclass
class OAuthServers:
    authority: Authority
    issuer: str
    mcp_url: str


@contextmanager
def oauth_servers(
    transport: str = "http", *, step_up_scope: str | None = None, preregistered: LoopbackClient | None = None
) -> Iterator[OAuthServers]:
    """Both servers, until the block ends; the resource server speaks Streamable HTTP at /mcp, or
    (transport="sse") HTTP+SSE at /sse. step_up_scope: what `tools/call` needs besides SCOPE;
    preregistered: the one client there is (registration is off)."""
    authority = Authority()
    if preregistered is not None:
        assert preregistered.client_id is not None
        authority.clients[preregistered.client_id] = preregistered
    as_sock, rs_sock = _listening_socket(), _listening_socket()
    issuer = f"http://127.0.0.1:{as_sock.getsockname()[1]}"
    origin = f"http://127.0.0.1:{rs_sock.getsockname()[1]}"
    mcp_url = f"{origin}/{'sse' if transport == 'sse' else 'mcp'}"
    scopes = [SCOPE] + ([step_up_scope] if step_up_scope else [])
    routes = create_auth_routes(
        authority,
        AnyHttpUrl(issuer),
        client_registration_options=ClientRegistrationOptions(
            enabled=preregistered is None, valid_scopes=scopes, default_scopes=[SCOPE]
        ),
    )
    guarded = MCPServer(
        "guarded",
        token_verifier=_Verifier(authority),
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(mcp_url),
            required_scopes=[SCOPE],
            validate_token_resource=False,
        ),
    )

    @guarded.tool()
    def add(a: int, b: int) -> str:
        """Add two numbers."""
        return f"{a} + {b} = {a + b}"

    @guarded.tool()
    def whoami() -> str:
        """Who the token belongs to."""
        return "a logged-in llmchat"

    app: Any = guarded.sse_app() if transport == "sse" else guarded.streamable_http_app()
    if step_up_scope:
        app = StepUp(app, authority, step_up_scope, f"{origin}/.well-known/oauth-protected-resource/mcp")
    with _serving(Starlette(routes=routes), as_sock), _serving(app, rs_sock):
        yield OAuthServers(authority, issuer, mcp_url)
