"""OAuth for MCP servers over HTTP, as the MCP authorization spec has it, through the SDK's
OAuthClientProvider (an httpx2 Auth): discovery of the protected resource's metadata (RFC 9728)
and of its authorization server's (RFC 8414), dynamic client registration (RFC 7591), the
authorization code flow with PKCE, and refresh.

A run (chat, ask, batch, tools list, `llmchat mcp ...`) only ever uses a login that
`llmchat mcp login NAME` stored (llmchat.tools.mcp.oauth_login): its access token is sent, and
refreshed first when it has expired. A run never opens a browser or asks anyone anything: with no
stored login the server's 401 is one line saying to log in, and a stored login the server refuses
(revoked, a refresh that fails) ends in the same line. A server with bearer_token_env, or
an Authorization header of its own, is not given OAuth.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.failures import LoginRefused
from llmchat.tools.mcp.oauth_store import LoginStorage, read_login

CLIENT_NAME = "llmchat"
# What the provider is built with when no redirect can happen (a run): never used for a redirect.
UNUSED_REDIRECT_URI = "http://127.0.0.1/callback"


def run_auth(server: McpServerConfig) -> Any:
    """The httpx2 Auth for a run: the stored login, or None when there is none."""
    if not server.logs_in:
        return None
    record = read_login(server)
    if record is None:
        return None

    async def no_browser(url: str) -> None:
        raise LoginRefused("its stored login was refused")  # the 401's hint says to log in again

    async def no_callback() -> Any:
        raise LoginRefused("its stored login was refused")  # never reached: no_browser raised first

    client = record.get("client") or {}
    redirect_uri = (client.get("redirect_uris") or [UNUSED_REDIRECT_URI])[0]
    return provider(server, LoginStorage(server, record, persist=True), redirect_uri, no_browser, no_callback)


def provider(
    server: McpServerConfig,
    storage: LoginStorage,
    redirect_uri: str,
    redirect: Callable[[str], Awaitable[None]],
    callback: Callable[[], Awaitable[Any]],
) -> Any:
    """The SDK's OAuthClientProvider for this server, registering llmchat as a public native client
    (no client secret; PKCE protects the code) whose redirect is the loopback URI."""
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import OAuthClientMetadata
    from pydantic import AnyUrl

    class StoredLogin(OAuthClientProvider):
        async def _initialize(self) -> None:
            await super()._initialize()
            # The SDK keeps neither when a stored token expires nor where to refresh it (the
            # metadata it discovered): restored, so that an expired token is refreshed at the
            # authorization server's token endpoint before it is sent.
            self.context.token_expiry_time = storage.expires_at
            self.context.protected_resource_metadata, self.context.oauth_metadata = storage.metadata()

    metadata = OAuthClientMetadata(
        client_name=CLIENT_NAME,
        redirect_uris=[AnyUrl(redirect_uri)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    return StoredLogin(server.url, metadata, storage, redirect_handler=redirect, callback_handler=callback)
