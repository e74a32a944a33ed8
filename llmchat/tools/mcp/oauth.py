"""OAuth for MCP servers over HTTP, as the MCP authorization spec has it, through the SDK's
OAuthClientProvider (an httpx2 Auth): discovery of the protected resource's metadata (RFC 9728)
and of its authorization server's (RFC 8414), dynamic client registration (RFC 7591) unless the
server's table names a client (a client_id registered beforehand, or a client ID metadata document),
the authorization code flow with PKCE, refresh, and step-up (a 403 `insufficient_scope` asks for
more scope: the union of what was granted and what is asked for, SEP-2350).

A run (chat, ask, batch, tools list, `llmchat mcp ...`) only ever uses a login that
`llmchat mcp login NAME` stored (llmchat.tools.mcp.oauth_login): its access token is sent, and
refreshed first when it has expired. A run never opens a browser or asks anyone anything: with no
stored login the server's 401 ends the run's connection at once (needs_login), in one line saying to
log in; a stored login the server refuses (revoked, a refresh that fails) ends in the same line; a
403 asking for more scope ends in one line saying to log in again, and the scope it asked for is
kept with the login, so that the next `llmchat mcp login` asks for it too. A server with
bearer_token_env, or an Authorization header of its own, is not given OAuth.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any
from urllib.parse import parse_qs, urlsplit

from llmchat.tools.mcp.config import McpServerConfig
from llmchat.tools.mcp.failures import LoginRefused
from llmchat.tools.mcp.oauth_store import LoginStorage, read_login

CLIENT_NAME = "llmchat"
# What the provider is built with when no redirect can happen (a run): never used for a redirect.
UNUSED_REDIRECT_URI = "http://127.0.0.1/callback"
# How a client registered beforehand authenticates at the token endpoint, in order of preference:
# the one every authorization server supports for a client with a secret (RFC 6749 2.3.1) first.
SECRET_METHODS = ("client_secret_basic", "client_secret_post")


def run_auth(server: McpServerConfig) -> Any:
    """The httpx2 Auth for a run: the stored login, NeedsLogin when there is none, or None for a
    server that does not log in."""
    if not server.logs_in:
        return None
    record = read_login(server)
    if record is None:
        return needs_login()
    storage = LoginStorage(server, record, persist=True)

    async def no_browser(url: str) -> None:
        # The SDK builds the authorization address only when the stored login will not do: for a
        # step-up, its scope is what was granted and what the 403 asked for. Kept for the next login.
        wanted = " ".join(parse_qs(urlsplit(url).query).get("scope", [""])[0].split())
        granted = set(str((record.get("tokens") or {}).get("scope") or "").split())
        if wanted and not set(wanted.split()) <= granted:
            storage.want_scope(wanted)
            raise LoginRefused(f"it asks for more access than its login grants (scope: {wanted})")
        raise LoginRefused("its stored login was refused")  # the 401's hint says to log in again

    async def no_callback() -> Any:
        raise LoginRefused("its stored login was refused")  # never reached: no_browser raised first

    client = record.get("client") or {}
    redirect_uri = (client.get("redirect_uris") or [UNUSED_REDIRECT_URI])[0]
    return provider(server, storage, redirect_uri, no_browser, no_callback)


def needs_login() -> Any:
    """A run's Auth for a server with no stored login: requests go as they are, and a 401 ends the
    connection at once. (Left to the SDK, a 401 to its `server/discover` probe reads as an older
    server, and it tries the initialize handshake instead, whose refusal would be the reason given.)"""
    import httpx2  # the SDK's HTTP client, loaded only for a server reached by url

    class NeedsLogin(httpx2.Auth):
        def auth_flow(self, request: Any) -> Generator[Any, Any, None]:
            response = yield request
            if response.status_code == 401:
                raise LoginRefused("it asks for a login")

    return NeedsLogin()


def provider(
    server: McpServerConfig,
    storage: LoginStorage,
    redirect_uri: str,
    redirect: Callable[[str], Awaitable[None]],
    callback: Callable[[], Awaitable[Any]],
    *,
    wanted_scope: str | None = None,
) -> Any:
    """The SDK's OAuthClientProvider for this server. llmchat registers as a public native client
    (no client secret; PKCE protects the code) whose redirect is the loopback URI, unless the
    server's table names a client: one registered beforehand (storage holds it from the start) or a
    client ID metadata document (the SDK uses its URL as the client ID where the authorization
    server supports that). wanted_scope: scope a run was refused for, asked for with the server's."""
    from mcp.client.auth import OAuthClientProvider
    from mcp.client.auth.utils import union_scopes
    from mcp.shared.auth import OAuthClientMetadata
    from pydantic import AnyUrl, ConfigDict, field_validator

    class StoredLogin(OAuthClientProvider):
        async def _initialize(self) -> None:
            await super()._initialize()
            # The SDK keeps neither when a stored token expires nor where to refresh it (the
            # metadata it discovered): restored, so that an expired token is refreshed at the
            # authorization server's token endpoint before it is sent.
            self.context.token_expiry_time = storage.expires_at
            self.context.protected_resource_metadata, self.context.oauth_metadata = storage.metadata()

        async def _perform_authorization(self) -> Any:
            # Called once the authorization server is known, before the address is built: a
            # client registered beforehand authenticates the way that server takes.
            client = self.context.client_info
            if client is not None and client.client_secret and server.client_id:
                client.token_endpoint_auth_method = _secret_method(self.context.oauth_metadata)
            return await super()._perform_authorization()

    class WantingMetadata(OAuthClientMetadata):
        """llmchat's client metadata, whose scope always holds what a run was refused for: the
        SDK sets the scope from each challenge (a 401 names only its own), and the registration
        and the authorization both ask for what it holds."""

        model_config = ConfigDict(validate_assignment=True)

        @field_validator("scope")
        @classmethod
        def _with_wanted(cls, scope: str | None) -> str | None:
            return union_scopes(scope, wanted_scope)

    metadata = (WantingMetadata if wanted_scope else OAuthClientMetadata)(
        client_name=CLIENT_NAME,
        redirect_uris=[AnyUrl(redirect_uri)],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
    )
    return StoredLogin(
        server.url,
        metadata,
        storage,
        redirect_handler=redirect,
        callback_handler=callback,
        client_metadata_url=server.client_metadata_url or None,
    )


def _secret_method(metadata: Any) -> Any:
    """How a client with a secret authenticates at this authorization server: the first of
    SECRET_METHODS it lists (basic where it lists none)."""
    supported = getattr(metadata, "token_endpoint_auth_methods_supported", None) or SECRET_METHODS
    return next((method for method in SECRET_METHODS if method in supported), SECRET_METHODS[0])
