"""An OAuth authorization server and an MCP resource server that requires its tokens, built with the
MCP SDK's own server-side auth pieces, each served by uvicorn in a thread on a free loopback port.

- The authorization server (`create_auth_routes` over `Authority`, an in-memory provider): metadata
  (RFC 8414), dynamic client registration (RFC 7591), `/authorize` (the user consents at once: it
  redirects to the client's loopback redirect URI with a code), `/token` (authorization code with
  PKCE, refresh token; both rotate). `Authority.grants` records each grant it served.
- The resource server (`MCPServer` with `AuthSettings` and a token verifier that asks the
  `Authority`): protected resource metadata (RFC 9728) and Streamable HTTP at `/mcp`, 401 with
  `WWW-Authenticate` without a valid token. Tools: `add` and `whoami`.
"""

from __future__ import annotations

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
from pydantic import AnyHttpUrl
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
def oauth_servers(transport: str = "http") -> Iterator[OAuthServers]:
    """Both servers, until the block ends; the resource server speaks Streamable HTTP at /mcp, or
    (transport="sse") HTTP+SSE at /sse."""
    authority = Authority()
    as_sock, rs_sock = _listening_socket(), _listening_socket()
    issuer = f"http://127.0.0.1:{as_sock.getsockname()[1]}"
    mcp_url = f"http://127.0.0.1:{rs_sock.getsockname()[1]}/{'sse' if transport == 'sse' else 'mcp'}"
    routes = create_auth_routes(
        authority,
        AnyHttpUrl(issuer),
        client_registration_options=ClientRegistrationOptions(
            enabled=True, valid_scopes=[SCOPE], default_scopes=[SCOPE]
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

    app = guarded.sse_app() if transport == "sse" else guarded.streamable_http_app()
    with _serving(Starlette(routes=routes), as_sock), _serving(app, rs_sock):
        yield OAuthServers(authority, issuer, mcp_url)
