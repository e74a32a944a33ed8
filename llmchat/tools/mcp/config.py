"""Which MCP server to talk to, and how: `[mcp.NAME]` in the config and `--mcp SPEC` on the command line.

    [mcp.time]                      # stdio: llmchat starts the server as a child process
    command = "mcp-server-time"
    args = ["--local-timezone", "UTC"]
    env = { TZ = "UTC" }            # added to the SDK's safe default environment
    approve = "always"              # default "ask"
    elicitation = "defaults"        # its forms: "ask" (default), "defaults" (unattended), "decline"
    timeout = 30                    # seconds for one call (and for the start)
    roots = ["~/notes"]             # the folders declared to it as the client's roots (with --root's)

    [mcp.everything]                # Streamable HTTP: a server that is already running
    url = "http://127.0.0.1:3001/mcp"
    headers = { X-Team = "docs" }
    bearer_token_env = "EVERYTHING_TOKEN"   # `Authorization: Bearer $EVERYTHING_TOKEN`, read when used
    transport = "sse"               # only for older servers (HTTP+SSE); a URL ending in /sse is SSE too

    [mcp.work]                      # OAuth (below) as a client registered beforehand, not registering itself
    url = "https://mcp.example.com/mcp"
    client_id = "llmchat-at-example"
    client_secret_env = "EXAMPLE_SECRET"    # its secret, read from this variable at login
    # client_metadata_url = "https://example.com/llmchat.json"   # or: a client ID metadata document

A url server without a token of its own that asks for one (401) is logged in to with OAuth:
`llmchat mcp login NAME` (llmchat.tools.mcp.oauth).

`roots` (and `--root DIR`) are the only roots a server is told of (llmchat.tools.mcp.roots): with
none, it is told of none, and works where its own command line says.

`--mcp "COMMAND ARGS"` starts a server over stdio (named after its program: `mcp-server-time` ->
`time`); `--mcp URL` connects over Streamable HTTP (named after the host, or `NAME=URL`). A server
given so whose name a config table has is that table's server when it is the same one (the same
program and arguments, or the same URL), with its settings (`approve`, `timeout`, `env`, `tools`);
another server of that name is a usage error (ad_hoc_server): one name, one server.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

from llmchat.errors import ConfigError, UsageError
from llmchat.tools.spec import APPROVE_POLICIES

if TYPE_CHECKING:
    from llmchat.config import Config

Transport = Literal["stdio", "http", "sse"]
TRANSPORTS: tuple[str, ...] = ("stdio", "http", "sse")
_KEYS = (
    "command",
    "args",
    "env",
    "url",
    "headers",
    "bearer_token_env",
    "transport",
    "approve",
    "elicitation",
    "timeout",
    "roots",
    "client_id",
    "client_secret_env",
    "client_metadata_url",
)
_URL_ONLY_KEYS = ("headers", "bearer_token_env", "client_id", "client_secret_env", "client_metadata_url")
ELICITATION_ANSWERS = ("ask", "defaults", "decline")
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_URL = re.compile(r"^https?://", re.IGNORECASE)


@dataclass(frozen=True)
class McpServerConfig:
    """One server: a command to start (stdio) or a URL to reach (http, sse). No secret is held here:
    a bearer token is read from its environment variable when the connection opens, a client
    secret when a login starts."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    bearer_token_env: str = ""
    transport: Transport = "stdio"
    approve: str = "ask"
    elicitation: str = "ask"  # how its forms are answered: asked, with the schema's defaults, or declined
    timeout_s: float | None = None
    source: str = ""
    roots: tuple[str, ...] = ()  # the config's roots = [...], as written (checked as folders when it starts)
    client_id: str = ""  # an OAuth client registered beforehand at the server's authorization server
    client_secret_env: str = ""  # the variable holding that client's secret
    client_metadata_url: str = ""  # an https:// client ID metadata document naming llmchat (SEP-991)

    @property
    def target(self) -> str:
        """How messages name where the server is: its program, or its URL."""
        return self.url or self.command

    def http_headers(self) -> dict[str, str]:
        """The headers of every HTTP request, with the bearer token read from its variable now."""
        headers = dict(self.headers)
        if self.bearer_token_env:
            token = os.environ.get(self.bearer_token_env, "")
            if not token:
                raise UsageError(
                    f"MCP server {self.name}: bearer_token_env = {self.bearer_token_env!r}, but that environment "
                    "variable is not set; export it, or remove bearer_token_env"
                )
            headers["Authorization"] = f"Bearer {token}"
        return headers

    @property
    def logs_in(self) -> bool:
        """Whether it may use an OAuth login (llmchat.tools.mcp.oauth): reached by url, and no token
        of its own (bearer_token_env, an Authorization header)."""
        own_token = self.bearer_token_env or any(key.lower() == "authorization" for key in self.headers)
        return self.transport != "stdio" and not own_token

    def client_secret(self) -> str:
        """The pre-registered client's secret, read from its variable now ("" for none)."""
        if not self.client_secret_env:
            return ""
        secret = os.environ.get(self.client_secret_env, "")
        if not secret:
            raise UsageError(
                f"MCP server {self.name}: client_secret_env = {self.client_secret_env!r}, but that environment "
                "variable is not set; export it, or remove client_secret_env"
            )
        return secret

    def status_hint(self, status: int) -> str:
        """What to do about an HTTP refusal, said after its status: log in (OAuth; again, for more
        access), or check the token."""
        if status == 401 and self.logs_in:
            return f": log in with `llmchat mcp login {self.name}`"
        if status == 403 and self.logs_in:
            return f": for more access, log in again with `llmchat mcp login {self.name}`"
        return ": check its token (bearer_token_env) and headers" if status in (401, 403) else ""


def server_from_config(name: str, settings: Any, config_path: Path | str) -> McpServerConfig:
    where = f"config file {config_path}: mcp.{name}"
    if not _NAME.match(name):
        raise ConfigError(f"{where}: server names are letters, digits, - and _ (they prefix the tool names)")
    if not isinstance(settings, dict):
        raise ConfigError(f'{where} must be a table with command = "..." (and args, env) or url = "http://..."')
    for key in settings:
        if key == "client_secret":
            raise ConfigError(
                f"{where}: the client secret never goes in the config; put it in an environment variable and "
                'name it with client_secret_env = "VARIABLE"'
            )
        if key not in _KEYS:
            raise ConfigError(f"{where}: unknown key {key!r}; use {', '.join(_KEYS)}")
    command, url = settings.get("command"), settings.get("url")
    if command is not None and url is not None:
        raise ConfigError(f"{where}: give command (a server to start) or url (one to reach), not both")
    approve = settings.get("approve", "ask")
    if approve not in APPROVE_POLICIES:
        raise ConfigError(f'{where}: approve must be "ask" or "always"')
    elicitation = settings.get("elicitation", "ask")
    if elicitation not in ELICITATION_ANSWERS:
        raise ConfigError(f'{where}: elicitation must be "ask", "defaults" or "decline"')
    timeout = settings.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ConfigError(f"{where}: timeout must be a number of seconds above 0")
    common: dict[str, Any] = {
        "name": name,
        "approve": approve,
        "elicitation": elicitation,
        "timeout_s": float(timeout) if timeout is not None else None,
        "source": f"config:mcp.{name}",
        "roots": _roots(where, settings.get("roots", [])),
    }
    if url is not None:
        return McpServerConfig(**common, **_remote_settings(where, url, settings))
    for key in _URL_ONLY_KEYS:
        if key in settings:
            raise ConfigError(f'{where}: {key} is for servers reached by url = "http://..."')
    if settings.get("transport", "stdio") != "stdio":
        raise ConfigError(f'{where}: transport = {settings["transport"]!r} needs url = "http://..."')
    if not isinstance(command, str) or not command:
        raise ConfigError(
            f'{where} needs command = "PROGRAM" (its arguments go in args = [...]) or url = "http://.../mcp"'
        )
    args = settings.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ConfigError(f"{where}: args must be a list of strings")
    return McpServerConfig(**common, command=command, args=tuple(args), env=_strings(where, "env", settings))


def _roots(where: str, roots: Any) -> tuple[str, ...]:
    """`roots = ["~/notes", "/srv/data"]`: absolute folders (or under ~), as written."""
    if not isinstance(roots, list) or not all(isinstance(root, str) and root for root in roots):
        raise ConfigError(f'{where}: roots must be a list of folders, e.g. roots = ["~/notes"]')
    for root in roots:
        if not Path(root).expanduser().is_absolute():
            raise ConfigError(f"{where}: roots: {root} is not an absolute folder (start it with / or ~)")
    return tuple(roots)


def _remote_settings(where: str, url: Any, settings: Mapping[str, Any]) -> dict[str, Any]:
    for key in ("args", "env"):
        if key in settings:
            raise ConfigError(f"{where}: {key} is for servers started by command; a url server takes headers")
    if not isinstance(url, str) or not _URL.match(url):
        raise ConfigError(f'{where}: url must be an http:// or https:// address, e.g. "http://127.0.0.1:3001/mcp"')
    for key in ("bearer_token_env", "client_secret_env"):
        name = settings.get(key, "")
        if not isinstance(name, str) or (name and not _VARIABLE.fullmatch(name)):
            raise ConfigError(f'{where}: {key} names an environment variable, e.g. "MY_SECRET"')
    transport = settings.get("transport") or _transport_for(url)
    if transport not in ("http", "sse"):
        raise ConfigError(f'{where}: transport must be "http" (Streamable HTTP) or "sse" for a url server')
    return {
        "url": url,
        "headers": _strings(where, "headers", settings),
        "bearer_token_env": settings.get("bearer_token_env", ""),
        "transport": transport,
        **_client_settings(where, settings),
    }


def _client_settings(where: str, settings: Mapping[str, Any]) -> dict[str, str]:
    """Who llmchat is at the server's authorization server, when not a client it registers itself:
    a client registered beforehand (client_id, and client_secret_env), or a client ID metadata
    document (client_metadata_url). The secret itself never goes in the config."""
    client_id, metadata_url = settings.get("client_id", ""), settings.get("client_metadata_url", "")
    if not isinstance(client_id, str) or (client_id and not client_id.strip()):
        raise ConfigError(f'{where}: client_id must be the client ID the authorization server gave, e.g. "abc123"')
    if settings.get("client_secret_env") and not client_id:
        raise ConfigError(f"{where}: client_secret_env is the secret of a client_id; give the client_id too")
    if not isinstance(metadata_url, str) or (metadata_url and not _is_metadata_url(metadata_url)):
        raise ConfigError(
            f"{where}: client_metadata_url must be an https:// address with a path, the client ID metadata "
            'document naming llmchat, e.g. "https://example.com/llmchat/client.json"'
        )
    if client_id and metadata_url:
        raise ConfigError(f"{where}: give client_id (a registered client) or client_metadata_url, not both")
    headers = settings.get("headers") or {}
    own_token = settings.get("bearer_token_env") or any(str(key).lower() == "authorization" for key in headers)
    if (client_id or metadata_url) and own_token:
        raise ConfigError(
            f"{where}: client_id and client_metadata_url are for an OAuth login, and this server sends a token of "
            "its own (bearer_token_env or an Authorization header); keep one of the two"
        )
    return {
        "client_id": client_id,
        "client_secret_env": settings.get("client_secret_env", ""),
        "client_metadata_url": metadata_url,
    }


def _is_metadata_url(url: str) -> bool:
    """What the SDK accepts as a client ID metadata document's address: https, a host, a path."""
    parts = urlsplit(url)
    return parts.scheme == "https" and bool(parts.hostname) and parts.path not in ("", "/")


def _strings(where: str, key: str, settings: Mapping[str, Any]) -> dict[str, str]:
    table = settings.get(key, {})
    if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
        raise ConfigError(f'{where}: {key} must be a table of strings ({key} = {{ NAME = "value" }})')
    return dict(table)


def _transport_for(url: str) -> Transport:
    """Streamable HTTP, unless the URL is an older server's SSE endpoint."""
    return "sse" if urlsplit(url).path.rstrip("/").endswith("/sse") else "http"


def parse_mcp_spec(spec: str) -> McpServerConfig:
    """`--mcp "COMMAND ARGS"`: split like a POSIX shell would (quotes respected, nothing expanded,
    nothing run through a shell). The server is named after its program: `mcp-server-time` -> `time`.
    `--mcp URL` or `--mcp NAME=URL`: a server reached over HTTP."""
    text = spec.strip()
    named = re.match(r"^([A-Za-z0-9][A-Za-z0-9_-]*)=(https?://\S+)$", text, re.IGNORECASE)
    if named or _URL.match(text):
        url = named.group(2) if named else text
        name = named.group(1) if named else server_name_for_url(url)
        return McpServerConfig(name=name, url=url, transport=_transport_for(url), source=f"--mcp {url}")
    try:
        import shlex  # only for a command line

        words = shlex.split(spec)
    except ValueError as err:
        raise UsageError(f'--mcp {spec!r}: {err}; quote it as one argument, e.g. --mcp "mcp-server-time"') from None
    if not words:
        raise UsageError('--mcp needs a command or a URL, e.g. --mcp "mcp-server-time --local-timezone UTC"')
    return McpServerConfig(
        name=server_name_for(words[0]), command=words[0], args=tuple(words[1:]), source=f"--mcp {words[0]}"
    )


def ad_hoc_server(spec: str, configured: Mapping[str, McpServerConfig]) -> McpServerConfig:
    """`--mcp SPEC` beside the config's servers: the configured one of its name where it is the
    same server, a UsageError where another one has its name, else the server SPEC gives."""
    server = parse_mcp_spec(spec)
    same_name = configured.get(server.name)
    if same_name is None:
        return server
    if _same_server(server, same_name):
        return same_name
    what = f"reaches {same_name.url}" if same_name.url else f"runs {' '.join((same_name.command, *same_name.args))}"
    fix = f"--mcp OTHER={server.url}" if server.url else f"rename the table [mcp.{server.name}]"
    raise UsageError(
        f"--mcp {spec}: the name {server.name} is taken by [mcp.{server.name}] in the config, which {what}; "
        f"use that one with -T mcp:{server.name}, or {fix}"
    )


def _same_server(given: McpServerConfig, configured: McpServerConfig) -> bool:
    """The same URL, or the same program (found on PATH as it would be started) and arguments."""
    if given.url or configured.url:
        return given.url.rstrip("/") == configured.url.rstrip("/")
    return given.args == configured.args and _program(given.command) == _program(configured.command)


def _program(command: str) -> str:
    """The program's path, as PATH finds it; links not followed (two virtual environments'
    `python` links lead to one file, and are two servers)."""
    return os.path.abspath(shutil.which(command) or command)


def server_name_for(program: str) -> str:
    stem = Path(program).name
    stem = re.sub(r"\.(py|js|mjs|exe)$", "", stem)
    stem = re.sub(r"^(mcp[-_]server[-_]|mcp[-_]|server[-_])", "", stem) or stem
    name = re.sub(r"[^A-Za-z0-9_-]", "_", stem).strip("_-")
    return name or "mcp"


def server_name_for_url(url: str) -> str:
    """A URL's server name: the first label of its host (`mcp.example.com` -> `example`), or
    `remote` for an address or localhost (name it with NAME=URL)."""
    host = (urlsplit(url).hostname or "").lower()
    labels = [label for label in host.split(".") if label and label != "mcp"]
    if not labels or host == "localhost" or re.fullmatch(r"[0-9.]+|\[?[0-9a-f:]+\]?", host):
        return "remote"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", labels[0]).strip("_-")
    return name or "remote"


def tool_name(server: str, tool: str) -> str:
    return f"{server}_{tool}"


def configured_servers(config: Config) -> dict[str, McpServerConfig]:
    """Every `[mcp.NAME]` of the config, checked."""
    tables = getattr(config, "mcp", None) or {}
    return {name: server_from_config(name, settings, config.path) for name, settings in tables.items()}


def server_named(config: Config, name: str) -> McpServerConfig:
    """The `[mcp.NAME]` server of the config (an --mcp SPEC is parse_mcp_spec's)."""
    servers = configured_servers(config)
    if name not in servers:
        known = ", ".join(sorted(servers)) or "none in the config"
        raise UsageError(
            f"no MCP server named {name!r} (configured: {known}); add an [mcp.{name}] table to the config, "
            'or give the server with --mcp "COMMAND ARGS" or --mcp URL'
        )
    return servers[name]
