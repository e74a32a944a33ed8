"""Where an HTTP MCP server's OAuth login is kept: one private file per server, written whole.

`DATA_DIR/mcp-auth/NAME.json` (0600 in a 0700 folder) holds the server's URL, the client llmchat
is at its authorization server (the client_id it registered, or the one its table names, and a
client_secret if it has one: a client registered beforehand keeps its secret here, read from its
variable at login, so that later runs can refresh), the tokens, when the access token expires
(the SDK keeps only `expires_in`, which says nothing once the run that heard it is over), the
metadata discovery found (where to refresh), and the scope a run was refused for (`scope_wanted`,
asked for by the next login). A login is bound to the URL it was made for, and to the client_id
the table names: a server renamed, pointed elsewhere or given another client is not sent another's
token.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from llmchat.paths import data_dir
from llmchat.private_files import ensure_private_dir, own_private_dir, write_private_atomic
from llmchat.tools.mcp.config import McpServerConfig

FOLDER = "mcp-auth"


def login_file(name: str) -> Path:
    return data_dir() / FOLDER / f"{name}.json"


def read_login(server: McpServerConfig) -> dict[str, Any] | None:
    """The stored login for this server at its URL; None when there is none (or it is unreadable,
    or for another URL)."""
    try:
        record = json.loads(login_file(server.name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("url") != server.url or not isinstance(record.get("tokens"), dict):
        return None
    if server.client_id and (record.get("client") or {}).get("client_id") != server.client_id:
        return None
    return record


def registered_client(server: McpServerConfig, redirect_uri: str) -> dict[str, Any] | None:
    """The client the server's table names (client_id, its secret from client_secret_env), as the
    SDK's client information; None when llmchat registers itself. The way it authenticates is
    chosen once the authorization server is known (llmchat.tools.mcp.oauth)."""
    if not server.client_id:
        return None
    secret = server.client_secret()
    client: dict[str, Any] = {
        "client_id": server.client_id,
        "redirect_uris": [redirect_uri],
        "token_endpoint_auth_method": "client_secret_basic" if secret else "none",
    }
    if secret:
        client["client_secret"] = secret
    return client


def write_login(name: str, record: dict[str, Any]) -> Path:
    path = login_file(name)
    ensure_private_dir(path.parent.parent)
    own_private_dir(path.parent)
    write_private_atomic(path, (json.dumps(record, indent=2) + "\n").encode("utf-8"))
    return path


def remove_login(name: str) -> bool:
    """Forget the server's login; whether there was one."""
    path = login_file(name)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        return True
    return False


class LoginStorage:
    """The SDK's TokenStorage over one login record. `persist`: each change is written to the file at
    once (a refreshed token survives the run); without it (a login in progress), nothing is written
    until the login completes (write_login), so a login that fails leaves nothing half-made."""

    def __init__(self, server: McpServerConfig, record: dict[str, Any] | None = None, *, persist: bool):
        self.server = server
        self.record: dict[str, Any] = record or {"url": server.url}
        self.persist = persist

    @property
    def expires_at(self) -> float | None:
        value = self.record.get("expires_at")
        return float(value) if isinstance(value, (int, float)) else None

    def metadata(self) -> tuple[Any, Any]:
        """The protected resource's metadata and its authorization server's, as the login found them."""
        from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata

        resource, server = self.record.get("resource_metadata"), self.record.get("authorization_server")
        return (
            ProtectedResourceMetadata.model_validate(resource) if resource else None,
            OAuthMetadata.model_validate(server) if server else None,
        )

    @property
    def wanted_scope(self) -> str | None:
        """The scope a run was refused for (a 403 asking for more), for the next login to ask for."""
        value = self.record.get("scope_wanted")
        return value if isinstance(value, str) and value.strip() else None

    def want_scope(self, scope: str) -> None:
        self.record["scope_wanted"] = scope
        self._save()

    def keep_metadata(self, resource: Any, server: Any) -> None:
        """What discovery found, for the refreshes of later runs (the SDK discovers only on a 401)."""
        for key, value in (("resource_metadata", resource), ("authorization_server", server)):
            if value is not None:
                self.record[key] = value.model_dump(mode="json", exclude_none=True)

    async def get_tokens(self) -> Any:
        from mcp.shared.auth import OAuthToken

        tokens = self.record.get("tokens")
        return OAuthToken.model_validate(tokens) if tokens else None

    async def set_tokens(self, tokens: Any) -> None:
        self.record["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        self.record["expires_at"] = time.time() + float(tokens.expires_in) if tokens.expires_in else None
        self._save()

    async def get_client_info(self) -> Any:
        from mcp.shared.auth import OAuthClientInformationFull

        client = self.record.get("client")
        return OAuthClientInformationFull.model_validate(client) if client else None

    async def set_client_info(self, client_info: Any) -> None:
        self.record["client"] = client_info.model_dump(mode="json", exclude_none=True)
        self._save()

    def _save(self) -> None:
        if self.persist:
            write_login(self.server.name, self.record)
